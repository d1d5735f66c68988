/* Server side of the load_state_shm record (see loadstate.c). */
#ifndef PF_ENGINE_LOADSTATE_H
#define PF_ENGINE_LOADSTATE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct pf_loadstate_map {
    void *base;
    size_t len;
    _Atomic int64_t *state;
};

/* Attaches and validates. Returns 0 or -errno with a message. */
int pf_loadstate_attach(const char *name, struct pf_loadstate_map *m, char *err, size_t errlen);
void pf_loadstate_set(struct pf_loadstate_map *m, int64_t v);
void pf_loadstate_detach(struct pf_loadstate_map *m);

#endif
