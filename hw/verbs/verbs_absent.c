/* Built when ./configure did not find libibverbs: no "verbs" NET backend in this binary. */
#include <errno.h>

#include "pf/hal.h"

int pf_verbs_register(void)
{
    return -ENODEV;
}
