"""Hybrid and MLA page-first layouts through the SSD tier and across nodes over P2P (real
servers only)."""

from __future__ import annotations

import numpy as np

from modelkit import (
    BS,
    Blocks,
    Hybrid,
    LAT,
    MLA_LAYERS,
    N,
    Req,
    SO,
    _OnNode,
    evict_ram_after_ssd_writes,
    hashes,
    mla_ranks,
    page,
    poll_matched,
    rng,
    wait_finished,
    wait_hits,
    wait_registered,
)
from modelkit import p2p_backend, ssd_backend  # noqa: F401 (fixtures)
from pegaflow.connector.config import ConnectorContext
from pegaflow.connector.scheduler import SchedulerConnector


def test_hybrid_round_trips_through_ssd(ssd_backend):
    r = rng()
    B = ssd_backend
    a = Hybrid(B, "A")
    hs = hashes("ssd-h", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    evict_ram_after_ssd_writes(B)
    # the want-set form goes through the prefetch machinery (a membership query is RAM)
    b = Hybrid(B, "B", wait_for_full_prefix=True)
    req = Req("b", hs, 85)
    got, loading = poll_matched(b.s, req)
    assert got == (80, True) and loading >= 1
    b.s.update_state_after_alloc(req, Blocks([11, 12, 13, 14, 15, 16], [0, 0, 0, 0, 17, 18]),
                                 80)
    plan = b.s.build_connector_meta(SO())
    b.w.start_load_kv(plan)
    assert wait_finished(b.w, "b")[1] == {"b"} and not b.w.get_block_ids_with_load_errors()
    for sa, sb in zip([1, 2, 3, 4, 5], [11, 12, 13, 14, 15]):
        assert bytes(page(b.att, sb)) == bytes(page(a.att, sa))
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 9))
    assert B.metric(0, "pegaflow_ssd_prefetch_success_total") >= 6
    a.close()
    b.close()


def test_mla_page_first_round_trips_through_ssd(ssd_backend):
    from pegaflow.connector.plan import SaveIntent, StepPlan

    r = rng()
    B = ssd_backend
    ws = mla_ranks(B, 2, "A")
    ids = list(range(1, 7))
    hs = hashes("ssd-mla", 6)
    data = {n: r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16) for n in MLA_LAYERS}
    for w, kv in ws:
        for n, t in kv.items():
            t.numpy()[...] = data[n]
    plan = StepPlan(saves={"a": SaveIntent(tuple(ids), tuple(hs))})
    for w, _ in ws:
        w.wait_for_save(plan)
    wait_hits(B, 0, "A", hs, 6)
    evict_ram_after_ssd_writes(B)
    wb = mla_ranks(B, 2, "B")
    sched = SchedulerConnector(ConnectorContext("B", "ns-mla", BS, tp_size=1, world_size=2,
                                                is_mla=True, collapse_mla_tp=True,
                                                page_first=True, cross_layer_blocks=False),
                               B.client(), session=False)
    req = Req("b", hs, 6 * BS + 1)
    got, loading = poll_matched(sched, req)
    assert got == (6 * BS, True) and loading >= 1
    dest = [10, 11, 12, 13, 14, 15, 16]
    sched.update_state_after_alloc(req, Blocks(dest), got[0])
    lp = sched.build_connector_meta(SO())
    for w, kv in wb:
        w.start_load_kv(lp)
        assert wait_finished(w, "b")[1] == {"b"} and not w.get_block_ids_with_load_errors()
        for n, t in kv.items():
            assert np.array_equal(t.numpy()[dest[:6]], data[n][ids])
    for w, _ in ws + wb:
        w.shutdown(unregister=False)
    sched.shutdown()


def test_hybrid_crosses_p2p(p2p_backend):
    r = rng()
    B = p2p_backend
    a = Hybrid(_OnNode(B, 0), "A")
    hs = hashes("p2p-h", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    wait_registered(B, 0, 6)  # 5 attention blocks + 1 state
    b = Hybrid(_OnNode(B, 1), "B", wait_for_full_prefix=True)
    req = Req("b", hs, 85)
    got, loading = poll_matched(b.s, req)
    assert got == (80, True) and loading >= 1
    b.s.update_state_after_alloc(req, Blocks([11, 12, 13, 14, 15, 16], [0, 0, 0, 0, 17, 18]),
                                 80)
    b.w.start_load_kv(b.s.build_connector_meta(SO()))
    assert wait_finished(b.w, "b")[1] == {"b"} and not b.w.get_block_ids_with_load_errors()
    for sa, sb in zip([1, 2, 3, 4, 5], [11, 12, 13, 14, 15]):
        assert bytes(page(b.att, sb)) == bytes(page(a.att, sa))
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 9))
    a.close()
    b.close()


def test_mla_page_first_crosses_p2p(p2p_backend):
    from pegaflow.connector.plan import SaveIntent, StepPlan

    r = rng()
    B = p2p_backend
    ws = mla_ranks(_OnNode(B, 0), 2, "A")
    ids = list(range(1, 7))
    hs = hashes("p2p-mla", 6)
    data = {n: r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16) for n in MLA_LAYERS}
    for w, kv in ws:
        for n, t in kv.items():
            t.numpy()[...] = data[n]
    plan = StepPlan(saves={"a": SaveIntent(tuple(ids), tuple(hs))})
    for w, _ in ws:
        w.wait_for_save(plan)
    wait_registered(B, 0, 6)
    on1 = _OnNode(B, 1)
    wb = mla_ranks(on1, 2, "B")
    sched = SchedulerConnector(ConnectorContext("B", "ns-mla", BS, tp_size=1, world_size=2,
                                                is_mla=True, collapse_mla_tp=True,
                                                page_first=True, cross_layer_blocks=False),
                               on1.client(), session=False)
    req = Req("b", hs, 6 * BS + 1)
    got, loading = poll_matched(sched, req)
    assert got == (6 * BS, True) and loading >= 1
    dest = [10, 11, 12, 13, 14, 15, 16]
    sched.update_state_after_alloc(req, Blocks(dest), got[0])
    lp = sched.build_connector_meta(SO())
    for w, kv in wb:
        w.start_load_kv(lp)
        assert wait_finished(w, "b")[1] == {"b"} and not w.get_block_ids_with_load_errors()
        for n, t in kv.items():
            assert np.array_equal(t.numpy()[dest[:6]], data[n][ids])
    for w, _ in ws + wb:
        w.shutdown(unregister=False)
    sched.shutdown()
