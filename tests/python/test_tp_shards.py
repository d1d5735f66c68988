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
