/* MetaServer store on Redis / Redis Cluster (--store redis://...). Same semantics as the
 * memory store (pf/meta.h); the MetaServer process keeps no state, so any number of
 * replicas can serve from one Redis.
 *
 * Data model (all times from the store clock: wall clock unless a test injects one):
 *   pf:nodes                   hash  node address -> "<node_id, 16 bytes>:<last_seen ms>"
 *   pf:b:<namespace>\0<hash>   hash  node address -> "<node_id, 16 bytes>:<register second>"
 *   pf:c:{<tag>}               hash  e = keys, o = owner entries of the slot <tag> maps to
 *   pf:sweep                   string, a sweep in progress (SET NX PX: one replica sweeps)
 * Block keys carry no hash tag, so they spread over every slot (and every master); the
 * per-slot counter lives in the same slot as the keys it counts, so the scripts that change
 * a key update its counter atomically (Redis Cluster allows one slot per script call).
 * The node table is one hash (one slot): a fleet is thousands of nodes, not millions.
 *
 * Round trips: Heartbeat 1; Insert/Remove 1 (session) + 1 pipelined per master, + 1
 * (HMGET of the owners' node records) when some key may be reclaimable; QueryPrefix 1
 * pipelined per master + 1 (node records). Unregister and the sweep SCAN every master
 * (COUNT 1000 per round trip) as the memory store scans every shard. Every script
 * compares before it deletes, so replicas and concurrent sweeps never drop a fresh
 * registration. */
#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#define PF_LOG_MOD "metastore"
#include "meta/meta_internal.h"
#include "meta/store_redis.h"
#include "pf/log.h"
#include "pf/metrics.h"

const char *const rs_scripts[NSCRIPTS] = {
    /* S_HB: create, refresh, or take over a stale record. ARGV addr id now stale */
    "local v = redis.call('HGET', KEYS[1], ARGV[1])\n"
    "if v and string.sub(v, 1, 16) ~= ARGV[2] then\n"
    "  local seen = tonumber(string.sub(v, 18)); local now = tonumber(ARGV[3])\n"
    "  if not (now >= seen and now - seen > tonumber(ARGV[4])) then return -1 end\n"
    "end\n"
    "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3])\n"
    "return 0\n",
    /* S_SESS: validate and refresh the session. ARGV addr id now */
    "local v = redis.call('HGET', KEYS[1], ARGV[1])\n"
    "if not v then return -2 end\n"
    "if string.sub(v, 1, 16) ~= ARGV[2] then return -1 end\n"
    "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3])\n"
    "return 0\n",
    /* S_UNREG: drop the record if its session is id. ARGV addr id */
    "local v = redis.call('HGET', KEYS[1], ARGV[1])\n"
    "if v and string.sub(v, 1, 16) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) "
    "return 1 end\n"
    "return 0\n",
    /* S_INS: upsert the owner; 0 = not a new owner, 1 = new, array = new with >= 3 owners
     * (all owners, when ARGV[4] asks for them). KEYS block counter; ARGV addr id reg want */
    "local old = redis.call('HGET', KEYS[1], ARGV[1])\n"
    "redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[3])\n"
    "if not old then\n"
    "  if redis.call('HLEN', KEYS[1]) == 1 then redis.call('HINCRBY', KEYS[2], 'e', 1) end\n"
    "  redis.call('HINCRBY', KEYS[2], 'o', 1)\n"
    "elseif string.sub(old, 1, 16) == ARGV[2] then return 0 end\n"
    "if ARGV[4] == '1' and redis.call('HLEN', KEYS[1]) >= 3 then\n"
    "  return redis.call('HGETALL', KEYS[1]) end\n"
    "return 1\n",
    /* S_REM: delete the owner when its session is id (ARGV[3] absent) or its value is
     * exactly ARGV[3]; 0 none, 1 removed, 2 removed and the key went away.
     * KEYS block counter; ARGV addr id [value] */
    "local old = redis.call('HGET', KEYS[1], ARGV[1])\n"
    "if not old then return 0 end\n"
    "if ARGV[3] then if old ~= ARGV[3] then return 0 end\n"
    "elseif string.sub(old, 1, 16) ~= ARGV[2] then return 0 end\n"
    "redis.call('HDEL', KEYS[1], ARGV[1])\n"
    "redis.call('HINCRBY', KEYS[2], 'o', -1)\n"
    "if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('HINCRBY', KEYS[2], 'e', -1) "
    "return 2 end\n"
    "return 1\n",
    /* S_NODE_DROP: drop a record whose value is still ARGV[2]. ARGV addr value */
    "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then\n"
    "  redis.call('HDEL', KEYS[1], ARGV[1]) return 1 end\n"
    "return 0\n",
};

uint64_t rs_now_ms(const struct rstore *s)
{
    return (s->cfg.clock ? pf_clock_now(s->cfg.clock) : pf_wall_ns()) / PF_NS_PER_MS;
}

static bool valid_str(const char *s, size_t max)
{
    if (!s)
        return false;
    size_t len = strnlen(s, max + 1);
    return len > 0 && len <= max;
}

static int check_hashes(const struct pf_meta_hash *h, size_t n)
{
    if (n == 0 || !h)
        return -EINVAL;
    for (size_t i = 0; i < n; i++)
        if (h[i].len == 0 || h[i].len > PF_META_HASH_MAX || !h[i].data)
            return -EINVAL;
    return 0;
}

void rs_id(const uint8_t id[16], char out[PF_ID_LEN])
{
    memcpy(out, id, PF_ID_LEN);
}

bool rs_parse_val(const char *v, size_t len, uint64_t *num_p)
{
    if (len < PF_ID_LEN + 2 || v[PF_ID_LEN] != ':')
        return false;
    uint64_t x = 0;
    for (size_t i = PF_ID_LEN + 1; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return false;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    *num_p = x;
    return true;
}

/* ------------------------------------------------------------------ commands */

void rs_batch_free(struct batch *b)
{
    if (b->cmd)
        pf_redis_cmds_reset(b->cmd, b->n);
    free(b->cmd);
    free(b->argv);
    free(b->lens);
    free(b->keys);
    free(b->koff);
    free(b->ctag);
    memset(b, 0, sizeof(*b));
}

int rs_batch_alloc(struct batch *b, size_t n, size_t keybytes)
{
    memset(b, 0, sizeof(*b));
    b->n = n;
    b->cmd = calloc(n, sizeof(*b->cmd));
    b->argv = calloc(n * RS_MAXARGS, sizeof(*b->argv));
    b->lens = calloc(n * RS_MAXARGS, sizeof(*b->lens));
    b->keys = malloc(keybytes ? keybytes : 1);
    b->koff = calloc(n + 1, sizeof(*b->koff));
    b->ctag = calloc(n, sizeof(*b->ctag));
    if (!b->cmd || !b->argv || !b->lens || !b->keys || !b->koff || !b->ctag) {
        rs_batch_free(b);
        return -ENOMEM;
    }
    return 0;
}

void rs_set_arg(struct batch *b, size_t i, int a, const char *s, size_t len)
{
    b->argv[i * RS_MAXARGS + a] = s;
    b->lens[i * RS_MAXARGS + a] = len;
}

/* Block key of (ns, h) as command i's key; its slot routes the command. */
static void block_key(struct batch *b, size_t i, const char *ns, size_t nslen,
                      const struct pf_meta_hash *h)
{
    char *k = b->keys + b->koff[i];
    size_t pl = sizeof(BLOCK_PREFIX) - 1;
    memcpy(k, BLOCK_PREFIX, pl);
    memcpy(k + pl, ns, nslen);
    k[pl + nslen] = 0;
    memcpy(k + pl + nslen + 1, h->data, h->len);
    size_t klen = pl + nslen + 1 + h->len;
    b->koff[i + 1] = b->koff[i] + klen;
    b->cmd[i].slot = pf_redis_slot(k, klen);
}

static size_t key_bytes(size_t nslen, const struct pf_meta_hash *h, size_t n)
{
    size_t t = 0;
    for (size_t i = 0; i < n; i++)
        t += sizeof(BLOCK_PREFIX) + nslen + h[i].len;
    return t;
}

/* EVALSHA script on key i (+ its slot's counter key when with_counter). */
void rs_script_cmd(struct rstore *s, struct batch *b, size_t i, int script, bool with_counter,
                   const char *const *args, const size_t *alens, int nargs)
{
    const char *sha = pf_redis_script_sha(s->r, (size_t)script);
    rs_set_arg(b, i, 0, "EVALSHA", 7);
    rs_set_arg(b, i, 1, sha ? sha : "0000000000000000000000000000000000000000", 40);
    rs_set_arg(b, i, 2, with_counter ? "2" : "1", 1);
    rs_set_arg(b, i, 3, b->keys + b->koff[i], b->koff[i + 1] - b->koff[i]);
    int a = 4;
    if (with_counter) {
        int l = snprintf(b->ctag[i], sizeof(b->ctag[i]), "pf:c:{%s}",
                         pf_redis_slot_tag(b->cmd[i].slot));
        rs_set_arg(b, i, a++, b->ctag[i], (size_t)l);
    }
    assert(a + nargs <= RS_MAXARGS);
    for (int j = 0; j < nargs; j++)
        rs_set_arg(b, i, a++, args[j], alens[j]);
    b->cmd[i].argc = a;
    b->cmd[i].argv = &b->argv[i * RS_MAXARGS];
    b->cmd[i].argvlen = &b->lens[i * RS_MAXARGS];
}

/* A script on pf:nodes; returns its integer answer in *v_p. */
int rs_node_script(struct rstore *s, int script, const char *const *args, const size_t *alens,
                   int nargs, long long *v_p)
{
    /* the first exec may be the one that loads the scripts: retry once with the sha */
    for (int attempt = 0; attempt < 2; attempt++) {
        struct batch b;
        if (rs_batch_alloc(&b, 1, sizeof(K_NODES)))
            return -ENOMEM;
        memcpy(b.keys, K_NODES, sizeof(K_NODES) - 1);
        b.koff[1] = sizeof(K_NODES) - 1;
        b.cmd[0].slot = s->nodes_slot;
        rs_script_cmd(s, &b, 0, script, false, args, alens, nargs);
        int rc = pf_redis_exec(s->r, b.cmd, 1);
        if (rc) {
            rs_batch_free(&b);
            return rc;
        }
        redisReply *rep = b.cmd[0].reply;
        if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOSCRIPT", 8) == 0 &&
            attempt == 0) {
            rs_batch_free(&b);
            continue;
        }
        rc = rep->type == REDIS_REPLY_INTEGER ? 0 : -EPROTO;
        if (rc)
            pf_log_ratelimited(PF_LOG_WARN, 1000, "unexpected Redis answer to a node script: %s",
                               rep->type == REDIS_REPLY_ERROR ? rep->str : "(not an integer)");
        else
            *v_p = rep->integer;
        rs_batch_free(&b);
        return rc;
    }
    return -EPROTO;
}

/* Makes sure the script hashes are known (a first connection loaded them). */
int rs_ensure_scripts(struct rstore *s)
{
    if (pf_redis_script_sha(s->r, 0))
        return 0;
    long long v;
    const char *a[2] = {"-", "-"};
    size_t l[2] = {1, 1};
    /* S_UNREG of a node that cannot exist: harmless, connects and loads the scripts */
    int rc = rs_node_script(s, S_UNREG, a, l, 2, &v);
    return rc ? rc : (pf_redis_script_sha(s->r, 0) ? 0 : -ENOTCONN);
}

/* -------------------------------------------------------------- node table */

/* Node records of addrs (HMGET). recs[i].present false when absent. *rep_p owns the text. */
int rs_fetch_nodes(struct rstore *s, struct nrec *recs, size_t n, void **rep_p)
{
    struct pf_redis_cmd c = {0};
    const char **argv = malloc((n + 2) * sizeof(*argv));
    size_t *lens = malloc((n + 2) * sizeof(*lens));
    if (!argv || !lens) {
        free(argv);
        free(lens);
        return -ENOMEM;
    }
    argv[0] = "HMGET";
    lens[0] = 5;
    argv[1] = K_NODES;
    lens[1] = sizeof(K_NODES) - 1;
    for (size_t i = 0; i < n; i++) {
        argv[i + 2] = recs[i].addr;
        lens[i + 2] = recs[i].alen;
    }
    c.argc = (int)n + 2;
    c.argv = argv;
    c.argvlen = lens;
    c.slot = s->nodes_slot;
    int rc = pf_redis_exec(s->r, &c, 1);
    free(argv);
    free(lens);
    if (rc)
        return rc;
    redisReply *rep = c.reply;
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements != n) {
        freeReplyObject(rep);
        return -EPROTO;
    }
    for (size_t i = 0; i < n; i++) {
        redisReply *e = rep->element[i];
        recs[i].present =
            e->type == REDIS_REPLY_STRING && rs_parse_val(e->str, e->len, &recs[i].seen_ms);
        recs[i].id = recs[i].present ? e->str : NULL;
    }
    *rep_p = rep;
    return 0;
}

bool rs_rec_fresh(const struct rstore *s, const struct nrec *r, uint64_t now)
{
    return now < r->seen_ms || now - r->seen_ms <= s->cfg.node_stale_secs * 1000;
}

/* Index of addr in the distinct-address list, appended when new. */
static int addr_index(struct nrec **recs, size_t *n, size_t *cap, const char *a, size_t len)
{
    for (size_t i = 0; i < *n; i++)
        if ((*recs)[i].alen == len && memcmp((*recs)[i].addr, a, len) == 0)
            return (int)i;
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        struct nrec *nr = realloc(*recs, nc * sizeof(*nr));
        if (!nr)
            return -ENOMEM;
        *recs = nr;
        *cap = nc;
    }
    (*recs)[*n] = (struct nrec){.addr = a, .alen = len};
    return (int)(*n)++;
}

/* Is owner (field f, value v) of a key visible given the fetched records? */
static bool owner_visible(const struct rstore *s, const struct nrec *r, const redisReply *v,
                          uint64_t now)
{
    return r->present && v->len >= PF_ID_LEN && memcmp(r->id, v->str, PF_ID_LEN) == 0 &&
           rs_rec_fresh(s, r, now);
}

/* ------------------------------------------------------------------ ops */

int rs_heartbeat(void *impl, const char *node, const uint8_t node_id[16], bool replace)
{
    struct rstore *s = impl;
    if (!valid_str(node, PF_META_NODE_MAX) || !node_id)
        return -EINVAL;
    char id[PF_ID_LEN], now[24], stale[24];
    rs_id(node_id, id);
    int ln = snprintf(now, sizeof(now), "%llu", (unsigned long long)rs_now_ms(s));
    /* replace: a threshold of -1 ms makes any previous session "stale" */
    int ls = replace ? snprintf(stale, sizeof(stale), "-1")
                     : snprintf(stale, sizeof(stale), "%llu",
                                (unsigned long long)(s->cfg.node_stale_secs * 1000));
    const char *a[4] = {node, id, now, stale};
    size_t l[4] = {strlen(node), PF_ID_LEN, (size_t)ln, (size_t)ls};
    long long v;
    int rc = rs_node_script(s, S_HB, a, l, 4, &v);
    if (rc)
        return rc;
    return v == 0 ? 0 : -ESTALE;
}

/* Validates and refreshes (node, node_id). */
static int session_check(struct rstore *s, const char *node, const uint8_t node_id[16])
{
    char id[PF_ID_LEN], now[24];
    rs_id(node_id, id);
    int ln = snprintf(now, sizeof(now), "%llu", (unsigned long long)rs_now_ms(s));
    const char *a[3] = {node, id, now};
    size_t l[3] = {strlen(node), PF_ID_LEN, (size_t)ln};
    long long v;
    int rc = rs_node_script(s, S_SESS, a, l, 3, &v);
    if (rc)
        return rc;
    return v == 0 ? 0 : v == -2 ? -ENOENT : -ESTALE;
}

/* Runs script on every (ns, h[i]) key with args; the batch keeps the replies. */
static int keys_exec(struct rstore *s, struct batch *b, const char *ns,
                     const struct pf_meta_hash *h, size_t n, int script, const char *const *args,
                     const size_t *alens, int nargs)
{
    size_t nslen = strlen(ns);
    int rc = rs_batch_alloc(b, n, key_bytes(nslen, h, n));
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        block_key(b, i, ns, nslen, &h[i]);
        if (script >= 0)
            rs_script_cmd(s, b, i, script, true, args, alens, nargs);
        else {
            rs_set_arg(b, i, 0, "HGETALL", 7);
            rs_set_arg(b, i, 1, b->keys + b->koff[i], b->koff[i + 1] - b->koff[i]);
            b->cmd[i].argc = 2;
            b->cmd[i].argv = &b->argv[i * RS_MAXARGS];
            b->cmd[i].argvlen = &b->lens[i * RS_MAXARGS];
        }
    }
    rc = pf_redis_exec(s->r, b->cmd, n);
    if (rc)
        return rc;
    for (size_t i = 0; i < n; i++) {
        redisReply *rep = b->cmd[i].reply;
        if (rep->type == REDIS_REPLY_ERROR) {
            pf_log_ratelimited(PF_LOG_WARN, 1000, "unexpected Redis answer: %s", rep->str);
            return -EPROTO;
        }
    }
    return 0;
}

int rs_insert(void *impl, const char *ns, const struct pf_meta_hash *h, size_t n, const char *node,
              const uint8_t node_id[16], bool *reclaimable)
{
    struct rstore *s = impl;
    int rc = check_hashes(h, n);
    if (rc || !valid_str(node, PF_META_NODE_MAX) || !valid_str(ns, PF_META_NS_MAX) || !node_id)
        return -EINVAL;
    rc = session_check(s, node, node_id);
    if (!rc)
        rc = rs_ensure_scripts(s);
    if (rc)
        return rc;
    char id[PF_ID_LEN], reg[24];
    rs_id(node_id, id);
    uint64_t now = rs_now_ms(s);
    int lr = snprintf(reg, sizeof(reg), "%llu", (unsigned long long)(now / 1000));
    const char *a[4] = {node, id, reg, reclaimable ? "1" : "0"};
    size_t l[4] = {strlen(node), PF_ID_LEN, (size_t)lr, 1};
    struct batch b;
    rc = keys_exec(s, &b, ns, h, n, S_INS, a, l, 4);
    if (rc || !reclaimable)
        goto out;
    /* keys with >= 3 owners of which this call made us a new one: count visible owners */
    struct nrec *recs = NULL;
    size_t nrec = 0, cap = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        redisReply *rep = b.cmd[i].reply;
        reclaimable[i] = false;
        if (rep->type != REDIS_REPLY_ARRAY)
            continue;
        for (size_t k = 0; k + 1 < rep->elements && !rc; k += 2) {
            int ix = addr_index(&recs, &nrec, &cap, rep->element[k]->str, rep->element[k]->len);
            if (ix < 0)
                rc = ix;
        }
    }
    void *nrep = NULL;
    if (!rc && nrec)
        rc = rs_fetch_nodes(s, recs, nrec, &nrep);
    for (size_t i = 0; i < n && !rc && nrec; i++) {
        redisReply *rep = b.cmd[i].reply;
        if (rep->type != REDIS_REPLY_ARRAY)
            continue;
        size_t vis = 0;
        for (size_t k = 0; k + 1 < rep->elements; k += 2) {
            int ix = addr_index(&recs, &nrec, &cap, rep->element[k]->str, rep->element[k]->len);
            if (ix >= 0 && owner_visible(s, &recs[ix], rep->element[k + 1], now))
                vis++;
        }
        reclaimable[i] = vis >= 3;
    }
    if (nrep)
        freeReplyObject(nrep);
    free(recs);
out:
    rs_batch_free(&b);
    return rc;
}

int rs_remove(void *impl, const char *ns, const struct pf_meta_hash *h, size_t n, const char *node,
              const uint8_t node_id[16], uint64_t *removed_p)
{
    struct rstore *s = impl;
    int rc = check_hashes(h, n);
    if (rc || !valid_str(node, PF_META_NODE_MAX) || !valid_str(ns, PF_META_NS_MAX) || !node_id)
        return -EINVAL;
    rc = session_check(s, node, node_id);
    if (!rc)
        rc = rs_ensure_scripts(s);
    if (rc)
        return rc;
    char id[PF_ID_LEN];
    rs_id(node_id, id);
    const char *a[2] = {node, id};
    size_t l[2] = {strlen(node), PF_ID_LEN};
    struct batch b;
    rc = keys_exec(s, &b, ns, h, n, S_REM, a, l, 2);
    uint64_t removed = 0;
    for (size_t i = 0; i < n && !rc; i++)
        removed += ((redisReply *)b.cmd[i].reply)->integer > 0;
    rs_batch_free(&b);
    if (!rc)
        *removed_p = removed;
    return rc;
}

int rs_query(void *impl, const char *ns, const struct pf_meta_hash *h, size_t n,
             struct pf_meta_prefix **res_p, size_t *nres_p)
{
    struct rstore *s = impl;
    if (check_hashes(h, n) || !valid_str(ns, PF_META_NS_MAX))
        return -EINVAL;
    struct batch b;
    int rc = keys_exec(s, &b, ns, h, n, -1, NULL, NULL, 0);
    struct nrec *recs = NULL;
    uint64_t *plen = NULL;
    size_t nrec = 0, cap = 0, walk = 0;
    void *nrep = NULL;
    if (rc)
        goto out;
    /* the walk can only reach the first key without an owner */
    while (walk < n && ((redisReply *)b.cmd[walk].reply)->elements > 0)
        walk++;
    for (size_t i = 0; i < walk && !rc; i++) {
        redisReply *rep = b.cmd[i].reply;
        for (size_t k = 0; k + 1 < rep->elements && !rc; k += 2) {
            int ix = addr_index(&recs, &nrec, &cap, rep->element[k]->str, rep->element[k]->len);
            if (ix < 0)
                rc = ix;
        }
    }
    if (!rc && nrec)
        rc = rs_fetch_nodes(s, recs, nrec, &nrep);
    if (rc || !nrec)
        goto out;
    plen = calloc(nrec, sizeof(*plen));
    if (!plen) {
        rc = -ENOMEM;
        goto out;
    }
    uint64_t now = rs_now_ms(s);
    for (size_t i = 0; i < walk; i++) {
        redisReply *rep = b.cmd[i].reply;
        bool any = false;
        for (size_t k = 0; k + 1 < rep->elements; k += 2) {
            int ix = addr_index(&recs, &nrec, &cap, rep->element[k]->str, rep->element[k]->len);
            if (ix < 0 || !owner_visible(s, &recs[ix], rep->element[k + 1], now))
                continue;
            any = true;
            if (plen[ix] == i)
                plen[ix] = i + 1;
        }
        if (!any)
            break;
    }
    size_t bytes = 0, nres = 0;
    for (size_t j = 0; j < nrec; j++)
        if (plen[j]) {
            bytes += sizeof(struct pf_meta_prefix) + recs[j].alen + 1;
            nres++;
        }
    struct pf_meta_prefix *res = NULL;
    if (nres) {
        res = malloc(bytes);
        if (!res) {
            rc = -ENOMEM;
            goto out;
        }
        char *p = (char *)(res + nres);
        size_t k = 0;
        for (size_t j = 0; j < nrec; j++) {
            if (!plen[j])
                continue;
            memcpy(p, recs[j].addr, recs[j].alen);
            p[recs[j].alen] = 0;
            res[k].node = p;
            res[k++].prefix_len = plen[j];
            p += recs[j].alen + 1;
        }
    }
    *res_p = res;
    *nres_p = nres;
    rc = 1;
out:
    if (nrep)
        freeReplyObject(nrep);
    free(plen);
    free(recs);
    rs_batch_free(&b);
    if (rc == 0) {
        *res_p = NULL;
        *nres_p = 0;
    }
    return rc == 1 ? 0 : rc;
}
