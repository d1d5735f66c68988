/* Placeholder until sim/net/tcpnet.c exists (see sim/net/module.mk). */
#include <errno.h>

#include "pf/hal.h"

int pf_tcpnet_register(void)
{
    return -ENODEV;
}
