/* Server side of the load_state_shm record (see loadstate.c). */
#ifndef PF_ENGINE_LOADSTATE_H
#define PF_ENGINE_LOADSTATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct pf_loadstate_map {
    int fd; /* -1 when not attached */
    off_t state_off;
};

/* State values. The client creates the record PENDING; it may move PENDING to
 * CANCEL_REQ (compare-and-swap on its mapping) when it gives up. The server writes one
 * final value after the last copy it submitted completed: SUCCESS, ERROR, or CANCELLED
 * (it saw CANCEL_REQ before a chunk and submitted nothing more). After any final value no
 * byte of this load reaches the GPU. */
#define PF_LOADSTATE_PENDING    0
#define PF_LOADSTATE_SUCCESS    1
#define PF_LOADSTATE_ERROR      (-1)
#define PF_LOADSTATE_CANCEL_REQ 2
#define PF_LOADSTATE_CANCELLED  (-2)

/* Marks m unattached (detach and set are then no-ops). */
void pf_loadstate_init(struct pf_loadstate_map *m);
/* Opens and validates. Returns 0 or -errno with a message; m is untouched on error. */
int pf_loadstate_attach(const char *name, struct pf_loadstate_map *m, char *err, size_t errlen);
void pf_loadstate_set(struct pf_loadstate_map *m, int64_t v);
/* True when the client asked to cancel (the record reads CANCEL_REQ); false when not
 * attached or unreadable. One pread: cheap enough to ask before every copy chunk. */
bool pf_loadstate_cancel_requested(const struct pf_loadstate_map *m);
void pf_loadstate_detach(struct pf_loadstate_map *m);

#endif
