/* Redis store, the whole-keyspace parts: UnregisterNode and the sweep (SCAN of every master,
 * COUNT 1000 keys per round trip, each batch's scripts pipelined), statistics (per-slot
 * counters, node table, INFO memory), metrics and lifecycle. Data model in store_redis.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define PF_LOG_MOD "metastore"
#include "meta/store_redis.h"
#include "pf/log.h"

/* Calls fn(s, keys, ctx) for each SCAN batch of block keys on every master. */
static int scan_blocks(struct rstore *s, int (*fn)(struct rstore *, redisReply *, void *),
                       void *ctx)
{
    size_t nm = pf_redis_nmasters(s->r);
    if (nm == 0)
        return -ENOTCONN;
    for (size_t m = 0; m < nm; m++) {
        char cursor[32] = "0";
        do {
            const char *av[6] = {"SCAN", cursor, "MATCH", BLOCK_PREFIX "*", "COUNT", SCAN_COUNT};
            size_t al[6] = {4, strlen(cursor), 5, sizeof(BLOCK_PREFIX), 5, sizeof(SCAN_COUNT) - 1};
            redisReply *rep;
            int rc = pf_redis_exec_master(s->r, m, 6, av, al, (void **)&rep);
            if (rc)
                return rc;
            if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
                rep->element[0]->type != REDIS_REPLY_STRING || rep->element[0]->len >= 32 ||
                rep->element[1]->type != REDIS_REPLY_ARRAY) {
                freeReplyObject(rep);
                return -EPROTO;
            }
            memcpy(cursor, rep->element[0]->str, rep->element[0]->len + 1);
            rc = rep->element[1]->elements ? fn(s, rep->element[1], ctx) : 0;
            freeReplyObject(rep);
            if (rc)
                return rc;
        } while (strcmp(cursor, "0") != 0);
    }
    return 0;
}

/* A batch over the raw keys of a SCAN answer (commands filled by the caller). */
static int batch_of_keys(struct batch *b, const redisReply *keys)
{
    size_t bytes = 0;
    for (size_t i = 0; i < keys->elements; i++)
        bytes += keys->element[i]->len;
    int rc = rs_batch_alloc(b, keys->elements, bytes);
    if (rc)
        return rc;
    for (size_t i = 0; i < keys->elements; i++) {
        const redisReply *k = keys->element[i];
        memcpy(b->keys + b->koff[i], k->str, k->len);
        b->koff[i + 1] = b->koff[i] + k->len;
        b->cmd[i].slot = pf_redis_slot(k->str, k->len);
    }
    return 0;
}

static int exec_checked(struct rstore *s, struct batch *b, size_t n)
{
    int rc = pf_redis_exec(s->r, b->cmd, n);
    for (size_t i = 0; i < n && !rc; i++)
        if (((redisReply *)b->cmd[i].reply)->type == REDIS_REPLY_ERROR) {
            pf_log_ratelimited(PF_LOG_WARN, 1000, "unexpected Redis answer: %s",
                               ((redisReply *)b->cmd[i].reply)->str);
            rc = -EPROTO;
        }
    return rc;
}

/* ------------------------------------------------------------------ unregister */

struct unreg_ctx {
    const char *args[2];
    size_t lens[2];
    uint64_t removed;
};

/* HGET of the node's field on every key first (cheap, read-only), then the delete script
 * only where the owner is this session. */
static int unreg_batch(struct rstore *s, redisReply *keys, void *arg)
{
    struct unreg_ctx *u = arg;
    struct batch b, d = {0};
    int rc = batch_of_keys(&b, keys);
    if (rc)
        return rc;
    size_t nd = 0, bytes = 0;
    for (size_t i = 0; i < b.n; i++) {
        rs_set_arg(&b, i, 0, "HGET", 4);
        rs_set_arg(&b, i, 1, b.keys + b.koff[i], b.koff[i + 1] - b.koff[i]);
        rs_set_arg(&b, i, 2, u->args[0], u->lens[0]);
        b.cmd[i].argc = 3;
        b.cmd[i].argv = &b.argv[i * RS_MAXARGS];
        b.cmd[i].argvlen = &b.lens[i * RS_MAXARGS];
    }
    rc = exec_checked(s, &b, b.n);
    for (size_t i = 0; i < b.n && !rc; i++) {
        redisReply *v = b.cmd[i].reply;
        bool mine = v->type == REDIS_REPLY_STRING && v->len >= PF_ID_LEN &&
                    memcmp(v->str, u->args[1], PF_ID_LEN) == 0;
        if (mine) {
            nd++;
            bytes += b.koff[i + 1] - b.koff[i];
        } else {
            pf_redis_cmds_reset(&b.cmd[i], 1); /* NULL reply: not ours */
        }
    }
    if (!rc && nd) {
        rc = rs_batch_alloc(&d, nd, bytes);
        d.n = 0;
        for (size_t i = 0; i < b.n && !rc; i++) {
            if (!b.cmd[i].reply)
                continue;
            size_t j = d.n++, kl = b.koff[i + 1] - b.koff[i];
            memcpy(d.keys + d.koff[j], b.keys + b.koff[i], kl);
            d.koff[j + 1] = d.koff[j] + kl;
            d.cmd[j].slot = b.cmd[i].slot;
            rs_script_cmd(s, &d, j, S_REM, true, u->args, u->lens, 2);
        }
        if (!rc)
            rc = exec_checked(s, &d, d.n);
        for (size_t j = 0; j < d.n && !rc; j++)
            u->removed += ((redisReply *)d.cmd[j].reply)->integer > 0;
    }
    rs_batch_free(&d);
    rs_batch_free(&b);
    return rc;
}

static int rs_unregister(void *impl, const char *node, const uint8_t node_id[16],
                         uint64_t *removed_owners_p)
{
    struct rstore *s = impl;
    if (!node || !*node || strnlen(node, PF_META_NODE_MAX + 1) > PF_META_NODE_MAX || !node_id)
        return -EINVAL;
    char id[PF_ID_LEN];
    rs_id(node_id, id);
    struct unreg_ctx u = {.args = {node, id}, .lens = {strlen(node), PF_ID_LEN}};
    long long v;
    int rc = rs_node_script(s, S_UNREG, u.args, u.lens, 2, &v);
    if (!rc)
        rc = scan_blocks(s, unreg_batch, &u);
    if (!rc)
        *removed_owners_p = u.removed;
    return rc;
}

/* ------------------------------------------------------------------ sweep */

struct sweep_ctx {
    struct nrec *recs; /* node records kept by this sweep */
    size_t nrec;
    int32_t *ix; /* open-addressing index of recs by address */
    size_t ixmask;
    uint64_t now_ms;
    struct pf_meta_sweep_stats st;
    uint64_t red[4], copies;
};

static const struct nrec *sweep_find(const struct sweep_ctx *c, const char *a, size_t len)
{
    for (size_t i = XXH3_64bits(a, len) & c->ixmask; c->ix[i] >= 0; i = (i + 1) & c->ixmask) {
        const struct nrec *r = &c->recs[c->ix[i]];
        if (r->alen == len && memcmp(r->addr, a, len) == 0)
            return r;
    }
    return NULL;
}

static int sweep_batch(struct rstore *s, redisReply *keys, void *arg)
{
    struct sweep_ctx *c = arg;
    struct batch b, d = {0};
    int rc = batch_of_keys(&b, keys);
    if (rc)
        return rc;
    for (size_t i = 0; i < b.n; i++) {
        rs_set_arg(&b, i, 0, "HGETALL", 7);
        rs_set_arg(&b, i, 1, b.keys + b.koff[i], b.koff[i + 1] - b.koff[i]);
        b.cmd[i].argc = 2;
        b.cmd[i].argv = &b.argv[i * RS_MAXARGS];
        b.cmd[i].argvlen = &b.lens[i * RS_MAXARGS];
    }
    rc = exec_checked(s, &b, b.n);
    if (rc)
        goto out;
    /* owners not kept: deleted if still exactly what we saw */
    size_t ndrop = 0, bytes = 0;
    uint64_t now_s = c->now_ms / 1000, ttl_s = s->cfg.ttl_secs;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < b.n; i++) {
            redisReply *rep = b.cmd[i].reply;
            size_t vis = 0;
            for (size_t k = 0; k + 1 < rep->elements; k += 2) {
                redisReply *f = rep->element[k], *v = rep->element[k + 1];
                const struct nrec *r = sweep_find(c, f->str, f->len);
                uint64_t reg;
                bool kept = r && rs_parse_val(v->str, v->len, &reg) &&
                            (int64_t)now_s - (int64_t)reg <= (int64_t)ttl_s;
                if (kept) {
                    vis += pass == 0 && memcmp(r->id, v->str, PF_ID_LEN) == 0 &&
                           rs_rec_fresh(s, r, c->now_ms);
                    continue;
                }
                if (pass == 0) {
                    ndrop++;
                    bytes += b.koff[i + 1] - b.koff[i];
                    continue;
                }
                size_t j = d.n++;
                memcpy(d.keys + d.koff[j], b.keys + b.koff[i], b.koff[i + 1] - b.koff[i]);
                d.koff[j + 1] = d.koff[j] + b.koff[i + 1] - b.koff[i];
                d.cmd[j].slot = b.cmd[i].slot;
                const char *a[3] = {f->str, "-", v->str};
                size_t l[3] = {f->len, 1, v->len};
                rs_script_cmd(s, &d, j, S_REM, true, a, l, 3);
            }
            if (pass == 0 && vis) {
                c->red[vis >= 4 ? 3 : vis - 1]++;
                c->copies += vis;
            }
        }
        if (pass == 0) {
            if (!ndrop)
                break;
            rc = rs_batch_alloc(&d, ndrop, bytes);
            if (rc)
                goto out;
            d.n = 0;
        }
    }
    if (ndrop) {
        rc = exec_checked(s, &d, d.n);
        for (size_t j = 0; j < d.n && !rc; j++) {
            long long v = ((redisReply *)d.cmd[j].reply)->integer;
            c->st.removed_owners += v > 0;
            c->st.removed_keys += v == 2;
        }
    }
out:
    rs_batch_free(&d);
    rs_batch_free(&b);
    return rc;
}

static int sweep_nodes(struct rstore *s, struct sweep_ctx *c, redisReply **rep_p)
{
    struct pf_redis_cmd cmd = {.argc = 2,
                               .argv = (const char *[]){"HGETALL", K_NODES},
                               .argvlen = (const size_t[]){7, sizeof(K_NODES) - 1},
                               .slot = s->nodes_slot};
    int rc = pf_redis_exec(s->r, &cmd, 1);
    if (rc)
        return rc;
    redisReply *rep = cmd.reply;
    *rep_p = rep;
    if (rep->type != REDIS_REPLY_ARRAY)
        return -EPROTO;
    size_t n = rep->elements / 2, cap = 16;
    while (cap < 2 * n)
        cap *= 2;
    c->recs = calloc(n ? n : 1, sizeof(*c->recs));
    c->ix = malloc(cap * sizeof(*c->ix));
    if (!c->recs || !c->ix)
        return -ENOMEM;
    memset(c->ix, 0xff, cap * sizeof(*c->ix));
    c->ixmask = cap - 1;
    for (size_t k = 0; k + 1 < rep->elements; k += 2) {
        redisReply *f = rep->element[k], *v = rep->element[k + 1];
        struct nrec r = {.addr = f->str, .alen = f->len, .id = v->str, .present = true};
        if (!rs_parse_val(v->str, v->len, &r.seen_ms))
            continue;
        if (c->now_ms > r.seen_ms && c->now_ms - r.seen_ms > s->cfg.ttl_secs * 1000) {
            const char *a[2] = {f->str, v->str};
            size_t l[2] = {f->len, v->len};
            long long dropped = 0;
            rc = rs_node_script(s, S_NODE_DROP, a, l, 2, &dropped);
            if (rc)
                return rc;
            if (dropped) {
                c->st.removed_nodes++;
                pf_info("sweep: node %s dropped (no heartbeat for %llu s)", f->str,
                        (unsigned long long)((c->now_ms - r.seen_ms) / 1000));
                continue;
            }
        }
        size_t i = XXH3_64bits(r.addr, r.alen) & c->ixmask;
        while (c->ix[i] >= 0)
            i = (i + 1) & c->ixmask;
        c->ix[i] = (int32_t)c->nrec;
        c->recs[c->nrec++] = r;
    }
    return 0;
}

static void rs_sweep(void *impl, struct pf_meta_sweep_stats *stats_p)
{
    struct rstore *s = impl;
    struct sweep_ctx c = {.now_ms = rs_now_ms(s)};
    redisReply *nodes = NULL;
    /* one sweep at a time over all replicas */
    struct pf_redis_cmd lock = {.argc = 6,
                                .argv = (const char *[]){"SET", K_SWEEP, "1", "NX", "PX", "600000"},
                                .argvlen = (const size_t[]){3, sizeof(K_SWEEP) - 1, 1, 2, 2, 6},
                                .slot = pf_redis_slot(K_SWEEP, sizeof(K_SWEEP) - 1)};
    int rc = rs_ensure_scripts(s);
    if (!rc)
        rc = pf_redis_exec(s->r, &lock, 1);
    if (rc)
        goto out;
    bool mine = ((redisReply *)lock.reply)->type == REDIS_REPLY_STATUS;
    pf_redis_cmds_reset(&lock, 1);
    if (!mine) {
        pf_debug("sweep skipped: another MetaServer is sweeping");
        goto out;
    }
    rc = sweep_nodes(s, &c, &nodes);
    if (!rc)
        rc = scan_blocks(s, sweep_batch, &c);
    struct pf_redis_cmd unlock = {.argc = 2,
                                  .argv = (const char *[]){"DEL", K_SWEEP},
                                  .argvlen = (const size_t[]){3, sizeof(K_SWEEP) - 1},
                                  .slot = lock.slot};
    if (pf_redis_exec(s->r, &unlock, 1) == 0)
        pf_redis_cmds_reset(&unlock, 1);
    if (!rc) {
        for (int k = 0; k < 4; k++)
            atomic_store(&s->red[k], c.red[k]);
        atomic_store(&s->red_copies, c.copies);
    }
out:
    if (rc)
        pf_warn("sweep failed: %s", rc == -ENOTCONN ? "Redis unreachable" : strerror(-rc));
    if (nodes)
        freeReplyObject(nodes);
    free(c.recs);
    free(c.ix);
    pf_metric_add(s->c_sw_owners, (double)c.st.removed_owners);
    pf_metric_add(s->c_sw_keys, (double)c.st.removed_keys);
    pf_metric_add(s->c_sw_nodes, (double)c.st.removed_nodes);
    pf_metric_add(s->c_sweeps, 1);
    if (stats_p)
        *stats_p = c.st;
}

/* ------------------------------------------------------------------ stats */

static int stats_fetch(struct rstore *s, struct pf_meta_store_stats *out)
{
    memset(out, 0, sizeof(*out));
    struct batch b;
    int rc = rs_batch_alloc(&b, NSLOTS, 1);
    if (rc)
        return rc;
    for (size_t i = 0; i < NSLOTS; i++) {
        int l = snprintf(b.ctag[i], sizeof(b.ctag[i]), "pf:c:{%s}", pf_redis_slot_tag((uint16_t)i));
        rs_set_arg(&b, i, 0, "HMGET", 5);
        rs_set_arg(&b, i, 1, b.ctag[i], (size_t)l);
        rs_set_arg(&b, i, 2, "e", 1);
        rs_set_arg(&b, i, 3, "o", 1);
        b.cmd[i] = (struct pf_redis_cmd){.argc = 4,
                                         .argv = &b.argv[i * RS_MAXARGS],
                                         .argvlen = &b.lens[i * RS_MAXARGS],
                                         .slot = (uint16_t)i};
    }
    rc = exec_checked(s, &b, NSLOTS);
    for (size_t i = 0; i < NSLOTS && !rc; i++) {
        redisReply *rep = b.cmd[i].reply;
        if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2)
            continue;
        if (rep->element[0]->type == REDIS_REPLY_STRING)
            out->entries += strtoull(rep->element[0]->str, NULL, 10);
        if (rep->element[1]->type == REDIS_REPLY_STRING)
            out->owners += strtoull(rep->element[1]->str, NULL, 10);
    }
    rs_batch_free(&b);
    if (rc)
        return rc;
    struct sweep_ctx c = {.now_ms = UINT64_MAX};
    struct pf_redis_cmd cmd = {.argc = 2,
                               .argv = (const char *[]){"HGETALL", K_NODES},
                               .argvlen = (const size_t[]){7, sizeof(K_NODES) - 1},
                               .slot = s->nodes_slot};
    rc = pf_redis_exec(s->r, &cmd, 1);
    if (rc)
        return rc;
    redisReply *rep = cmd.reply;
    uint64_t now = rs_now_ms(s);
    for (size_t k = 0; rep->type == REDIS_REPLY_ARRAY && k + 1 < rep->elements; k += 2) {
        struct nrec r = {0};
        if (!rs_parse_val(rep->element[k + 1]->str, rep->element[k + 1]->len, &r.seen_ms))
            continue;
        if (rs_rec_fresh(s, &r, now))
            out->nodes_active++;
        else
            out->nodes_stale++;
        out->sessions++;
    }
    freeReplyObject(rep);
    (void)c;
    size_t nm = pf_redis_nmasters(s->r);
    for (size_t m = 0; m < nm; m++) {
        redisReply *info;
        if (pf_redis_exec_master(s->r, m, 2, (const char *[]){"INFO", "memory"},
                                 (const size_t[]){4, 6}, (void **)&info))
            continue;
        const char *p = info->type == REDIS_REPLY_STRING ? strstr(info->str, "used_memory:") : NULL;
        if (p)
            out->bytes += strtoull(p + 12, NULL, 10);
        freeReplyObject(info);
    }
    for (int k = 0; k < 4; k++)
        out->redundancy[k] = atomic_load(&s->red[k]);
    out->visible_copies = atomic_load(&s->red_copies);
    return 0;
}

static void rs_get_stats(void *impl, struct pf_meta_store_stats *out)
{
    struct rstore *s = impl;
    if (stats_fetch(s, out))
        memset(out, 0, sizeof(*out));
}

/* ------------------------------------------------------------------ metrics */

/* Scrapes reuse one fetch for a second (each scrape asks for several gauges). */
static bool cached(struct rstore *s, struct pf_meta_store_stats *out)
{
    pthread_mutex_lock(&s->cache_mu);
    uint64_t now = pf_now_ns();
    int rc = 0;
    if (!s->cache_ns || now - s->cache_ns > PF_NS_PER_SEC) {
        rc = stats_fetch(s, &s->cache);
        s->cache_ns = rc ? 0 : now;
    }
    *out = s->cache;
    pthread_mutex_unlock(&s->cache_mu);
    return rc == 0;
}

static void collect(void *ctx, pf_metric_emit_fn emit, void *ectx, int which)
{
    struct pf_meta_store_stats st;
    if (!cached(ctx, &st))
        return;
    double v = which == 0 ? (double)st.entries : which == 1 ? (double)st.owners : (double)st.bytes;
    emit(ectx, NULL, v);
}
static void collect_entries(void *c, pf_metric_emit_fn e, void *x)
{
    collect(c, e, x, 0);
}
static void collect_owners(void *c, pf_metric_emit_fn e, void *x)
{
    collect(c, e, x, 1);
}
static void collect_bytes(void *c, pf_metric_emit_fn e, void *x)
{
    collect(c, e, x, 2);
}
static void collect_nodes(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    struct pf_meta_store_stats st;
    if (!cached(ctx, &st))
        return;
    emit(ectx, (const char *[]){"active"}, (double)st.nodes_active);
    emit(ectx, (const char *[]){"stale"}, (double)st.nodes_stale);
}
static void collect_red(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    struct rstore *s = ctx;
    static const char *const labels[4] = {"1", "2", "3", ">=4"};
    for (int i = 0; i < 4; i++)
        emit(ectx, (const char *[]){labels[i]}, (double)atomic_load(&s->red[i]));
}
static void collect_red_avg(void *ctx, pf_metric_emit_fn emit, void *ectx)
{
    struct rstore *s = ctx;
    uint64_t keys = 0;
    for (int i = 0; i < 4; i++)
        keys += atomic_load(&s->red[i]);
    emit(ectx, NULL, keys ? (double)atomic_load(&s->red_copies) / (double)keys : 0.0);
}

static void rs_destroy(void *impl)
{
    struct rstore *s = impl;
    if (!s)
        return;
    pf_metric_gauge_fn_clear(s->g_entries, s);
    pf_metric_gauge_fn_clear(s->g_owners, s);
    pf_metric_gauge_fn_clear(s->g_bytes, s);
    pf_metric_gauge_fn_clear(s->g_nodes, s);
    pf_metric_gauge_fn_clear(s->g_red, s);
    pf_metric_gauge_fn_clear(s->g_red_avg, s);
    pf_redis_close(s->r);
    pthread_mutex_destroy(&s->cache_mu);
    free(s);
}

static const struct pf_meta_store_ops redis_ops = {
    .destroy = rs_destroy,
    .heartbeat = rs_heartbeat,
    .unregister = rs_unregister,
    .insert = rs_insert,
    .remove = rs_remove,
    .query_prefix = rs_query,
    .sweep = rs_sweep,
    .get_stats = rs_get_stats,
};

/* ------------------------------------------------------------------ open */

static void free_secret(char *p)
{
    if (p) {
        explicit_bzero(p, strlen(p));
        free(p);
    }
}

/* "redis://[[user:]password@]host:port[,host:port...]"; with cfg->redis_password the URL
 * may name only a user ("redis://user@host:port"). Messages name the URL redacted
 * (pf_meta_store_redact): the password is never logged. */
int pf_meta_redis_store_open(const struct pf_meta_store_config *cfg,
                             const struct pf_meta_store_ops **ops_p, void **impl_p)
{
    const char *url = cfg->store;
    char shown[512];
    pf_meta_store_redact(url, shown, sizeof(shown));
    if (strncmp(url, "rediss://", 9) == 0) {
        pf_error("--store %s: TLS needs hiredis >= 1.0 (this build uses hiredis %d.%d); "
                 "use redis:// over a trusted network or a TLS tunnel",
                 shown, HIREDIS_MAJOR, HIREDIS_MINOR);
        return -EINVAL;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        pf_error("--store %s: expected memory or redis://HOST:PORT[,HOST:PORT...]", shown);
        return -EINVAL;
    }
    const char *rest = url + 8, *at = strrchr(rest, '@');
    char *user = NULL, *pass = NULL;
    int rc = -ENOMEM;
    if (at) {
        const char *colon = memchr(rest, ':', (size_t)(at - rest));
        if (colon) {
            user = colon > rest ? strndup(rest, (size_t)(colon - rest)) : NULL;
            pass = strndup(colon + 1, (size_t)(at - colon - 1));
            if ((colon > rest && !user) || !pass)
                goto err;
        } else if (cfg->redis_password) { /* "user@": the password comes from elsewhere */
            if (at > rest && !(user = strndup(rest, (size_t)(at - rest))))
                goto err;
        } else if (!(pass = strndup(rest, (size_t)(at - rest)))) {
            goto err;
        }
        rest = at + 1;
    }
    if (cfg->redis_password) {
        if (pass) {
            pf_error("--store %s: the URL has a password and --redis-password-file or "
                     "PEGAFLOW_REDIS_PASSWORD gives another; give it once",
                     shown);
            rc = -EINVAL;
            goto err;
        }
        if (!(pass = strdup(cfg->redis_password)))
            goto err;
    }
    struct rstore *s = calloc(1, sizeof(*s));
    if (!s)
        goto err;
    s->cfg = *cfg;
    s->cfg.store = NULL;
    s->cfg.redis_password = NULL;
    s->nodes_slot = pf_redis_slot(K_NODES, sizeof(K_NODES) - 1);
    pthread_mutex_init(&s->cache_mu, NULL);
    struct pf_redis_config rcfg = {.seeds = rest,
                                   .password = pass,
                                   .user = user,
                                   .timeout_ms = TIMEOUT_MS,
                                   .scripts = rs_scripts,
                                   .nscripts = NSCRIPTS};
    rc = pf_redis_open(&rcfg, &s->r);
    if (rc) {
        if (rc == -EINVAL)
            pf_error("--store %s: expected redis://[[USER:]PASSWORD@]HOST:PORT[,HOST:PORT...]",
                     shown);
        pthread_mutex_destroy(&s->cache_mu);
        free(s);
        goto err;
    }
    s->g_entries = pf_metric_gauge_fn("pegaflow_metaserver_store_entries",
                                      "Keys (namespace, block hash) in the MetaServer store", "",
                                      collect_entries, s);
    s->g_bytes = pf_metric_gauge_fn("pegaflow_metaserver_store_bytes",
                                    "Memory held by the store's key tables and entries", "",
                                    collect_bytes, s);
    s->g_owners = pf_metric_gauge_fn("pegaflow_metaserver_block_owners",
                                     "Owner entries over all keys", "", collect_owners, s);
    s->g_nodes =
        pf_metric_gauge_fn("pegaflow_metaserver_nodes", "Node records by heartbeat freshness",
                           "state", collect_nodes, s);
    s->g_red = pf_metric_gauge_fn("pegaflow_metaserver_block_redundancy",
                                  "Keys by number of visible owners (last sweep)", "owners",
                                  collect_red, s);
    s->g_red_avg = pf_metric_gauge_fn("pegaflow_metaserver_block_redundancy_avg",
                                      "Average visible owners per key with one (last sweep)", "",
                                      collect_red_avg, s);
    s->c_sw_owners = pf_metric_counter("pegaflow_metaserver_sweep_removed_owners",
                                       "Owner entries removed by the sweep", "");
    s->c_sw_keys = pf_metric_counter("pegaflow_metaserver_sweep_removed_keys",
                                     "Keys removed by the sweep", "");
    s->c_sw_nodes = pf_metric_counter("pegaflow_metaserver_sweep_removed_nodes",
                                      "Node records removed by the sweep", "");
    s->c_sweeps = pf_metric_counter("pegaflow_metaserver_sweeps", "Sweeps run", "");
    free_secret(user);
    free_secret(pass);
    *ops_p = &redis_ops;
    *impl_p = s;
    return 0;
err:
    free_secret(user);
    free_secret(pass);
    return rc;
}
