/* Test and bench helper: what the MetaServer says of a run of block hashes
 * (QueryPrefixBlocks), as the integration tests and bench/p2p poll it until a node's
 * advertisement has arrived. */
#ifndef PFMETA_H
#define PFMETA_H

#include <stddef.h>
#include <stdint.h>

struct pf_rpc_channel;

/* Asks the MetaServer on ch for the prefix of `n` hashes (`hash_len` bytes each, back to back
 * in `hashes`) in namespace ns. Returns node_addr's prefix length (0 when the MetaServer does
 * not list it) or -1 when the call failed (within timeout_ms); with others_max, raises
 * *others_max to the longest prefix any other node has. */
long pft_meta_prefix(struct pf_rpc_channel *ch, const char *ns, const uint8_t *hashes,
                     size_t hash_len, size_t n, const char *node_addr, long *others_max,
                     uint64_t timeout_ms);

#endif
