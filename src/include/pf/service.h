/* Engine gRPC service (src/rpc/engine_service.c): the method table of service
 * pegaflow.Engine and the context its handlers need. */
#ifndef PF_SERVICE_H
#define PF_SERVICE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "pf/rpc.h"

struct pf_engine;
struct pf_p2p;
struct pf_tenancy;

struct pf_engine_service {
    struct pf_engine *engine; /* NULL until the engine exists */
    /* P2P serving side (--nics); NULL: the P2P RPCs answer FAILED_PRECONDITION. Set before
     * the RPC server starts. */
    struct pf_p2p *p2p;
    /* Called by the Shutdown RPC (from an RPC thread); must only signal the main thread. */
    void (*request_shutdown)(void *app);
    void *app;
    /* --tenants-file (src/tenant); NULL: no tenant checks. Set before the server starts. */
    struct pf_tenancy *tenancy;
    /* set while the server stops: closing Session streams then does not unregister */
    _Atomic bool stopping;
};

/* Method table of the Engine service (every RPC of proto/engine.proto's Engine). */
extern const struct pf_rpc_method pf_engine_methods[];
extern const size_t pf_engine_nmethods;

#endif
