/* Engine <-> MetaServer client glue (src/app/server_meta.c). */
#ifndef PF_APP_SERVER_META_H
#define PF_APP_SERVER_META_H

#include <stddef.h>

#include "pf/engine.h"
#include "pf/meta_client.h"

/* Creates the client and hooks it into the engine (advertise sealed blocks, withdraw
 * evicted ones, apply reclaimable hints, enumerate residents for resync/refresh). The client
 * is stopped and destroyed by the caller (pf_meta_client_destroy) before the engine. */
int pf_server_meta_start(struct pf_engine *e, const char *target, const char *advertise,
                         size_t queue_depth, struct pf_meta_client **mc_p);

#endif
