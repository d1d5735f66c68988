/* Small arrays: decorators track only the operations a fault fired on. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hal/fault_track.h"

int ftrack_add(struct ftrack_set *s, const struct ftrack *t)
{
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        void *p = realloc(s->t, nc * sizeof(*s->t));
        if (!p)
            return -ENOMEM;
        s->t = p;
        s->cap = nc;
    }
    s->t[s->n++] = *t;
    return 0;
}

bool ftrack_take(struct ftrack_set *s, uint64_t id, struct ftrack *out)
{
    for (size_t i = 0; i < s->n; i++) {
        if (s->t[i].id == id) {
            *out = s->t[i];
            s->t[i] = s->t[--s->n];
            return true;
        }
    }
    return false;
}

int fdone_add(struct ftrack_set *s, uint64_t id, int64_t res, uint64_t release_ns)
{
    return fdone_add_digested(s, id, res, release_ns, false);
}

int fdone_add_digested(struct ftrack_set *s, uint64_t id, int64_t res, uint64_t release_ns,
                       bool digested)
{
    if (s->nd == s->capd) {
        size_t nc = s->capd ? s->capd * 2 : 8;
        void *p = realloc(s->d, nc * sizeof(*s->d));
        if (!p)
            return -ENOMEM;
        s->d = p;
        s->capd = nc;
    }
    s->d[s->nd++] = (struct fdone){id, res, release_ns, digested};
    return 0;
}

bool fdone_pop_ready(struct ftrack_set *s, uint64_t now_ns, struct fdone *out)
{
    for (size_t i = 0; i < s->nd; i++) {
        if (s->d[i].release_ns <= now_ns) {
            *out = s->d[i];
            memmove(&s->d[i], &s->d[i + 1], (s->nd - i - 1) * sizeof(*s->d));
            s->nd--;
            return true;
        }
    }
    return false;
}

uint64_t fdone_next_release(const struct ftrack_set *s)
{
    uint64_t m = UINT64_MAX;
    for (size_t i = 0; i < s->nd; i++)
        if (s->d[i].release_ns < m)
            m = s->d[i].release_ns;
    return m;
}

void ftrack_set_free(struct ftrack_set *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->t[i].iov);
        free(s->t[i].bounce);
    }
    free(s->t);
    free(s->d);
    memset(s, 0, sizeof(*s));
}
