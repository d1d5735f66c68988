/* Test double of libpegaflow for the Python binding's marshalling tests.
 *
 * Compiled against src/client/pegaflow.h (so a signature drift is a compile error), it
 * implements every pf_client_* Engine call by printing the arguments it received into a
 * text log (rec_take() returns and clears it), and answers with a configurable return
 * code / gRPC status (rec_fail). pf_simkv_* are real POSIX shared memory so the sim
 * adapter can be exercised; IpcTensor builders return a recognisable text. Not a server:
 * it checks that what Python passes through ctypes is what C reads. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "pegaflow.h"

static char logbuf[1 << 16];
static size_t loglen;
static int fail_rc, fail_code, delay_ms;
static char fail_msg[256];
static __thread int last_code;
static __thread char last_msg[256];

static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(logbuf + loglen, sizeof(logbuf) - loglen, fmt, ap);
    va_end(ap);
    if (n > 0)
        loglen += (size_t)n < sizeof(logbuf) - loglen ? (size_t)n : sizeof(logbuf) - loglen - 1;
}

static void hex(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        say("%02x", p[i]);
}

const char *rec_take(void)
{
    static char out[sizeof(logbuf)];
    memcpy(out, logbuf, loglen + 1);
    loglen = 0;
    logbuf[0] = 0;
    return out;
}

/* Every later pf_client_health blocks this long (GIL-release test). */
void rec_delay(int ms)
{
    delay_ms = ms;
}

void rec_fail(int rc, int code, const char *msg)
{
    fail_rc = rc;
    fail_code = code;
    snprintf(fail_msg, sizeof(fail_msg), "%s", msg ? msg : "");
}

static int answer(void)
{
    if (fail_rc) {
        last_code = fail_code;
        snprintf(last_msg, sizeof(last_msg), "%s", fail_msg);
        return fail_rc;
    }
    return 0;
}

struct pf_client {
    char target[128];
};

const char *pf_client_version(void)
{
    return "0.23.12";
}
int pf_last_error_code(void)
{
    return last_code;
}
const char *pf_last_error_message(void)
{
    return last_msg;
}

int pf_client_connect(const char *target, struct pf_client **c_p)
{
    struct pf_client *c = calloc(1, sizeof(*c));
    snprintf(c->target, sizeof(c->target), "%s", target);
    *c_p = c;
    say("connect %s\n", target);
    return 0;
}

void pf_client_close(struct pf_client *c)
{
    free(c);
}

int pf_client_health(struct pf_client *c, uint64_t t)
{
    say("health %s t=%llu\n", c->target, (unsigned long long)t);
    if (delay_ms)
        usleep((useconds_t)delay_ms * 1000);
    return answer();
}

int pf_client_shutdown(struct pf_client *c, uint64_t t)
{
    say("shutdown t=%llu\n", (unsigned long long)t);
    return answer();
}

int pf_client_register(struct pf_client *c, const struct pf_register_args *a, uint64_t t)
{
    (void)c;
    say("register inst=%s ns=%s tp=%u/%u world=%u pp=%u dev=%d mode=%d pf=%d ver=%s n=%zu t=%llu\n",
        a->instance_id, a->namespace_, a->tp_rank, a->tp_size, a->world_size, a->pp_rank,
        a->device_id, a->transfer_mode, a->page_first,
        a->client_version ? a->client_version : "(null)", a->nlayers, (unsigned long long)t);
    for (size_t i = 0; i < a->nlayers; i++) {
        const struct pf_layer_desc *l = &a->layers[i];
        say(" layer %s blocks=%llu bpb=%llu kvs=%llu seg=%u grp=%u ipc=", l->name,
            (unsigned long long)l->num_blocks, (unsigned long long)l->bytes_per_block,
            (unsigned long long)l->kv_stride_bytes, l->segments, l->group_id);
        hex(l->ipc, l->ipc_len);
        say("\n");
    }
    return answer();
}

static void hashes(const uint8_t *h, const uint32_t *lens, uint32_t hlen, size_t n)
{
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t l = lens ? lens[i] : hlen;
        say(" ");
        hex(h + off, l);
        off += l;
    }
}

int pf_client_save(struct pf_client *c, const char *inst, uint32_t tp, uint32_t pp, int32_t dev,
                   const struct pf_save_layer *layers, size_t n, uint64_t t)
{
    (void)c;
    say("save inst=%s tp=%u pp=%u dev=%d n=%zu t=%llu\n", inst, tp, pp, dev, n,
        (unsigned long long)t);
    for (size_t i = 0; i < n; i++) {
        const struct pf_save_layer *l = &layers[i];
        say(" layer %s lens=%s ids=", l->name, l->hash_lens ? "array" : "uniform");
        for (size_t j = 0; j < l->n; j++)
            say("%s%u", j ? "," : "", l->block_ids[j]);
        say(" hashes=");
        hashes(l->hashes, l->hash_lens, l->hash_len, l->n);
        say("\n");
    }
    return answer();
}

int pf_client_query(struct pf_client *c, const char *inst, const char *req, const uint8_t *h,
                    const uint32_t *lens, uint32_t hlen, size_t n, int wfp, uint32_t group,
                    struct pf_query_result *out, uint32_t *pos, size_t cap, uint64_t t)
{
    (void)c;
    say("query inst=%s req=%s n=%zu wfp=%d group=%u cap=%zu t=%llu hashes=", inst, req, n, wfp,
        group, cap, (unsigned long long)t);
    hashes(h, lens, hlen, n);
    say("\n");
    int rc = answer();
    if (rc)
        return rc;
    memset(out, 0, sizeof(*out));
    if (strcmp(req, "loading") == 0) {
        out->loading = 1;
        return 0;
    }
    out->num_hit_blocks = (uint32_t)(n > 0 ? n - 1 : 0);
    if (out->num_hit_blocks) {
        out->lease_len = PF_LEASE_LEN;
        for (int i = 0; i < PF_LEASE_LEN; i++)
            out->lease[i] = (uint8_t)(0xA0 + i);
    }
    out->nhit_positions = out->num_hit_blocks;
    for (size_t i = 0; i < cap && i < out->num_hit_blocks; i++)
        pos[i] = (uint32_t)(10 + i);
    return 0;
}

int pf_client_release(struct pf_client *c, const uint8_t *lease, uint32_t len, uint64_t t)
{
    (void)c;
    say("release t=%llu lease=", (unsigned long long)t);
    hex(lease, len);
    say("\n");
    return answer();
}

int pf_client_load(struct pf_client *c, const char *inst, uint32_t tp, int32_t dev, const char *shm,
                   const char *const *names, const size_t *gsizes, size_t ng,
                   const struct pf_load_item *items, size_t ni, uint64_t t)
{
    (void)c;
    say("load inst=%s tp=%u dev=%d shm=%s groups=%zu items=%zu t=%llu\n", inst, tp, dev, shm, ng,
        ni, (unsigned long long)t);
    size_t k = 0;
    for (size_t g = 0; g < ng; g++) {
        say(" group%zu", g);
        for (size_t j = 0; j < gsizes[g]; j++)
            say(" %s", names[k++]);
        say("\n");
    }
    for (size_t i = 0; i < ni; i++) {
        say(" item lease=");
        hex(items[i].lease, items[i].lease_len);
        size_t off = 0;
        for (size_t g = 0; g < ng; g++) {
            say(" g%zu=", g);
            for (size_t j = 0; j < items[i].group_counts[g]; j++)
                say("%s%lld", j ? "," : "", (long long)items[i].targets[off + j]);
            off += items[i].group_counts[g];
        }
        say("\n");
    }
    return answer();
}

int pf_client_unregister(struct pf_client *c, const char *inst, uint64_t t)
{
    (void)c;
    say("unregister inst=%s t=%llu\n", inst, (unsigned long long)t);
    return answer();
}

struct pf_session {
    int alive;
};

int pf_client_session_open(struct pf_client *c, const char *inst, const char *ns, uint32_t tp,
                           uint32_t world, uint64_t t, struct pf_session **s_p)
{
    (void)c;
    say("session inst=%s ns=%s tp=%u world=%u t=%llu\n", inst, ns, tp, world,
        (unsigned long long)t);
    int rc = answer();
    if (rc)
        return rc;
    *s_p = calloc(1, sizeof(**s_p));
    (*s_p)->alive = 1;
    return 0;
}

int pf_client_watch_open(struct pf_client *c, const char *inst, uint64_t t,
                         struct pf_session **s_p)
{
    (void)c;
    say("watch inst=%s t=%llu\n", inst ? inst : "", (unsigned long long)t);
    int rc = answer();
    if (rc)
        return rc;
    *s_p = calloc(1, sizeof(**s_p));
    (*s_p)->alive = 1;
    return 0;
}

void pf_client_reconnect(struct pf_client *c)
{
    say("reconnect %s\n", c->target);
}

int pf_client_session_alive(struct pf_session *s)
{
    return s->alive;
}
void pf_client_session_close(struct pf_session *s)
{
    say("session_close\n");
    free(s);
}

/* load state: not modelled (the Python ShmLoadState is used when these fail) */
int pf_loadstate_create(struct pf_loadstate **ls_p)
{
    (void)ls_p;
    last_code = 13;
    snprintf(last_msg, sizeof(last_msg), "recorder has no load state");
    return -ENOSYS;
}
const char *pf_loadstate_name(const struct pf_loadstate *ls)
{
    (void)ls;
    return "";
}
int64_t pf_loadstate_get(const struct pf_loadstate *ls)
{
    (void)ls;
    return 0;
}
int64_t pf_loadstate_wait(const struct pf_loadstate *ls, uint64_t t)
{
    (void)ls;
    (void)t;
    return 0;
}
int64_t pf_loadstate_cancel(struct pf_loadstate *ls)
{
    (void)ls;
    return 2;
}
void pf_loadstate_destroy(struct pf_loadstate *ls)
{
    (void)ls;
}

static int text(const char *s, uint8_t *buf, size_t cap, size_t *len_p)
{
    size_t n = strlen(s);
    *len_p = n;
    if (n > cap)
        return -ENOSPC;
    memcpy(buf, s, n);
    return 0;
}

int pf_client_ipc_cuda(const uint8_t uuid[16], const uint8_t handle[64], uint64_t off,
                       uint64_t size, uint8_t *buf, size_t cap, size_t *len_p)
{
    char s[400];
    int n = snprintf(s, sizeof(s), "cuda:");
    for (int i = 0; i < 16; i++)
        n += snprintf(s + n, sizeof(s) - n, "%02x", uuid[i]);
    n += snprintf(s + n, sizeof(s) - n, ":");
    for (int i = 0; i < 64; i++)
        n += snprintf(s + n, sizeof(s) - n, "%02x", handle[i]);
    snprintf(s + n, sizeof(s) - n, ":%llu:%llu", (unsigned long long)off, (unsigned long long)size);
    return text(s, buf, cap, len_p);
}

int pf_client_ipc_sim(const char *name, int dev, uint64_t off, uint64_t size, uint8_t *buf,
                      size_t cap, size_t *len_p)
{
    char s[400];
    snprintf(s, sizeof(s), "sim:%s:%d:%llu:%llu", name, dev, (unsigned long long)off,
             (unsigned long long)size);
    return text(s, buf, cap, len_p);
}

struct pf_simkv {
    char name[64];
    void *p;
    uint64_t size;
    int dev;
};

int pf_simkv_create(uint64_t bytes, int dev, struct pf_simkv **kv_p)
{
    static int seq;
    struct pf_simkv *kv = calloc(1, sizeof(*kv));
    snprintf(kv->name, sizeof(kv->name), "/pf_rec_%d_%d", (int)getpid(), ++seq);
    int fd = shm_open(kv->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)bytes)) {
        free(kv);
        return -errno;
    }
    kv->p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    kv->size = bytes;
    kv->dev = dev;
    *kv_p = kv;
    return 0;
}

void *pf_simkv_ptr(const struct pf_simkv *kv)
{
    return kv->p;
}
uint64_t pf_simkv_size(const struct pf_simkv *kv)
{
    return kv->size;
}
const char *pf_simkv_name(const struct pf_simkv *kv)
{
    return kv->name;
}

int pf_simkv_ipc(const struct pf_simkv *kv, uint64_t off, uint64_t size, uint8_t *buf, size_t cap,
                 size_t *len_p)
{
    if (off + size > kv->size)
        return -EINVAL;
    return pf_client_ipc_sim(kv->name, kv->dev, off, size, buf, cap, len_p);
}

void pf_simkv_destroy(struct pf_simkv *kv)
{
    if (!kv)
        return;
    munmap(kv->p, kv->size);
    shm_unlink(kv->name);
    free(kv);
}
