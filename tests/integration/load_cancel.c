/* Safe load cancellation (issue 24 item 6), against a real pegaflow-server with the sim GPU
 * and the fault layer stalling every H2D copy batch: a client that gives up on a Load asks
 * the server to stop (pf_loadstate_cancel, state 0 -> 2), the server submits nothing after
 * the chunk in flight and confirms with -2; after the confirmation no byte of the load
 * reaches the destination blocks. Checked byte by byte against a reference copy of the
 * destination's original (seeded) contents, after a second load proved the load thread
 * moved on. A cancel of a load that already completed finds its final value 1. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/pegaflow.h"
#include "kvsim.h"
#include "pftest.h"
#include "world.h"

#define NB     32 /* blocks saved and loaded */
#define NLAYER 2  /* split K/V: 4 copies per block */
/* 512 KiB segments and --load-cancel-chunk 32mb: a chunk (at least 64 copies and 32 MiB,
 * PF_XFER_CHUNK*) is 64 copies, 16 blocks */
#define SEG          (512u << 10)
#define CHUNK_BLOCKS 16
#define DST          40 /* first destination block id */
#define TMO_MS       10000

static struct pft_proc srv;
static struct pf_client *cl;

static void start(const char *spec)
{
    const char *args[] = {
        "--gpu-backend",       "sim",  "--pool-size",    "128mb",        "--sim-gpus", "1",
        "--load-cancel-chunk", "32mb", "--enable-debug", "--fault-spec", spec,         NULL};
    PFT_CHECK(pft_start(&srv, "pegaflow-server", "127.0.0.1", args) == 0, "start server");
    PFT_CHECK(pf_client_connect(srv.addr, &cl) == 0, "connect");
}

static void stop(void)
{
    pf_client_close(cl);
    PFT_CHECK(pft_stop(&srv, SIGTERM, 15000) == 0, "server exit code");
}

static int64_t load_async(struct world *w, const uint8_t *lease, size_t n, uint32_t first_dst,
                          struct pf_loadstate **ls_p)
{
    int64_t targets[NB];
    for (size_t i = 0; i < n; i++)
        targets[i] = first_dst + (int64_t)i;
    const char *names[MAXL];
    for (int l = 0; l < w->nlayers; l++)
        names[l] = w->names[l];
    size_t gsz = (size_t)w->nlayers, cnt = n;
    struct pf_load_item it = {
        .lease = lease, .lease_len = PF_LEASE_LEN, .targets = targets, .group_counts = &cnt};
    PFT_CHECK(pf_loadstate_create(ls_p) == 0, "loadstate");
    return pf_client_load(cl, w->id, 0, 0, pf_loadstate_name(*ls_p), names, &gsz, 1, &it, 1,
                          TMO_MS);
}

/* Block b of w holds what block b of ref holds (every layer). */
static bool same(struct world *w, struct world *ref, uint64_t b, uint64_t rb)
{
    for (int l = 0; l < w->nlayers; l++)
        if (!kvt_block_equal(&w->kv[0][l], b, &ref->kv[0][l], rb))
            return false;
    return true;
}

static void sc_cancel_stalled(void)
{
    /* every H2D batch (chunk) waits 2 s before it is submitted */
    start("gpu.h2d:delay=2000");
    struct world W, R;
    world_init(&W, "cancel-inst", "ns-cancel", 1, NLAYER, KV_SPLIT, 80, SEG, true);
    world_init(&R, "cancel-ref", "ns-cancel", 1, NLAYER, KV_SPLIT, 80, SEG, true); /* same bytes */
    world_register(cl, &W);
    world_save_ok(cl, &W, 100, 1, NB);
    wait_sealed(cl, W.id, 100, NB);
    struct pf_query_result res;
    PFT_CHECK(query(cl, W.id, "q1", 100, NB, &res) == 0 && res.num_hit_blocks == NB, "query: %u",
              res.num_hit_blocks);
    struct pf_loadstate *ls;
    PFT_CHECK(load_async(&W, res.lease, NB, DST, &ls) == 0, "load: %s", pf_last_error_message());
    /* the first chunk sits in its 2 s delay: give up now */
    int64_t asked = pf_loadstate_cancel(ls);
    PFT_CHECK(asked == 2, "cancel found state %lld (the load cannot have finished yet)",
              (long long)asked);
    PFT_CHECK(pf_loadstate_cancel(ls) == 2, "a second cancel is answered 2 too");
    int64_t st = pf_loadstate_wait(ls, 30000);
    PFT_CHECK(st == -2, "server confirmed with %lld, want -2 (cancelled)", (long long)st);
    /* what the client sees at the confirmation: whole chunks from the start, the rest as
     * it was (the chunk in flight when the cancel came completed before the -2) */
    size_t landed = 0;
    while (landed < NB && same(&W, &W, DST + landed, 1 + landed))
        landed++;
    PFT_CHECK(landed % CHUNK_BLOCKS == 0 && landed < NB,
              "%zu blocks landed: not whole chunks, or all", landed);
    for (size_t i = landed; i < NB; i++)
        PFT_CHECK(same(&W, &R, DST + i, DST + i), "destination block %zu changed", DST + i);
    /* the load thread is FIFO: once the next load completed, the first's batch is over */
    PFT_CHECK(query(cl, W.id, "q2", 100, 1, &res) == 0 && res.num_hit_blocks == 1, "query 2");
    world_load_ok(cl, &W, res.lease, 1, 75);
    PFT_CHECK(same(&W, &W, 75, 1), "second load byte-exact");
    for (size_t i = 0; i < NB; i++) {
        struct world *want = i < landed ? &W : &R;
        uint64_t rb = i < landed ? 1 + i : DST + i;
        PFT_CHECK(same(&W, want, DST + i, rb), "block %zu changed after the confirmed cancel",
                  DST + i);
    }
    PFT_CHECK(metric(&srv, "pegaflow_load_cancelled_total") == 1, "load_cancelled_total %g",
              metric(&srv, "pegaflow_load_cancelled_total"));
    /* chunks submitted: landed/CHUNK_BLOCKS of the cancelled load, 1 of the second */
    double delays = metric(&srv, "pegaflow_faults_injected_total{op=\"gpu.h2d\",kind=\"delay\"}");
    PFT_CHECK(delays == (double)(landed / CHUNK_BLOCKS + 1), "%g H2D batches ran, want %zu", delays,
              landed / CHUNK_BLOCKS + 1);
    pf_loadstate_destroy(ls);
    /* a cancel after completion finds the final value */
    PFT_CHECK(query(cl, W.id, "q3", 100, 2, &res) == 0 && res.num_hit_blocks == 2, "query 3");
    PFT_CHECK(load_async(&W, res.lease, 2, 77, &ls) == 0, "load 3");
    PFT_CHECK(pf_loadstate_wait(ls, 30000) == 1, "load 3 completes");
    PFT_CHECK(pf_loadstate_cancel(ls) == 1, "cancel after completion answers 1");
    PFT_CHECK(same(&W, &W, 77, 1) && same(&W, &W, 78, 2), "load 3 byte-exact");
    pf_loadstate_destroy(ls);
    fprintf(stderr, "  cancel_stalled: %zu of %d blocks landed before the cancel, none after\n",
            landed, NB);
    world_free(&W);
    world_free(&R);
    stop();
}

int main(int argc, char **argv)
{
    world_seed = pft_seed();
    static const struct pft_scenario sc[] = {{"cancel_stalled", sc_cancel_stalled}};
    return pft_run_scenarios(sc, sizeof(sc) / sizeof(sc[0]), argv + 1, argc - 1);
}
