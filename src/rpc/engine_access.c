/* Access classes of the Engine service's methods (pf/auth.h, docs/security.md): what only a
 * vLLM worker on this host calls is LOCAL, Health is OPEN, the P2P methods other nodes call
 * are PEER (the default for a method not listed). */
#include "pf/auth.h"

const struct pf_rpc_access_rule pf_engine_access[] = {
    {"/pegaflow.Engine/Health", PF_RPC_ACCESS_OPEN},
    {"/pegaflow.Engine/Shutdown", PF_RPC_ACCESS_LOCAL},
    {"/pegaflow.Engine/RegisterContextBatch", PF_RPC_ACCESS_LOCAL},
    {"/pegaflow.Engine/Save", PF_RPC_ACCESS_LOCAL},
    {"/pegaflow.Engine/Load", PF_RPC_ACCESS_LOCAL},
    {"/pegaflow.Engine/QueryPrefetch", PF_RPC_ACCESS_LOCAL},
    {"/pegaflow.Engine/Release", PF_RPC_ACCESS_LOCAL},
    {"/pegaflow.Engine/UnregisterContext", PF_RPC_ACCESS_LOCAL},
    {"/pegaflow.Engine/Session", PF_RPC_ACCESS_LOCAL},
    {"/pegaflow.Engine/QueryBlocksForTransfer", PF_RPC_ACCESS_PEER},
    {"/pegaflow.Engine/ReleaseTransferLock", PF_RPC_ACCESS_PEER},
    {"/pegaflow.Engine/RdmaHandshake", PF_RPC_ACCESS_PEER},
};
const size_t pf_engine_naccess = sizeof(pf_engine_access) / sizeof(pf_engine_access[0]);
