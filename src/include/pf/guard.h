/* Fault-contained access to memory a client owns.
 *
 * The server maps shared-memory objects that a client created (sim GPU KV regions). The
 * client can shrink such an object (ftruncate) at any time; touching a page past the new
 * end raises SIGBUS, which would kill the server. pf_guard_copy performs a memcpy whose
 * SIGBUS/SIGSEGV is caught on the calling thread and turned into -EFAULT, so only the
 * request that used the memory fails.
 *
 * Contract:
 *  - pf_guard_init installs the process-wide handler once (idempotent, thread-safe). A
 *    fault outside a guarded copy is passed to the handler that was installed before (or
 *    the default action), so real bugs still crash with their usual report.
 *  - pf_guard_copy may be called from any thread after init; it is not reentrant within a
 *    thread (a guarded copy never calls another guarded copy).
 *  - On -EFAULT, dst holds an unspecified prefix of src; the caller must treat it as
 *    garbage (never seal or serve it).
 *  - The copied bytes themselves are not validated: a client that rewrites its memory
 *    during the copy gets what it wrote (the integrity checksum is computed from dst). */
#ifndef PF_GUARD_H
#define PF_GUARD_H

#include <stddef.h>

/* 0 or -errno (sigaction failed). */
int pf_guard_init(void);

/* memcpy(dst, src, len) with faults on either side contained. 0, or -EFAULT when a page
 * of src or dst could not be accessed (SIGBUS/SIGSEGV). */
int pf_guard_copy(void *dst, const void *src, size_t len);

/* fn(arg) with faults contained as in pf_guard_copy: 0, or -EFAULT when fn touched an
 * inaccessible page (fn is abandoned at the fault; what it wrote so far is garbage). fn
 * must not take locks, allocate or call another guarded function (it may be left midway).
 * Used for the sim copy engine's bulk and fused copy+hash loops. */
int pf_guard_call(void (*fn)(void *arg), void *arg);

#endif
