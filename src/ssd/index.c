/* SSD index: key -> entry with a two-phase state (WRITING -> COMMITTED), one ring and one
 * FIFO of entries (by logical start) per shard. Allocating ring space prunes, from the FIFO
 * front, every entry the new tail overtook, so the index never claims a block whose bytes
 * were overwritten. Entries carry the per-slot geometry, NUMA node and checksum needed to
 * rebuild the block. Every namespace keeps its live bytes (entry spans, either state) and its
 * entries by sequence number, for the tenants' SSD quotas (ssd_index_shed). Callers hold the
 * store lock. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ssd/ssd_internal.h"

int ssd_index_init(struct ssd_index *x, uint32_t nshards, uint64_t shard_cap, uint64_t ring_off)
{
    memset(x, 0, sizeof(*x));
    x->ring_off = ring_off;
    if (nshards == 0)
        return -EINVAL;
    x->shards = calloc(nshards, sizeof(*x->shards));
    if (!x->shards)
        return -ENOMEM;
    int rc = pf_htable_init(&x->table, 1024);
    if (rc) {
        free(x->shards);
        x->shards = NULL;
        return rc;
    }
    for (uint32_t i = 0; i < nshards; i++) {
        ssd_ring_init(&x->shards[i].ring, shard_cap);
        pf_list_init(&x->shards[i].fifo);
    }
    x->nshards = nshards;
    return 0;
}

/* The accounting of namespace ns, created when create (NULL on ENOMEM or when absent). */
static struct ssd_ns *ns_get(struct ssd_index *x, uint32_t ns, bool create)
{
    if (ns < x->nns && x->ns[ns])
        return x->ns[ns];
    if (!create)
        return NULL;
    if (ns >= x->nns) {
        uint32_t n = x->nns ? x->nns : 8;
        while (n <= ns)
            n *= 2;
        struct ssd_ns **v = realloc(x->ns, (size_t)n * sizeof(*v));
        if (!v)
            return NULL;
        memset(v + x->nns, 0, (size_t)(n - x->nns) * sizeof(*v));
        x->ns = v;
        x->nns = n;
    }
    struct ssd_ns *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    pf_list_init(&a->fifo);
    x->ns[ns] = a;
    return a;
}

static void ns_link(struct ssd_ns *a, struct ssd_entry *e)
{
    pf_list_add_tail(&a->fifo, &e->nsfifo);
    a->bytes += e->span;
    a->entries++;
}

static void entry_free(struct ssd_index *x, struct ssd_entry *e)
{
    pf_htable_remove(&x->table, &e->hnode);
    pf_list_del(&e->fifo);
    struct ssd_ns *a = ns_get(x, e->key.ns, false);
    if (a && pf_list_linked(&e->nsfifo)) {
        pf_list_del(&e->nsfifo);
        a->bytes -= e->span;
        a->entries--;
    }
    if (e->state == SSD_WRITING)
        x->nwriting--;
    else
        x->ncommitted--;
    free(e);
}

void ssd_index_destroy(struct ssd_index *x)
{
    for (uint32_t i = 0; x->shards && i < x->nshards; i++) {
        struct pf_list *pos, *tmp;
        pf_list_for_each_safe(pos, tmp, &x->shards[i].fifo)
        {
            entry_free(x, pf_list_entry(pos, struct ssd_entry, fifo));
        }
    }
    pf_htable_destroy(&x->table);
    for (uint32_t i = 0; i < x->nns; i++)
        free(x->ns[i]);
    free(x->ns);
    x->ns = NULL;
    x->nns = 0;
    free(x->shards);
    x->shards = NULL;
    x->nshards = 0;
}

struct ssd_entry *ssd_index_find(struct ssd_index *x, const struct pf_block_key *k)
{
    uint64_t h = pf_key_hash(k);
    struct pf_hnode *n;
    pf_htable_for_each_hash(&x->table, n, h)
    {
        struct ssd_entry *e = pf_container_of(n, struct ssd_entry, hnode);
        if (pf_key_eq(&e->key, k))
            return e;
    }
    return NULL;
}

int ssd_index_peek(const struct ssd_index *x, uint64_t len, uint32_t *shard_p, uint64_t *start_p,
                   uint64_t *tail_p)
{
    uint32_t sh = x->next_shard % x->nshards;
    int rc = ssd_ring_plan(&x->shards[sh].ring, len, start_p, tail_p);
    if (rc)
        return rc;
    *shard_p = sh;
    return 0;
}

/* Drops every entry of shard sh that starts below its ring's tail. */
static void prune(struct ssd_index *x, uint32_t sh)
{
    struct ssd_index_shard *s = &x->shards[sh];
    uint64_t tail = ssd_ring_tail(&s->ring);
    while (!pf_list_empty(&s->fifo)) {
        struct ssd_entry *e = pf_list_first(&s->fifo, struct ssd_entry, fifo);
        if (e->start >= tail)
            break;
        if (e->state == SSD_WRITING)
            x->overtaken++;
        entry_free(x, e);
    }
}

void ssd_index_drop(struct ssd_index *x, struct ssd_entry *e)
{
    entry_free(x, e);
}

int ssd_index_begin(struct ssd_index *x, const struct pf_block *b, const struct ssd_rec_slot *slots,
                    uint32_t hdr_len, uint64_t len, uint64_t seq, struct ssd_place *p_p)
{
    struct pf_block_key key = pf_block_key(b);
    if (ssd_index_find(x, &key))
        return -EEXIST;
    uint32_t sh = x->next_shard % x->nshards;
    uint64_t start, tail;
    uint64_t total = hdr_len ? ssd_rec_span(hdr_len, len) : len;
    int rc = ssd_ring_plan(&x->shards[sh].ring, total, &start, &tail);
    if (rc)
        return rc;
    struct ssd_ns *a = ns_get(x, key.ns, true);
    struct ssd_entry *e =
        a ? calloc(1, sizeof(*e) + (size_t)b->nslots * sizeof(e->slots[0])) : NULL;
    if (!e)
        return -ENOMEM;
    uint64_t off;
    ssd_ring_alloc(&x->shards[sh].ring, total, &start, &off);
    off += x->ring_off + hdr_len;
    x->next_shard = (sh + 1) % x->nshards;
    prune(x, sh);
    e->key = key;
    e->shard = sh;
    e->state = SSD_WRITING;
    e->nslots = b->nslots;
    e->start = start;
    e->off = off;
    e->len = len;
    e->seq = seq;
    e->fp = ssd_layout_fp(slots, b->nslots);
    e->span = total;
    for (uint16_t i = 0; i < b->nslots; i++)
        e->slots[i] = (struct ssd_slot_meta){
            .checksum = slots[i].checksum,
            .seg_len = slots[i].seg_len,
            .seg_stride = slots[i].seg_stride,
            .numa = slots[i].numa,
            .nseg = slots[i].nseg,
            .has_checksum = 1,
        };
    pf_htable_insert(&x->table, &e->hnode, pf_key_hash(&e->key));
    pf_list_add_tail(&x->shards[sh].fifo, &e->fifo);
    ns_link(a, e);
    x->nwriting++;
    *p_p =
        (struct ssd_place){.shard = sh, .hdr_len = hdr_len, .start = start, .off = off, .len = len};
    return 0;
}

static struct ssd_entry *find_at(struct ssd_index *x, const struct pf_block_key *k,
                                 const struct ssd_place *p)
{
    struct ssd_entry *e = ssd_index_find(x, k);
    if (!e || e->shard != p->shard || e->start != p->start)
        return NULL;
    return e;
}

int ssd_index_commit(struct ssd_index *x, const struct pf_block_key *k, const struct ssd_place *p)
{
    struct ssd_entry *e = find_at(x, k, p);
    if (!e || e->state != SSD_WRITING)
        return -ENOENT;
    e->state = SSD_COMMITTED;
    x->nwriting--;
    x->ncommitted++;
    return 0;
}

bool ssd_index_remove(struct ssd_index *x, const struct pf_block_key *k, const struct ssd_place *p)
{
    struct ssd_entry *e = find_at(x, k, p);
    if (!e)
        return false;
    entry_free(x, e);
    return true;
}

size_t ssd_index_prefix(struct ssd_index *x, const struct pf_block_key *keys, size_t n)
{
    size_t i = 0;
    for (; i < n; i++) {
        struct ssd_entry *e = ssd_index_find(x, &keys[i]);
        if (!e || e->state != SSD_COMMITTED || !ssd_ring_valid(&x->shards[e->shard].ring, e->start))
            break;
    }
    return i;
}

bool ssd_index_intact(const struct ssd_index *x, const struct ssd_place *p)
{
    return p->shard < x->nshards && ssd_ring_valid(&x->shards[p->shard].ring, p->start);
}

int ssd_index_insert(struct ssd_index *x, struct ssd_entry *e)
{
    struct ssd_ns *a = ns_get(x, e->key.ns, true);
    if (!a)
        return -ENOMEM;
    pf_htable_insert(&x->table, &e->hnode, pf_key_hash(&e->key));
    pf_list_add_tail(&x->shards[e->shard].fifo, &e->fifo);
    ns_link(a, e);
    x->ncommitted++;
    return 0;
}

static int by_seq(const void *pa, const void *pb)
{
    const struct ssd_entry *a = *(struct ssd_entry *const *)pa, *b = *(struct ssd_entry *const *)pb;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

int ssd_index_ns_sort(struct ssd_index *x)
{
    for (uint32_t i = 0; i < x->nns; i++) {
        struct ssd_ns *a = x->ns[i];
        if (!a || a->entries < 2)
            continue;
        struct ssd_entry **v = malloc((size_t)a->entries * sizeof(*v));
        if (!v)
            return -ENOMEM;
        size_t n = 0;
        struct pf_list *pos, *tmp;
        pf_list_for_each_safe(pos, tmp, &a->fifo)
        {
            v[n++] = pf_list_entry(pos, struct ssd_entry, nsfifo);
            pf_list_del(pos);
        }
        qsort(v, n, sizeof(*v), by_seq);
        for (size_t k = 0; k < n; k++)
            pf_list_add_tail(&a->fifo, &v[k]->nsfifo);
        free(v);
    }
    return 0;
}

uint64_t ssd_index_ns_bytes(const struct ssd_index *x, uint32_t ns)
{
    return ns < x->nns && x->ns[ns] ? x->ns[ns]->bytes : 0;
}

/* The oldest COMMITTED entry of namespace a (NULL when none). */
static struct ssd_entry *oldest_committed(struct ssd_ns *a)
{
    struct pf_list *pos, *tmp;
    pf_list_for_each_safe(pos, tmp, &a->fifo)
    {
        struct ssd_entry *e = pf_list_entry(pos, struct ssd_entry, nsfifo);
        if (e->state == SSD_COMMITTED)
            return e;
    }
    return NULL;
}

uint64_t ssd_index_shed(struct ssd_index *x, const uint32_t *ns, size_t nns, uint64_t goal,
                        uint64_t *bytes_p)
{
    uint64_t n = 0, bytes = 0, used = 0;
    for (size_t i = 0; i < nns; i++)
        used += ssd_index_ns_bytes(x, ns[i]);
    while (used > goal) {
        struct ssd_entry *victim = NULL;
        for (size_t i = 0; i < nns; i++) {
            struct ssd_ns *a = ns_get(x, ns[i], false);
            struct ssd_entry *e = a ? oldest_committed(a) : NULL;
            if (e && (!victim || e->seq < victim->seq))
                victim = e;
        }
        if (!victim)
            break;
        used -= victim->span;
        bytes += victim->span;
        n++;
        entry_free(x, victim);
    }
    if (bytes_p)
        *bytes_p = bytes;
    return n;
}
