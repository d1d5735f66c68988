/* Redis / Redis Cluster client for the MetaServer's Redis store (contract in
 * meta/meta_internal.h).
 *
 * Design: a slot map (16384 entries, node index or -1) and a node table guarded by one
 * reader/writer lock; node records are never freed before close, so a pointer taken under
 * the lock stays valid. A batch is grouped by owning node and pipelined on one connection
 * of that node (append all, read all): one round trip per node. Redirect answers are
 * handled per command and re-sent in the next round. Every connection loads the caller's
 * scripts on connect, so EVALSHA works on it; a NOSCRIPT answer (script cache flushed under
 * us) is returned as is and closes the connection, which reloads them on the next use. hiredis 0.14
 * (Debian 12) has no TLS, so the URL scheme rediss:// is rejected by the store. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#define PF_LOG_MOD "redis"
#include "meta/meta_internal.h"
#include "pf/clock.h"
#include "pf/log.h"
#include "pf/metrics.h"

#define NSLOTS       16384
#define NCONN        4
#define MAX_NODES    256
#define MAX_REDIRECT 4
#define MAX_SCRIPTS  8
#define BACKOFF_MIN  100u
#define BACKOFF_MAX  2000u

/* ------------------------------------------------------------------ slots */

static uint16_t crc_tab[256];
static char slot_tags[NSLOTS][8];
static pthread_once_t tabs_once = PTHREAD_ONCE_INIT;

static uint16_t crc16(const uint8_t *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++)
        crc = (uint16_t)((crc << 8) ^ crc_tab[((crc >> 8) ^ p[i]) & 0xff]);
    return crc;
}

static void tabs_init(void)
{
    for (unsigned i = 0; i < 256; i++) {
        uint16_t c = (uint16_t)(i << 8);
        for (int b = 0; b < 8; b++)
            c = (uint16_t)((c & 0x8000) ? (c << 1) ^ 0x1021 : c << 1);
        crc_tab[i] = c;
    }
    size_t filled = 0;
    static const char dig[] = "0123456789abcdefghijklmnopqrstuvwxyz";
    for (unsigned v = 0; filled < NSLOTS && v < 36u * 36 * 36 * 36 * 36; v++) {
        char s[8];
        int len = 0;
        unsigned x = v;
        do {
            s[len++] = dig[x % 36];
            x /= 36;
        } while (x && len < 6);
        s[len] = 0;
        uint16_t slot = crc16((const uint8_t *)s, (size_t)len) & (NSLOTS - 1);
        if (!slot_tags[slot][0]) {
            memcpy(slot_tags[slot], s, (size_t)len + 1);
            filled++;
        }
    }
}

uint16_t pf_redis_slot(const void *key, size_t len)
{
    pthread_once(&tabs_once, tabs_init);
    const uint8_t *k = key;
    size_t s;
    for (s = 0; s < len && k[s] != '{'; s++)
        ;
    if (s < len) {
        size_t e;
        for (e = s + 1; e < len && k[e] != '}'; e++)
            ;
        if (e < len && e > s + 1)
            return crc16(k + s + 1, e - s - 1) & (NSLOTS - 1);
    }
    return crc16(k, len) & (NSLOTS - 1);
}

const char *pf_redis_slot_tag(uint16_t slot)
{
    pthread_once(&tabs_once, tabs_init);
    return slot_tags[slot & (NSLOTS - 1)];
}

/* ------------------------------------------------------------------ handle */

struct rconn {
    pthread_mutex_t mu;
    redisContext *c;
    uint32_t gen; /* node generation it was opened in */
};

struct rnode {
    char *host;
    int port;
    struct rconn conns[NCONN];
    _Atomic uint64_t down_until_ns;
    _Atomic uint32_t backoff_ms;
    _Atomic unsigned rr;
    _Atomic uint32_t gen; /* bumped when a reused connection broke: reopen all of them */
};

struct pf_redis {
    char **seed_host;
    int *seed_port;
    size_t nseeds;
    char *password, *user;
    uint32_t timeout_ms;
    char **scripts;
    size_t nscripts;
    pthread_mutex_t sha_mu; /* first writer of sha[] */
    char sha[MAX_SCRIPTS][41];
    _Atomic bool sha_ready;

    pthread_rwlock_t lock; /* nodes[], nnodes, slot_node[], map_ok, masters[] */
    struct rnode *nodes[MAX_NODES];
    size_t nnodes;
    int16_t slot_node[NSLOTS];
    int16_t masters[MAX_NODES];
    size_t nmasters;
    bool map_ok;
    pthread_mutex_t refresh_mu; /* also guards refresh_after_ns, refresh_backoff_ms */
    uint64_t refresh_after_ns;
    uint32_t refresh_backoff_ms;

    struct pf_metric *c_rtt, *c_cmds, *c_err, *h_lat;
};

static const double lat_buckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                     0.01,   0.025,   0.05,   0.1,   0.25,   1.0};

static void count_err(struct pf_redis *r, const char *kind)
{
    pf_child_add(pf_metric_child1(r->c_err, kind), 1);
}

static int parse_hostport(const char *s, size_t len, char **host_p, int *port_p)
{
    const char *colon = NULL;
    for (size_t i = 0; i < len; i++)
        if (s[i] == ':')
            colon = s + i;
    if (!colon || colon == s || (size_t)(colon - s) + 1 >= len)
        return -EINVAL;
    long port = 0;
    for (const char *p = colon + 1; p < s + len; p++) {
        if (*p < '0' || *p > '9')
            return -EINVAL;
        port = port * 10 + (*p - '0');
        if (port > 65535)
            return -EINVAL;
    }
    if (port == 0)
        return -EINVAL;
    char *h = strndup(s, (size_t)(colon - s));
    if (!h)
        return -ENOMEM;
    *host_p = h;
    *port_p = (int)port;
    return 0;
}

/* Index of host:port in nodes[], created when absent. Caller holds the write lock. */
static int node_get_locked(struct pf_redis *r, const char *host, int port)
{
    for (size_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i]->port == port && strcmp(r->nodes[i]->host, host) == 0)
            return (int)i;
    if (r->nnodes == MAX_NODES)
        return -ENOSPC;
    struct rnode *n = calloc(1, sizeof(*n));
    if (!n)
        return -ENOMEM;
    n->host = strdup(host);
    if (!n->host) {
        free(n);
        return -ENOMEM;
    }
    n->port = port;
    for (int i = 0; i < NCONN; i++)
        pthread_mutex_init(&n->conns[i].mu, NULL);
    r->nodes[r->nnodes] = n;
    return (int)r->nnodes++;
}

static void mark_down(struct pf_redis *r, struct rnode *n)
{
    (void)r;
    uint32_t b = atomic_load(&n->backoff_ms);
    b = b ? (b * 2 > BACKOFF_MAX ? BACKOFF_MAX : b * 2) : BACKOFF_MIN;
    atomic_store(&n->backoff_ms, b);
    atomic_store(&n->down_until_ns, pf_now_ns() + (uint64_t)b * PF_NS_PER_MS);
}

static redisReply *cmd_argv(redisContext *c, int argc, const char **argv, const size_t *lens)
{
    return redisCommandArgv(c, argc, argv, lens);
}

/* Connects, authenticates and loads the scripts. NULL on failure (logged rate-limited). */
static redisContext *conn_open(struct pf_redis *r, struct rnode *n)
{
    struct timeval tv = {.tv_sec = r->timeout_ms / 1000,
                         .tv_usec = (suseconds_t)(r->timeout_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(n->host, n->port, tv);
    if (!c || c->err) {
        count_err(r, "connect");
        pf_log_ratelimited(PF_LOG_WARN, 1000, "redis %s:%d: connect: %s", n->host, n->port,
                           c ? c->errstr : "out of memory");
        goto err_ctx;
    }
    if (redisSetTimeout(c, tv) != REDIS_OK)
        goto err_ctx;
    redisEnableKeepAlive(c);
    if (r->password) {
        const char *av[3] = {"AUTH", r->user ? r->user : r->password, r->password};
        size_t al[3] = {4, strlen(av[1]), strlen(r->password)};
        redisReply *rep = cmd_argv(c, r->user ? 3 : 2, av, al);
        if (!rep || rep->type == REDIS_REPLY_ERROR) {
            count_err(r, "auth");
            pf_log_ratelimited(PF_LOG_WARN, 1000, "redis %s:%d: AUTH failed: %s", n->host, n->port,
                               rep ? rep->str : c->errstr);
            if (rep)
                freeReplyObject(rep);
            goto err_ctx;
        }
        freeReplyObject(rep);
    }
    for (size_t i = 0; i < r->nscripts; i++) {
        const char *av[3] = {"SCRIPT", "LOAD", r->scripts[i]};
        size_t al[3] = {6, 4, strlen(r->scripts[i])};
        redisReply *rep = cmd_argv(c, 3, av, al);
        if (!rep || rep->type != REDIS_REPLY_STRING || rep->len != 40) {
            count_err(r, "script_load");
            pf_log_ratelimited(PF_LOG_WARN, 1000, "redis %s:%d: SCRIPT LOAD failed: %s", n->host,
                               n->port, rep && rep->str ? rep->str : c->errstr);
            if (rep)
                freeReplyObject(rep);
            goto err_ctx;
        }
        pthread_mutex_lock(&r->sha_mu);
        if (!atomic_load(&r->sha_ready))
            memcpy(r->sha[i], rep->str, 41);
        pthread_mutex_unlock(&r->sha_mu);
        freeReplyObject(rep);
    }
    atomic_store(&r->sha_ready, true);
    atomic_store(&n->backoff_ms, 0);
    return c;
err_ctx:
    if (c)
        redisFree(c);
    return NULL;
}

/* Locks a connection of n and makes sure it is open. -ENOTCONN while n is down.
 * *reused_p: it was open before (it may have died since, e.g. Redis restarted). */
static int conn_acquire(struct pf_redis *r, struct rnode *n, struct rconn **rc_p, bool *reused_p)
{
    if (pf_now_ns() < atomic_load(&n->down_until_ns))
        return -ENOTCONN;
    struct rconn *rc = &n->conns[atomic_fetch_add(&n->rr, 1) % NCONN];
    pthread_mutex_lock(&rc->mu);
    uint32_t gen = atomic_load(&n->gen);
    if (rc->c && (rc->c->err || rc->gen != gen)) {
        redisFree(rc->c);
        rc->c = NULL;
    }
    *reused_p = rc->c != NULL;
    if (!rc->c) {
        rc->c = conn_open(r, n);
        if (!rc->c) {
            pthread_mutex_unlock(&rc->mu);
            mark_down(r, n);
            return -ENOTCONN;
        }
        rc->gen = gen;
    }
    *rc_p = rc;
    return 0;
}

static void conn_release(struct rconn *rc, bool broken)
{
    if (broken && rc->c) {
        redisFree(rc->c);
        rc->c = NULL;
    }
    pthread_mutex_unlock(&rc->mu);
}

/* ------------------------------------------------------------------ slot map */

/* Asks node (host, port) for CLUSTER SLOTS and installs the map. */
static int refresh_from(struct pf_redis *r, const char *host, int port)
{
    struct rnode tmp = {.host = (char *)host, .port = port};
    redisContext *c = conn_open(r, &tmp);
    if (!c)
        return -ENOTCONN;
    const char *av[2] = {"CLUSTER", "SLOTS"};
    size_t al[2] = {7, 5};
    redisReply *rep = cmd_argv(c, 2, av, al);
    int rc = 0;
    if (!rep) {
        rc = -ENOTCONN;
        goto out;
    }
    int16_t *map = malloc(sizeof(int16_t) * NSLOTS);
    if (!map) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < NSLOTS; i++)
        map[i] = -1;
    pthread_rwlock_wrlock(&r->lock);
    if (rep->type == REDIS_REPLY_ERROR && strstr(rep->str, "cluster support disabled")) {
        int idx = node_get_locked(r, host, port);
        if (idx < 0) {
            rc = idx;
        } else {
            for (size_t i = 0; i < NSLOTS; i++)
                map[i] = (int16_t)idx;
        }
    } else if (rep->type == REDIS_REPLY_ARRAY) {
        for (size_t e = 0; e < rep->elements && !rc; e++) {
            redisReply *ent = rep->element[e];
            if (ent->type != REDIS_REPLY_ARRAY || ent->elements < 3 ||
                ent->element[2]->type != REDIS_REPLY_ARRAY || ent->element[2]->elements < 2) {
                rc = -EPROTO;
                break;
            }
            long long lo = ent->element[0]->integer, hi = ent->element[1]->integer;
            redisReply *m = ent->element[2];
            const char *h = m->element[0]->type == REDIS_REPLY_STRING && m->element[0]->len
                                ? m->element[0]->str
                                : host;
            int idx = node_get_locked(r, h, (int)m->element[1]->integer);
            if (idx < 0) {
                rc = idx;
                break;
            }
            for (long long s = lo; s <= hi && s < NSLOTS; s++)
                if (s >= 0)
                    map[s] = (int16_t)idx;
        }
    } else {
        rc = -EPROTO;
    }
    if (!rc) {
        memcpy(r->slot_node, map, sizeof(int16_t) * NSLOTS);
        r->nmasters = 0;
        bool seen[MAX_NODES] = {false};
        for (size_t i = 0; i < NSLOTS; i++)
            if (map[i] >= 0 && !seen[map[i]]) {
                seen[map[i]] = true;
                r->masters[r->nmasters++] = map[i];
            }
        r->map_ok = true;
    }
    pthread_rwlock_unlock(&r->lock);
    free(map);
    if (rc)
        pf_log_ratelimited(PF_LOG_WARN, 1000, "redis %s:%d: unusable CLUSTER SLOTS answer (%d)",
                           host, port, rc);
out:
    if (rep)
        freeReplyObject(rep);
    redisFree(c);
    return rc;
}

/* Refreshes the slot map from any known node, then the seeds. One refresh at a time; a
 * caller that waited for another's refresh returns its result. */
static int refresh_map(struct pf_redis *r)
{
    pthread_mutex_lock(&r->refresh_mu);
    int rc = -ENOTCONN;
    uint64_t now = pf_now_ns();
    if (now < r->refresh_after_ns) {
        /* refreshed (or failed to) a moment ago: answer with the map we have */
        pthread_rwlock_rdlock(&r->lock);
        rc = r->map_ok ? 0 : -ENOTCONN;
        pthread_rwlock_unlock(&r->lock);
        pthread_mutex_unlock(&r->refresh_mu);
        return rc;
    }
    pthread_rwlock_rdlock(&r->lock);
    size_t nn = r->nnodes;
    pthread_rwlock_unlock(&r->lock);
    for (size_t i = 0; i < nn && rc; i++) {
        struct rnode *n = r->nodes[i];
        if (pf_now_ns() < atomic_load(&n->down_until_ns))
            continue;
        rc = refresh_from(r, n->host, n->port);
        if (rc == -ENOTCONN)
            mark_down(r, n);
    }
    for (size_t i = 0; i < r->nseeds && rc; i++)
        rc = refresh_from(r, r->seed_host[i], r->seed_port[i]);
    /* at most one refresh per 100 ms; while nothing answers, back off to 2 s */
    r->refresh_backoff_ms =
        rc ? (r->refresh_backoff_ms ? r->refresh_backoff_ms * 2 : BACKOFF_MIN) : BACKOFF_MIN;
    if (r->refresh_backoff_ms > BACKOFF_MAX)
        r->refresh_backoff_ms = BACKOFF_MAX;
    r->refresh_after_ns = pf_now_ns() + (uint64_t)r->refresh_backoff_ms * PF_NS_PER_MS;
    pthread_mutex_unlock(&r->refresh_mu);
    return rc;
}

static int ensure_map(struct pf_redis *r)
{
    pthread_rwlock_rdlock(&r->lock);
    bool ok = r->map_ok;
    pthread_rwlock_unlock(&r->lock);
    return ok ? 0 : refresh_map(r);
}

/* MOVED/ASK "<slot> <host>:<port>" -> node index (created when new), slot. */
static int redirect_target(struct pf_redis *r, const char *msg, bool moved, int *slot_p)
{
    const char *p = strchr(msg, ' ');
    if (!p)
        return -EPROTO;
    int slot = atoi(p + 1);
    const char *hp = strchr(p + 1, ' ');
    if (!hp || slot < 0 || slot >= NSLOTS)
        return -EPROTO;
    hp++;
    char *host;
    int port;
    if (parse_hostport(hp, strlen(hp), &host, &port))
        return -EPROTO;
    pthread_rwlock_wrlock(&r->lock);
    int idx = node_get_locked(r, host, port);
    if (idx >= 0 && moved)
        r->slot_node[slot] = (int16_t)idx;
    pthread_rwlock_unlock(&r->lock);
    free(host);
    *slot_p = slot;
    return idx;
}

static bool is_err(const redisReply *rep, const char *prefix)
{
    return rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, prefix, strlen(prefix)) == 0;
}

/* ------------------------------------------------------------------ exec */

/* Sends cmds[idx[0..k)] to node, pipelined. Redirected commands get target[i] (ASK) or
 * their slot remapped (MOVED) and are left without a reply; *again_p counts them. */
static int run_group_once(struct pf_redis *r, struct rnode *n, struct pf_redis_cmd *cmds,
                          const size_t *idx, size_t k, int *ask, size_t *again_p)
{
    struct rconn *rc;
    bool reused;
    int err = conn_acquire(r, n, &rc, &reused);
    if (err)
        return err;
    uint64_t t0 = pf_now_ns();
    redisContext *c = rc->c;
    static const char *asking = "ASKING";
    static const size_t asking_len = 6;
    for (size_t j = 0; j < k; j++) {
        struct pf_redis_cmd *cmd = &cmds[idx[j]];
        if (ask[idx[j]] >= 0 && redisAppendCommandArgv(c, 1, &asking, &asking_len) != REDIS_OK)
            goto err_io;
        if (redisAppendCommandArgv(c, cmd->argc, cmd->argv, cmd->argvlen) != REDIS_OK)
            goto err_io;
    }
    for (size_t j = 0; j < k; j++) {
        size_t i = idx[j];
        redisReply *rep;
        if (ask[i] >= 0) {
            if (redisGetReply(c, (void **)&rep) != REDIS_OK)
                goto err_io;
            freeReplyObject(rep);
            ask[i] = -1;
        }
        if (redisGetReply(c, (void **)&rep) != REDIS_OK)
            goto err_io;
        int slot;
        if (is_err(rep, "MOVED ") || is_err(rep, "ASK ")) {
            bool moved = rep->str[0] == 'M';
            count_err(r, moved ? "moved" : "ask");
            int t = redirect_target(r, rep->str, moved, &slot);
            freeReplyObject(rep);
            if (t < 0) {
                err = -EPROTO;
                continue;
            }
            if (!moved)
                ask[i] = t;
            (*again_p)++;
            continue;
        }
        if (is_err(rep, "NOSCRIPT")) {
            /* answered as is; the connection reconnects (reloading the scripts) next time */
            count_err(r, "noscript");
            rc->c->err = REDIS_ERR_OTHER;
        }
        if (is_err(rep, "CLUSTERDOWN") || is_err(rep, "TRYAGAIN") || is_err(rep, "LOADING") ||
            is_err(rep, "MASTERDOWN")) {
            count_err(r, "unavailable");
            freeReplyObject(rep);
            err = -ENOTCONN;
            continue;
        }
        cmds[i].reply = rep;
    }
    pf_metric_add(r->c_rtt, 1);
    pf_metric_add(r->c_cmds, (double)k);
    pf_metric_observe(r->h_lat, (double)(pf_now_ns() - t0) / 1e9);
    conn_release(rc, false);
    return err;
err_io:
    count_err(r, "io");
    pf_log_ratelimited(PF_LOG_WARN, 1000, "redis %s:%d: %s", n->host, n->port, c->errstr);
    conn_release(rc, true);
    for (size_t j = 0; j < k; j++)
        pf_redis_cmds_reset(&cmds[idx[j]], 1);
    if (reused) {
        atomic_fetch_add(&n->gen, 1); /* its siblings are probably dead too */
        return -EPIPE;
    }
    mark_down(r, n);
    return -ENOTCONN;
}

/* A broken idle connection (Redis restarted since it was opened) gets one retry on a fresh
 * one; a fresh connection that fails marks the node down. */
static int run_group(struct pf_redis *r, struct rnode *n, struct pf_redis_cmd *cmds,
                     const size_t *idx, size_t k, int *ask, size_t *again_p)
{
    size_t again0 = *again_p;
    int rc = run_group_once(r, n, cmds, idx, k, ask, again_p);
    if (rc == -EPIPE) {
        *again_p = again0;
        rc = run_group_once(r, n, cmds, idx, k, ask, again_p);
    }
    return rc == -EPIPE ? -ENOTCONN : rc;
}

void pf_redis_cmds_reset(struct pf_redis_cmd *cmds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (cmds[i].reply)
            freeReplyObject(cmds[i].reply);
        cmds[i].reply = NULL;
    }
}

int pf_redis_exec(struct pf_redis *r, struct pf_redis_cmd *cmds, size_t n)
{
    if (n == 0)
        return 0;
    int rc = ensure_map(r);
    if (rc)
        return rc == -ENOMEM ? rc : -ENOTCONN;
    size_t *idx = malloc(n * sizeof(*idx) * 2);
    int *ask = malloc(n * sizeof(*ask));
    int16_t *tgt = malloc(n * sizeof(*tgt));
    if (!idx || !ask || !tgt) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        ask[i] = -1;
        cmds[i].reply = NULL;
    }
    bool refreshed = false;
    for (int round = 0; round <= MAX_REDIRECT; round++) {
        /* targets of the commands still without a reply */
        size_t pend = 0;
        pthread_rwlock_rdlock(&r->lock);
        for (size_t i = 0; i < n; i++) {
            if (cmds[i].reply)
                continue;
            tgt[i] = ask[i] >= 0 ? (int16_t)ask[i] : r->slot_node[cmds[i].slot];
            idx[pend++] = i;
        }
        pthread_rwlock_unlock(&r->lock);
        if (pend == 0)
            goto out;
        if (round == MAX_REDIRECT) {
            count_err(r, "redirect_loop");
            rc = -EPROTO;
            break;
        }
        /* one group per node, in the order of first appearance */
        size_t *grp = idx + n, again = 0;
        bool unmapped = false;
        for (size_t a = 0; a < pend && !rc; a++) {
            int16_t t = tgt[idx[a]];
            if (t == -2)
                continue; /* already sent in this round */
            if (t < 0) {
                unmapped = true;
                continue;
            }
            size_t k = 0;
            for (size_t b = a; b < pend; b++)
                if (tgt[idx[b]] == t) {
                    grp[k++] = idx[b];
                    tgt[idx[b]] = -2;
                }
            pthread_rwlock_rdlock(&r->lock);
            struct rnode *node = r->nodes[t];
            pthread_rwlock_unlock(&r->lock);
            rc = run_group(r, node, cmds, grp, k, ask, &again);
        }
        if (rc == -ENOTCONN && !refreshed) {
            /* the topology may have changed (failover): one refresh, then fail fast */
            refreshed = true;
            refresh_map(r);
        }
        if (rc)
            break;
        if (unmapped) {
            if (refreshed) {
                rc = -ENOTCONN;
                break;
            }
            refreshed = true;
            rc = refresh_map(r);
            if (rc) {
                rc = -ENOTCONN;
                break;
            }
        }
    }
out:
    if (rc)
        pf_redis_cmds_reset(cmds, n);
    free(tgt);
    free(ask);
    free(idx);
    return rc;
}

size_t pf_redis_nmasters(struct pf_redis *r)
{
    ensure_map(r);
    pthread_rwlock_rdlock(&r->lock);
    size_t n = r->nmasters;
    pthread_rwlock_unlock(&r->lock);
    return n;
}

int pf_redis_exec_master(struct pf_redis *r, size_t i, int argc, const char **argv,
                         const size_t *argvlen, void **reply_p)
{
    pthread_rwlock_rdlock(&r->lock);
    struct rnode *n = i < r->nmasters ? r->nodes[r->masters[i]] : NULL;
    pthread_rwlock_unlock(&r->lock);
    if (!n)
        return -ENOENT;
    struct rconn *rc;
    bool reused;
    redisReply *rep = NULL;
    uint64_t t0 = 0;
    for (int attempt = 0; attempt < 2 && !rep; attempt++) {
        int err = conn_acquire(r, n, &rc, &reused);
        if (err)
            return err;
        t0 = pf_now_ns();
        rep = cmd_argv(rc->c, argc, argv, argvlen);
        if (!rep) {
            count_err(r, "io");
            conn_release(rc, true);
            if (!reused || attempt == 1) {
                mark_down(r, n);
                return -ENOTCONN;
            }
            atomic_fetch_add(&n->gen, 1);
        }
    }
    pf_metric_add(r->c_rtt, 1);
    pf_metric_add(r->c_cmds, 1);
    pf_metric_observe(r->h_lat, (double)(pf_now_ns() - t0) / 1e9);
    conn_release(rc, false);
    if (is_err(rep, "CLUSTERDOWN") || is_err(rep, "LOADING") || is_err(rep, "MASTERDOWN")) {
        freeReplyObject(rep);
        return -ENOTCONN;
    }
    *reply_p = rep;
    return 0;
}

const char *pf_redis_script_sha(struct pf_redis *r, size_t i)
{
    return i < r->nscripts && atomic_load(&r->sha_ready) ? r->sha[i] : NULL;
}

/* ------------------------------------------------------------------ lifecycle */

int pf_redis_open(const struct pf_redis_config *cfg, struct pf_redis **r_p)
{
    if (!cfg || !cfg->seeds || !*cfg->seeds || cfg->timeout_ms == 0 || cfg->nscripts > MAX_SCRIPTS)
        return -EINVAL;
    pthread_once(&tabs_once, tabs_init);
    struct pf_redis *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    int rc = -ENOMEM;
    r->timeout_ms = cfg->timeout_ms;
    pthread_rwlock_init(&r->lock, NULL);
    pthread_mutex_init(&r->refresh_mu, NULL);
    pthread_mutex_init(&r->sha_mu, NULL);
    for (size_t i = 0; i < NSLOTS; i++)
        r->slot_node[i] = -1;
    size_t cap = 1;
    for (const char *p = cfg->seeds; *p; p++)
        cap += *p == ',';
    r->seed_host = calloc(cap, sizeof(*r->seed_host));
    r->seed_port = calloc(cap, sizeof(*r->seed_port));
    r->scripts = calloc(cfg->nscripts + 1, sizeof(*r->scripts));
    if (!r->seed_host || !r->seed_port || !r->scripts)
        goto err;
    for (const char *p = cfg->seeds; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        rc = parse_hostport(p, len, &r->seed_host[r->nseeds], &r->seed_port[r->nseeds]);
        if (rc)
            goto err;
        r->nseeds++;
        p += len + (e ? 1 : 0);
    }
    rc = -ENOMEM;
    if ((cfg->password && !(r->password = strdup(cfg->password))) ||
        (cfg->user && !(r->user = strdup(cfg->user))))
        goto err;
    for (size_t i = 0; i < cfg->nscripts; i++, r->nscripts++)
        if (!(r->scripts[i] = strdup(cfg->scripts[i])))
            goto err;
    r->c_rtt = pf_metric_counter("pegaflow_metaserver_redis_round_trips",
                                 "Pipelined round trips to Redis nodes", "");
    r->c_cmds = pf_metric_counter("pegaflow_metaserver_redis_commands",
                                  "Commands sent to Redis (all round trips)", "");
    r->c_err = pf_metric_counter("pegaflow_metaserver_redis_errors",
                                 "Redis failures and redirects by kind", "kind");
    r->h_lat = pf_metric_histogram("pegaflow_metaserver_redis_round_trip_seconds",
                                   "Latency of one pipelined round trip to a Redis node", "",
                                   lat_buckets, sizeof(lat_buckets) / sizeof(lat_buckets[0]));
    *r_p = r;
    return 0;
err:
    pf_redis_close(r);
    return rc;
}

void pf_redis_close(struct pf_redis *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nnodes; i++) {
        struct rnode *n = r->nodes[i];
        for (int j = 0; j < NCONN; j++) {
            if (n->conns[j].c)
                redisFree(n->conns[j].c);
            pthread_mutex_destroy(&n->conns[j].mu);
        }
        free(n->host);
        free(n);
    }
    for (size_t i = 0; i < r->nseeds; i++)
        free(r->seed_host[i]);
    for (size_t i = 0; i < r->nscripts; i++)
        free(r->scripts[i]);
    free(r->scripts);
    free(r->seed_host);
    free(r->seed_port);
    if (r->password) /* secrets are wiped, not just freed */
        explicit_bzero(r->password, strlen(r->password));
    if (r->user)
        explicit_bzero(r->user, strlen(r->user));
    free(r->password);
    free(r->user);
    pthread_rwlock_destroy(&r->lock);
    pthread_mutex_destroy(&r->refresh_mu);
    pthread_mutex_destroy(&r->sha_mu);
    free(r);
}
