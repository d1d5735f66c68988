/* Private to the Redis store (store_redis.c: requests; store_redis_scan.c: unregister,
 * sweep, statistics, lifecycle). See store_redis.c for the data model. */
#ifndef PF_META_STORE_REDIS_H
#define PF_META_STORE_REDIS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "meta/meta_internal.h"
#include "pf/meta.h"
#include "pf/metrics.h"

#define K_NODES      "pf:nodes"
#define K_SWEEP      "pf:sweep"
#define BLOCK_PREFIX "pf:b:"
#define NSLOTS       16384
#define SCAN_COUNT   "1000"
#define TIMEOUT_MS   1000u
#define PF_ID_LEN    16 /* stored node_id bytes */

enum { S_HB, S_SESS, S_UNREG, S_INS, S_REM, S_NODE_DROP, NSCRIPTS };

extern const char *const rs_scripts[NSCRIPTS];

struct rstore {
    struct pf_meta_store_config cfg;
    struct pf_redis *r;
    uint16_t nodes_slot;
    _Atomic uint64_t red[4];
    _Atomic uint64_t red_copies;
    struct pf_metric *g_entries, *g_owners, *g_bytes, *g_nodes, *g_red, *g_red_avg;
    struct pf_metric *c_sw_owners, *c_sw_keys, *c_sw_nodes, *c_sweeps;
    pthread_mutex_t cache_mu; /* stats cached for the metric collectors */
    struct pf_meta_store_stats cache;
    uint64_t cache_ns;
};

/* Storage for one batch: per command up to RS_MAXARGS arguments and the block key bytes. */
#define RS_MAXARGS 10 /* EVALSHA sha numkeys key counter + up to 5 script arguments */
struct batch {
    struct pf_redis_cmd *cmd;
    const char **argv;
    size_t *lens;
    char *keys;       /* block keys, back to back */
    size_t *koff;     /* offset of key i in keys */
    char (*ctag)[24]; /* counter key of command i */
    size_t n;
};

struct nrec {
    const char *addr;
    size_t alen;
    const char *id; /* PF_ID_LEN bytes, not terminated */
    uint64_t seen_ms;
    bool present;
};

uint64_t rs_now_ms(const struct rstore *s);
/* The node_id as stored: its 16 raw bytes (Lua strings are binary-safe). */
void rs_id(const uint8_t id[16], char out[PF_ID_LEN]);
/* "<node_id 16 bytes>:<number>" -> number; false when malformed. */
bool rs_parse_val(const char *v, size_t len, uint64_t *num_p);
int rs_batch_alloc(struct batch *b, size_t n, size_t keybytes);
/* Frees the storage and the replies. */
void rs_batch_free(struct batch *b);
void rs_set_arg(struct batch *b, size_t i, int a, const char *s, size_t len);
/* Command i = EVALSHA script on key i (+ its slot's counter key when with_counter) + args. */
void rs_script_cmd(struct rstore *s, struct batch *b, size_t i, int script, bool with_counter,
                   const char *const *args, const size_t *alens, int nargs);
/* A script on pf:nodes; its integer answer in *v_p. */
int rs_node_script(struct rstore *s, int script, const char *const *args, const size_t *alens,
                   int nargs, long long *v_p);
/* Makes sure the script hashes are known (a connection loaded them). */
int rs_ensure_scripts(struct rstore *s);
/* Node records of recs[i].addr (HMGET pf:nodes); *rep_p owns the text (freeReplyObject). */
int rs_fetch_nodes(struct rstore *s, struct nrec *recs, size_t n, void **rep_p);
/* now - last_seen <= stale */
bool rs_rec_fresh(const struct rstore *s, const struct nrec *r, uint64_t now);

int rs_heartbeat(void *impl, const char *node, const uint8_t node_id[16], bool replace);
int rs_insert(void *impl, const char *ns, const struct pf_meta_hash *h, size_t n, const char *node,
              const uint8_t node_id[16], bool *reclaimable);
int rs_remove(void *impl, const char *ns, const struct pf_meta_hash *h, size_t n, const char *node,
              const uint8_t node_id[16], uint64_t *removed_p);
int rs_query(void *impl, const char *ns, const struct pf_meta_hash *h, size_t n,
             struct pf_meta_prefix **res_p, size_t *nres_p);

#endif
