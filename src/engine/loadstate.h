/* Server side of the load_state_shm record (see loadstate.c). */
#ifndef PF_ENGINE_LOADSTATE_H
#define PF_ENGINE_LOADSTATE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct pf_loadstate_map {
    int fd; /* -1 when not attached */
    off_t state_off;
};

/* Marks m unattached (detach and set are then no-ops). */
void pf_loadstate_init(struct pf_loadstate_map *m);
/* Opens and validates. Returns 0 or -errno with a message; m is untouched on error. */
int pf_loadstate_attach(const char *name, struct pf_loadstate_map *m, char *err, size_t errlen);
void pf_loadstate_set(struct pf_loadstate_map *m, int64_t v);
void pf_loadstate_detach(struct pf_loadstate_map *m);

#endif
