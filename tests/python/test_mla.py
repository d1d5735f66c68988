"""MLA page-first: TP=4 striped saves store every block once and every rank loads it;
the layer-split variant; split K/V refused ([fake] and [real])."""

from __future__ import annotations

import numpy as np
import pytest

from fakes import FakeEngineClient, FakeServer, HostDeviceAdapter, HostTensor
from modelkit import (
    BS,
    LAT,
    MLA_LAYERS,
    N,
    hashes,
    mla_ctx,
    mla_ranks,
    rng,
    wait_finished,
    wait_hits,
)
from modelkit import backend  # noqa: F401 (fixtures)
from pegaflow.connector.worker import WorkerConnector


def test_mla_tp4_page_first_stores_each_block_once_and_every_rank_loads_it(backend):
    from pegaflow.connector.plan import LoadIntent, SaveIntent, StepPlan

    r = rng()
    B = backend()
    ws = mla_ranks(B, 4, "A")
    ids = list(range(1, 9))
    hs = hashes("mla", 8)
    data = {n: r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16) for n in MLA_LAYERS}
    for w, kv in ws:  # MLA: every rank holds the same KV
        for n, t in kv.items():
            t.numpy()[...] = data[n]
    plan = StepPlan(saves={"a": SaveIntent(tuple(ids), tuple(hs))})
    for w, _ in ws:
        w.wait_for_save(plan)
    for w, _ in ws:
        assert w.wait_saves_idle(10)
    # each rank copied 1/4 of the blocks: every block once
    assert [w.stats["saved_blocks"] for w, _ in ws] == [2, 2, 2, 2]
    page_bytes = BS * LAT * 2
    if B.name == "fake":
        args = B.servers[0].calls[0][1]["args"]
        assert args.page_first and args.tp_size == 1 and args.world_size == 4
        saved = [(c[1]["device_id"], c[1]["layers"][0][1]) for c in B.servers[0].calls
                 if c[0] == "save"]
        assert saved == [(0, [4, 8]), (1, [1, 5]), (2, [2, 6]), (3, [3, 7])]
        assert all(B.servers[0].slot_writes[("ns-mla", h)] == len(MLA_LAYERS) for h in hs)
    else:
        # a collapsed-but-not-striped layout would copy 4x this (one slot per rank)
        assert B.metric(0, "pegaflow_save_bytes_total") == len(hs) * len(MLA_LAYERS) * page_bytes
    # every rank reports every hash (the scheduler counts 4 workers per block)
    assert all(sorted(x[1] for x in w.event_log.take()) == sorted(hs) for w, _ in ws)
    # (the real server seals saved blocks on its insert thread after the Save returns)
    wait_hits(B, 0, "A", hs, 8)
    # B (another instance, 4 ranks) loads all 8 blocks on every rank
    wb = mla_ranks(B, 4, "B")
    c = B.client()
    q = c.query("B", "b", hs)
    assert q.num_hit_blocks == 8
    dest = tuple(range(10, 18))
    lp = StepPlan(loads={"b": LoadIntent(dest, q.lease, 8 * BS)})
    for w, kv in wb:
        w.start_load_kv(lp)
        assert wait_finished(w, "b")[1] == {"b"} and not w.get_block_ids_with_load_errors()
        for n, t in kv.items():
            assert np.array_equal(t.numpy()[list(dest)], data[n][ids])
    from pegaflow.client.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition):  # its 4 shares were consumed
        c.release(q.lease)
    for w, _ in ws + wb:
        w.shutdown(unregister=False)


def test_mla_layer_split_ranks_each_save_their_layers(backend):
    from pegaflow.connector.plan import SaveIntent, StepPlan

    r = rng()
    B = backend()
    ws = mla_ranks(B, 2, "A", split=True)
    hs = hashes("split", 3)
    for w, kv in ws:
        for t in kv.values():
            t.numpy()[...] = r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16)
    plan = StepPlan(saves={"a": SaveIntent((1, 2, 3), tuple(hs))})
    ws[0][0].wait_for_save(plan)
    assert ws[0][0].wait_saves_idle(10)
    if B.name == "fake":  # (the real server seals blocks asynchronously)
        assert B.hits(0, "A", hs) == 0  # rank 1's layer is missing
    ws[1][0].wait_for_save(plan)
    assert ws[1][0].wait_saves_idle(10)
    assert [w.stats["saved_blocks"] for w, _ in ws] == [3, 3]
    if B.name == "fake":
        saved = [(c[1]["device_id"], [x[0] for x in c[1]["layers"]], c[1]["layers"][0][1])
                 for c in B.servers[0].calls if c[0] == "save"]
        assert saved == [(0, [MLA_LAYERS[0]], [1, 2, 3]), (1, [MLA_LAYERS[1]], [1, 2, 3])]
    wait_hits(B, 0, "A", hs, 3)
    for w, _ in ws:
        w.shutdown(unregister=False)


def test_page_first_refuses_split_kv_layouts():
    srv = FakeServer()
    w = WorkerConnector(mla_ctx(0, 1, "X"), FakeEngineClient(srv), HostDeviceAdapter(0),
                        save_thread=False)
    object.__setattr__(w.ctx, "is_mla", False)  # a (2, N, ...) K/V split tensor
    with pytest.raises(ValueError, match="page-first"):
        w.register_kv_caches({"l": HostTensor(np.zeros((2, N, BS, 2, 8), np.uint16))})
