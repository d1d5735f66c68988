/* Built when ./configure did not find the CUDA toolkit: the "cuda" GPU backend does not
 * exist in this binary, so "auto" selects the sim backend. */
#include <errno.h>

#include "pf/hal.h"

int pf_cuda_register(void)
{
    return -ENODEV;
}
