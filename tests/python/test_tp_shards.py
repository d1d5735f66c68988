"""TP across hosts: two servers each holding half of a TP group serve one request with
per-shard leases; mismatched shard hit counts; a shard losing the common prefix; a
shard down ([fake] and [real])."""

from __future__ import annotations

import numpy as np
import pytest

from modelkit import BS, DL, FakeB, Sharded, hashes, q_calls, rng, wait_hits
from modelkit import backend  # noqa: F401 (fixtures)


def test_two_servers_each_hold_half_a_tp_group_and_serve_one_request(backend):
    r = rng()
    B = backend(2)
    a = Sharded(B, "A", r)
    assert all(x is not None and x.alive() for x in a.s.sessions)  # one Session per server
    a.fill()
    hs = hashes("t", 4)
    a.save("a", hs, [1, 2, 3, 4])
    wait_hits(B, 0, "A", hs, 4)
    wait_hits(B, 1, "A", hs, 4)
    if B.name == "fake":
        assert B.servers[1].instances["A"].namespace == "ns:tp-shard-1-of-2"
        assert B.servers[0].instances["A"].world_size == 2
    b = Sharded(B, "B", r)
    got, plan, res = b.load("b", hs, [5, 6, 7, 8])
    assert got == (4 * BS, True) and all(x == (None, {"b"}) for x in res)
    it = plan.loads["b"]
    l0, l1 = it.leases_for(0)[0].lease, it.leases_for(1)[0].lease
    assert l0 != l1  # one lease per shard, each from its own server
    for (wa, kva), (wb, kvb) in zip(a.ws, b.ws):
        assert not wb.get_block_ids_with_load_errors()
        for n in DL:
            assert np.array_equal(kvb[n].numpy()[:, 5:9], kva[n].numpy()[:, 1:5])
    from pegaflow.client.errors import FailedPrecondition

    for i, lease in ((0, l0), (1, l1)):  # each consumed by its shard's two workers
        with pytest.raises(FailedPrecondition):
            B.probe[i].release(lease) if B.name == "real" else B.client(i).release(lease)
    a.close()
    b.close()


def test_mismatched_shard_hits_requery_the_common_prefix(backend):
    r = rng()
    B = backend(2)
    a = Sharded(B, "A", r)
    a.fill()
    hs = hashes("mm", 4)
    a.save("a", hs, [1, 2, 3, 4], shard1_blocks=3)  # shard 1 holds 3 blocks, shard 0 four
    wait_hits(B, 0, "A", hs, 4)
    wait_hits(B, 1, "A", hs, 3)
    b = Sharded(B, "B", r)
    got, plan, res = b.load("b", hs, [5, 6, 7, 8])
    assert got == (3 * BS, True) and all(x == (None, {"b"}) for x in res)
    assert b.s.stats["releases"] == 1  # shard 0's 4-block lease
    for (wa, kva), (wb, kvb) in zip(a.ws, b.ws):
        assert np.array_equal(kvb[DL[0]].numpy()[:, 5:8], kva[DL[0]].numpy()[:, 1:4])
        assert not kvb[DL[0]].numpy()[:, 8].any()
    if B.name == "fake":
        q = [(c["req_id"], c["n"]) for c in q_calls(B, 0) if c["req_id"].startswith("b")]
        assert q == [("b", 4), ("b:tp-common-3", 3)]
        assert not B.servers[0].leases and not B.servers[1].leases
    a.close()
    b.close()


def test_a_shard_that_lost_the_common_prefix_on_requery_is_a_miss():
    r = rng()
    B = FakeB(2)
    srvs = B.servers
    a = Sharded(B, "A", r)
    a.fill()
    hs = hashes("rq", 4)
    a.save("a", hs, [1, 2, 3, 4], shard1_blocks=3)
    b = Sharded(B, "B", r)
    orig = srvs[0].query

    def evicting(instance_id, req_id, hashes_, *a, **k):
        if req_id.endswith(":tp-common-3"):
            srvs[0].blocks.pop(("ns:tp-shard-0-of-2", hs[2]), None)
        return orig(instance_id, req_id, hashes_, *a, **k)

    srvs[0].query = evicting
    got, plan, _ = b.load("b", hs, [5, 6, 7, 8])
    assert got == (0, False) and not plan.loads
    assert b.s.stats["shard_mismatches"] == 1
    assert not srvs[0].leases and not srvs[1].leases


def test_a_shard_down_degrades_to_a_miss(backend):
    r = rng()
    B = backend(2)
    a = Sharded(B, "A", r)
    a.fill()
    hs = hashes("dn", 4)
    a.save("a", hs, [1, 2, 3, 4])
    wait_hits(B, 0, "A", hs, 4)
    b = Sharded(B, "B", r)
    if B.name == "fake":
        B.servers[1].down = True
    else:
        B.procs[1].kill()
    got, plan, _ = b.load("b", hs, [5, 6, 7, 8])
    assert got == (0, False) and not plan.loads
    assert b.s.stats["releases"] == 1 and b.s.stats["release_errors"] == 0  # shard 0's lease
    if B.name == "fake":
        assert not B.servers[0].leases


def test_hybrid_model_over_two_servers_reconciles_groups_and_shards():
    """TP=2 over two servers with a hybrid model: the resume point must hold on every
    shard for every group; shard 1 lacks the state after 5 blocks, so both resume at 3
    (the state both hold), with one lease per group per shard."""
    from fakes import group_key
    from modelkit import GROUPS, PAGE, SO, Blocks, Cached, NewReq, Req, hybrid_caches, page
    from pegaflow.connector.config import ConnectorContext
    from pegaflow.connector.scheduler import SchedulerConnector
    from pegaflow.connector.worker import WorkerConnector

    r = rng()
    B = FakeB(2)

    def ctx(iid, shard):
        return ConnectorContext(iid, f"ns:tp-shard-{shard}-of-2", BS, tp_size=1,
                                world_size=1, physical_tp_rank=shard, local_tp_rank=0,
                                local_tp_size=1, num_shards=2, shard_index=shard,
                                groups=GROUPS, cross_layer_blocks=False)

    def vllm(iid):
        s = SchedulerConnector(ctx(iid, 0), [B.client(0), B.client(1)], session=False)
        ws = []
        for shard in range(2):
            w = WorkerConnector(ctx(iid, shard), B.client(shard), B.adapter(shard),
                                save_thread=False)
            kv, att, mam = hybrid_caches(B, shard)
            w.register_kv_caches(kv)
            ws.append((w, att, mam))
        return s, ws

    hs = hashes("hs", 5)
    sa, wa = vllm("A")
    att_ids, mam_ids = [1, 2, 3, 4, 5, 6], [0, 0, 7, 0, 8, 9]
    req = Req("a", hs, 85)
    assert sa.get_num_new_matched_tokens(req, 0) == (0, False)
    sa.update_state_after_alloc(req, Blocks(att_ids, mam_ids), 0)
    done = 0
    for i, n in enumerate([48, 32, 5]):  # states after 3 and 5 blocks
        for w, att, mam in wa:
            for b in att_ids[done // BS:(done + n + BS - 1) // BS]:
                page(att, b)[:] = r.integers(0, 256, PAGE, dtype=np.uint8)
            if (done + n) % BS == 0:
                page(mam, mam_ids[(done + n) // BS - 1])[:] = r.integers(0, 256, PAGE,
                                                                         dtype=np.uint8)
        so = SO(new=[NewReq("a", (att_ids, mam_ids), 0)] if i == 0 else [],
                cached=Cached(["a"], [None], [done]) if i else None, sched={"a": n})
        meta = sa.build_connector_meta(so)
        for w, _, _ in wa:
            w.wait_for_save(meta)
        done += n
    del B.servers[1].blocks[("ns:tp-shard-1-of-2", group_key(hs[4], 1))]
    sb, wb = vllm("B")
    rb = Req("b", hs, 85)
    got = sb.get_num_new_matched_tokens(rb, 0)
    assert got == (48, True)
    sb.update_state_after_alloc(rb, Blocks([11, 12, 13, 0, 0, 0], [0, 0, 17, 0, 0, 0]), 48)
    plan = sb.build_connector_meta(SO())
    it = plan.loads["b"]
    # shard 0's state lease also pins the state after 5 blocks (no target), shard 1's not
    assert [(g.group, g.targets) for g in it.leases_for(0)] == \
        [(0, (11, 12, 13)), (1, (17, None))]
    assert [(g.group, g.targets) for g in it.leases_for(1)] == [(0, (11, 12, 13)), (1, (17,))]
    for (w, att, mam), (_, att_a, mam_a) in zip(wb, wa):
        w.start_load_kv(plan)
        assert w.get_finished(set()) == (None, {"b"}) and not w.get_block_ids_with_load_errors()
        assert bytes(page(mam, 17)) == bytes(page(mam_a, 7))
        assert [bytes(page(att, x)) for x in (11, 12, 13)] == \
            [bytes(page(att_a, x)) for x in (1, 2, 3)]
    assert not B.servers[0].leases and not B.servers[1].leases
