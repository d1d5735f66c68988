/* A borrowed byte run (a request's hash, a lease id): data is valid for len bytes while the
 * call that receives it runs; the receiver neither frees nor keeps it. */
#ifndef PF_BYTES_H
#define PF_BYTES_H

#include <stddef.h>
#include <stdint.h>

struct pf_bytes {
    const uint8_t *data;
    size_t len;
};

#endif
