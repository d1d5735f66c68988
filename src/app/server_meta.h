/* Engine <-> MetaServer client glue (src/app/server_meta.c). */
#ifndef PF_APP_SERVER_META_H
#define PF_APP_SERVER_META_H

#include <stddef.h>

#include "pf/engine.h"
#include "pf/meta_client.h"

/* Registers the engine hooks (advertise sealed blocks, withdraw evicted ones); call before
 * the engine serves traffic. They do nothing until pf_server_meta_start. */
int pf_server_meta_hooks(struct pf_engine *e);
/* Creates the client (reclaimable hints, resident enumeration for resync/refresh) and
 * attaches it to the hooks; may run while traffic is served. The client is detached
 * (pf_server_meta_detach) and destroyed by the caller (pf_meta_client_destroy) before the
 * engine. */
int pf_server_meta_start(struct pf_engine *e, const char *target, const char *advertise,
                         size_t queue_depth, struct pf_meta_client **mc_p);
void pf_server_meta_detach(void);
/* Registers the SSD tier's blocks with the MetaServer too: every resync enumerates them
 * after the RAM-resident ones, and the end of the SSD recovery scan asks for a resync (the
 * client's chunked, heartbeating re-registration; before the client exists its first
 * session's resync covers them). Call before pf_server_meta_start. */
struct pf_ssd;
void pf_server_meta_set_ssd(struct pf_ssd *ssd);

#endif
