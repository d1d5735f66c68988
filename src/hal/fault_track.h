/* Shared bookkeeping of the NET and BLK fault decorators: operations whose completion must
 * be altered (corrupted, delayed) and completions the decorator synthesises itself. */
#ifndef PF_HAL_FAULT_TRACK_H
#define PF_HAL_FAULT_TRACK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct ftrack {
    uint64_t id;         /* wr_id / tag */
    bool corrupt;        /* corrupt the local buffers when the op succeeds */
    uint64_t release_ns; /* hold the completion until then (0 = no delay) */
    struct iovec *iov;   /* local buffers (for corruption) */
    size_t niov;
    void *bounce; /* decorator-owned buffer to free at completion */
    /* NET: the READ's digest request (n == 0: none), recomputed over the corrupted bytes */
    uint32_t ndig;
    const uint32_t *dig_lens;
    uint64_t *dig_out;
};

struct fdone {
    uint64_t id;
    int64_t res; /* bytes or -errno */
    uint64_t release_ns;
    bool digested; /* NET: the held completion's digested flag */
};

struct ftrack_set {
    struct ftrack *t;
    size_t n, cap;
    struct fdone *d; /* synthesised or held completions */
    size_t nd, capd;
};

int ftrack_add(struct ftrack_set *s, const struct ftrack *t);
/* Removes and returns the tracking entry of id (false when untracked). */
bool ftrack_take(struct ftrack_set *s, uint64_t id, struct ftrack *out);
int fdone_add(struct ftrack_set *s, uint64_t id, int64_t res, uint64_t release_ns);
/* fdone_add of a NET completion that keeps its digested flag. */
int fdone_add_digested(struct ftrack_set *s, uint64_t id, int64_t res, uint64_t release_ns,
                       bool digested);
/* Pops a completion whose release time has passed. */
bool fdone_pop_ready(struct ftrack_set *s, uint64_t now_ns, struct fdone *out);
/* Earliest release time among held completions (UINT64_MAX when none). */
uint64_t fdone_next_release(const struct ftrack_set *s);
void ftrack_set_free(struct ftrack_set *s);

#endif
