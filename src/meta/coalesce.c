/* Coalescing of queued MetaServer commands (pure; used by the client thread, unit-tested
 * on its own).
 *
 * Every (namespace, hash) seen gets one slot in an open-addressing table of key indices;
 * the slot keeps the key's last operation (last write wins) and the keys stay in order of
 * first appearance. The survivors are then laid out group by group — inserts of each
 * namespace, then removes of each namespace — in one hash array, and cut into batches of
 * at most max_chunk hashes. Nothing is copied: batches point at the commands' hashes. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "pf/meta_client.h"

struct ckey {
    const struct pf_meta_hash *h;
    uint32_t ns;
    uint8_t op;
};

void pf_meta_plan_free(struct pf_meta_plan *plan)
{
    if (!plan)
        return;
    free(plan->batches);
    free(plan->hashes);
    memset(plan, 0, sizeof(*plan));
}

int pf_meta_coalesce(const struct pf_meta_cmd *cmds, size_t ncmds, size_t max_chunk,
                     struct pf_meta_plan *plan_p)
{
    if (max_chunk == 0)
        return -EINVAL;
    struct pf_meta_plan plan = {0};
    size_t total = 0;
    for (size_t i = 0; i < ncmds; i++)
        total += cmds[i].n;
    if (total == 0) {
        *plan_p = plan;
        return 0;
    }
    int rc = -ENOMEM;
    size_t tsize = 16;
    while (tsize < total * 2)
        tsize <<= 1;
    uint32_t *table = malloc(tsize * sizeof(*table));
    struct ckey *keys = malloc(total * sizeof(*keys));
    uint32_t *cmd_ns = malloc((ncmds ? ncmds : 1) * sizeof(*cmd_ns));
    const char **nss = malloc((ncmds ? ncmds : 1) * sizeof(*nss));
    size_t *counts = NULL;
    if (!table || !keys || !cmd_ns || !nss)
        goto out;
    memset(table, 0xff, tsize * sizeof(*table));

    /* namespaces in order of first appearance (few per round: a linear scan per command) */
    size_t nns = 0;
    for (size_t i = 0; i < ncmds; i++) {
        size_t j;
        for (j = 0; j < nns && strcmp(nss[j], cmds[i].ns) != 0; j++)
            ;
        if (j == nns)
            nss[nns++] = cmds[i].ns;
        cmd_ns[i] = (uint32_t)j;
    }

    size_t nkeys = 0, mask = tsize - 1;
    for (size_t i = 0; i < ncmds; i++) {
        for (size_t k = 0; k < cmds[i].n; k++) {
            const struct pf_meta_hash *h = &cmds[i].hashes[k];
            uint64_t hv = XXH3_64bits_withSeed(h->data, h->len, cmd_ns[i]);
            size_t p = hv & mask;
            for (;;) {
                uint32_t ki = table[p];
                if (ki == UINT32_MAX) {
                    table[p] = (uint32_t)nkeys;
                    keys[nkeys].h = h;
                    keys[nkeys].ns = cmd_ns[i];
                    keys[nkeys].op = (uint8_t)cmds[i].op;
                    nkeys++;
                    break;
                }
                struct ckey *c = &keys[ki];
                if (c->ns == cmd_ns[i] && c->h->len == h->len &&
                    memcmp(c->h->data, h->data, h->len) == 0) {
                    c->op = (uint8_t)cmds[i].op; /* last write wins */
                    break;
                }
                p = (p + 1) & mask;
            }
        }
    }

    /* group sizes: index = (op == REMOVE) * nns + ns */
    counts = calloc(2 * nns, sizeof(*counts));
    if (!counts)
        goto out;
    for (size_t i = 0; i < nkeys; i++)
        counts[(keys[i].op == PF_META_OP_REMOVE) * nns + keys[i].ns]++;
    size_t nbatches = 0;
    for (size_t g = 0; g < 2 * nns; g++)
        nbatches += (counts[g] + max_chunk - 1) / max_chunk;
    plan.hashes = malloc(nkeys * sizeof(*plan.hashes));
    plan.batches = malloc((nbatches ? nbatches : 1) * sizeof(*plan.batches));
    if (!plan.hashes || !plan.batches)
        goto out;
    /* counts -> start offsets */
    size_t off = 0;
    for (size_t g = 0; g < 2 * nns; g++) {
        size_t c = counts[g];
        counts[g] = off;
        off += c;
    }
    size_t *fill = counts;
    for (size_t i = 0; i < nkeys; i++)
        plan.hashes[fill[(keys[i].op == PF_META_OP_REMOVE) * nns + keys[i].ns]++] = *keys[i].h;
    /* after filling, fill[g] is the end of group g and its start is the previous end */
    size_t start = 0, b = 0;
    for (size_t g = 0; g < 2 * nns; g++) {
        size_t end = fill[g];
        for (size_t s = start; s < end; s += max_chunk) {
            plan.batches[b].op = g < nns ? PF_META_OP_INSERT : PF_META_OP_REMOVE;
            plan.batches[b].ns = nss[g % nns];
            plan.batches[b].hashes = &plan.hashes[s];
            plan.batches[b].n = end - s < max_chunk ? end - s : max_chunk;
            b++;
        }
        start = end;
    }
    plan.nbatches = b;
    *plan_p = plan;
    rc = 0;
out:
    if (rc)
        pf_meta_plan_free(&plan);
    free(counts);
    free(nss);
    free(cmd_ns);
    free(keys);
    free(table);
    return rc;
}
