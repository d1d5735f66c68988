/* Placeholder until hw/uring/uring.c exists (see hw/uring/module.mk). */
#include <errno.h>

#include "pf/hal.h"

int pf_uring_register(void)
{
    return -ENODEV;
}
