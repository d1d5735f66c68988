"""Scheduler side: probe memoisation and lease release, clamp, commit, save-intent cursor
across chunked prefill / decode / preemption, failure paths (fake clock, FakeServer)."""

from __future__ import annotations

import pytest

from fakes import FakeClock, FakeServer, FakeEngineClient, _Instance, _Layer, _Worker
from pegaflow.client.errors import FailedPrecondition, Internal
from pegaflow.connector.config import ConnectorContext
from pegaflow.connector.scheduler import SchedulerConnector

BS = 4


@pytest.fixture(autouse=True)
def _seed(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils

    kv_cache_utils.init_none_hash(sha256)


class World:
    def __init__(self, mode="read_write", world_size=1, **ctx_kw):
        self.clock = FakeClock()
        self.server = FakeServer(self.clock)
        self.server.instances["inst"] = _Instance("ns", 1, world_size, {
            d: _Worker(d, 0, 0, {"L": _Layer("L", None, 64, 8, 0, 1)}) for d in range(world_size)})
        self.client = FakeEngineClient(self.server)
        self.ctx = ConnectorContext("inst", "ns", BS, mode=mode, world_size=world_size, **ctx_kw)
        self.s = SchedulerConnector(self.ctx, self.client, clock=self.clock,
                                    session_thread=False)

    def request(self, rid, tokens, max_tokens=8):
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher
        from vllm.v1.request import Request

        return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens), None,
                       block_hasher=get_request_block_hasher(BS, sha256))

    def store(self, hashes):
        for h in hashes:
            self.server.blocks[("ns", bytes(h))] = {("L", 0): b""}

    def queries(self):
        return self.server.count("query")


def blocks(ids, hashed=0):
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.kv_cache_utils import KVCacheBlock

    bl = []
    for i, b in enumerate(ids):
        k = KVCacheBlock(b)
        if i < hashed:
            k.set_block_hash(b"h%d" % i + b"\0\0\0\0", BS * (i + 1))
        bl.append(k)
    return KVCacheBlocks((bl,))


def sched_out(new=(), cached=(), finished=(), preempted=None, legacy=False):
    """new: (req, block_ids, num_computed, num_sched); cached: (rid, new_ids|None,
    num_computed, num_sched, resumed)."""
    from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

    nr, ns = [], {}
    for req, ids, nc, n in new:
        d = NewRequestData.from_request(req, (list(ids),))
        d.num_computed_tokens = nc
        nr.append(d)
        ns[req.request_id] = n
    c = CachedRequestData.make_empty()
    for rid, ids, nc, n, resumed in cached:
        c.req_ids.append(rid)
        c.new_block_ids.append((list(ids),) if ids is not None else None)
        c.num_computed_tokens.append(nc)
        c.num_output_tokens.append(0)
        c.new_token_ids.append([])
        if resumed:
            c.resumed_req_ids.add(rid)
        ns[rid] = n
    if legacy:
        c.resumed_from_preemption = [r in c.resumed_req_ids for r in c.req_ids]
        del c.resumed_req_ids
    return SchedulerOutput(scheduled_new_reqs=nr, scheduled_cached_reqs=c,
                           num_scheduled_tokens=ns, total_num_scheduled_tokens=sum(ns.values()),
                           scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
                           num_common_prefix_blocks=[0], finished_req_ids=set(finished),
                           free_encoder_mm_hashes=[], preempted_req_ids=preempted)


# ------------------------------------------------------------------ probe


def test_miss_and_save_only():
    w = World()
    r = w.request("a", range(10))
    assert w.s.get_num_new_matched_tokens(r, 0) == (0, False)
    w2 = World(mode="save_only")
    w2.store(r.block_hashes)
    assert w2.s.get_num_new_matched_tokens(r, 0) == (0, False)
    assert w2.queries() == 0


def test_hit_is_async_and_clamped_to_leave_the_last_token():
    w = World()
    r = w.request("a", range(12))  # 3 full blocks, all stored
    w.store(r.block_hashes)
    assert w.s.get_num_new_matched_tokens(r, 0) == (11, True)
    r2 = w.request("b", range(14))  # 3 full blocks + 2 tokens: no clamp needed
    assert w.s.get_num_new_matched_tokens(r2, 0) == (12, True)
    r3 = w.request("c", range(4))  # a 1-block prompt fully stored: 3 tokens
    assert w.s.get_num_new_matched_tokens(r3, 0) == (3, True)


def test_query_starts_after_local_hits_and_partial_prefix():
    w = World()
    r = w.request("a", range(20))  # 5 blocks
    w.store(r.block_hashes[:3])
    assert w.s.get_num_new_matched_tokens(r, 4) == (8, True)  # blocks 1,2 beyond local 0
    assert w.server.calls[-1][1]["n"] == 4  # asked for hashes 1..4 only


def test_probe_is_memoised_and_drift_releases_the_lease():
    w = World()
    r = w.request("a", range(16))
    w.store(r.block_hashes[:2])
    for _ in range(3):
        assert w.s.get_num_new_matched_tokens(r, 0) == (8, True)
    assert w.queries() == 1 and len(w.server.leases) == 1
    old = next(iter(w.server.leases))
    # local prefix cache grew by one block: new identity
    assert w.s.get_num_new_matched_tokens(r, 4) == (4, True)
    assert w.queries() == 2 and old not in w.server.leases and len(w.server.leases) == 1


def test_loading_returns_none_until_ready():
    w = World()
    r = w.request("a", range(16))
    w.store(r.block_hashes)
    w.server.loading["a"] = 2
    assert w.s.get_num_new_matched_tokens(r, 0) == (None, False)
    assert w.s.get_num_new_matched_tokens(r, 0) == (None, False)
    assert w.s.get_num_new_matched_tokens(r, 0) == (15, True)
    assert w.queries() == 3


def test_drift_while_loading_keeps_polling_then_releases_the_stale_answer():
    w = World()
    r = w.request("a", range(16))
    w.store(r.block_hashes)
    w.server.loading["a"] = 1
    assert w.s.get_num_new_matched_tokens(r, 0) == (None, False)
    # identity drifts (local hit of one block) while the server is still Loading
    assert w.s.get_num_new_matched_tokens(r, 4) == (11, True)
    polls = [c for c in w.server.calls if c[0] == "query"]
    assert [c[1]["n"] for c in polls] == [4, 4, 3]  # original hashes, then the new ones
    assert len(w.server.leases) == 1 and w.server.count("release") == 1


def test_probe_older_than_half_the_lease_ttl_is_renewed():
    w = World()
    r = w.request("a", range(16))
    w.store(r.block_hashes)
    w.s.get_num_new_matched_tokens(r, 0)
    old = next(iter(w.server.leases))
    w.clock.advance(301)
    assert w.s.get_num_new_matched_tokens(r, 0) == (15, True)
    assert old not in w.server.leases and len(w.server.leases) == 1


def test_abort_before_commit_releases_the_lease():
    w = World()
    r = w.request("a", range(16))
    w.store(r.block_hashes)
    w.s.get_num_new_matched_tokens(r, 0)
    assert len(w.server.leases) == 1
    assert w.s.request_finished(r, []) == (False, None)
    assert not w.server.leases


def test_shutdown_releases_uncommitted_leases():
    w = World()
    for i in range(3):
        r = w.request(f"r{i}", [i] * 8 + list(range(8)))
        w.store(r.block_hashes)
        w.s.get_num_new_matched_tokens(r, 0)
    assert len(w.server.leases) == 3
    w.s.shutdown()
    assert not w.server.leases


def test_not_loading_after_a_hit_releases_the_lease():
    w = World()
    r = w.request("a", range(16))
    w.store(r.block_hashes)
    w.s.get_num_new_matched_tokens(r, 0)
    w.s.update_state_after_alloc(r, blocks([5, 6, 7, 8]), 0)
    assert not w.server.leases


@pytest.mark.parametrize("how", ["down", "slow", "precondition", "internal"])
def test_query_failures_are_misses(how):
    w = World()
    r = w.request("a", range(16))
    w.store(r.block_hashes)
    if how == "down":
        w.server.down = True
    elif how == "slow":
        w.server.slow = True
    elif how == "precondition":
        w.server.instances.clear()  # e.g. the server restarted and lost the instance
    else:
        w.server.fail_next["query"] = Internal("pf_client_query", -5, 13, "boom")
    assert w.s.get_num_new_matched_tokens(r, 0) == (0, False)


def test_release_failure_is_swallowed():
    w = World()
    r = w.request("a", range(16))
    w.store(r.block_hashes)
    w.s.get_num_new_matched_tokens(r, 0)
    w.server.fail_next["release"] = FailedPrecondition("r", -1, 9, "unknown lease")
    assert w.s.request_finished(r, []) == (False, None)
    assert w.s.stats["release_errors"] == 1


def test_block_size_one_clamp_requeries_the_exact_prefix():
    w = World()
    w.ctx = ConnectorContext("inst", "ns", 1)
    w.s = SchedulerConnector(w.ctx, w.client, clock=w.clock, session=False)
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher
    from vllm.v1.request import Request

    r = Request("a", [1, 2, 3], SamplingParams(), None,
                block_hasher=get_request_block_hasher(1, sha256))
    w.store(r.block_hashes)
    w.s.events.hit(bytes(r.block_hashes[2]), (None, [3], None, None, 1))  # announced
    w.s.take_events()
    assert w.s.get_num_new_matched_tokens(r, 0) == (2, True)
    assert len(w.server.leases) == 1
    lease = next(iter(w.server.leases.values()))
    assert len(lease.keys) == 2
    # the re-query asked for 2 blocks only: the 3rd is not reported removed
    assert w.s.take_events() == []


# ------------------------------------------------------------------ commit


def test_commit_targets_blocks_after_the_local_prefix():
    w = World()
    r = w.request("a", range(24))  # 6 blocks
    w.store(r.block_hashes[:4])
    assert w.s.get_num_new_matched_tokens(r, 4) == (12, True)  # blocks 1..3
    w.s.update_state_after_alloc(r, blocks([9, 20, 21, 22], hashed=1), 12)
    plan = w.s.build_connector_meta(sched_out())
    it = plan.loads["a"]
    assert it.block_ids == (20, 21, 22) and it.num_tokens == 12 and len(it.lease) == 16
    assert it.lease in w.server.leases  # consumed by the workers' Load, not here
    assert not w.s.build_connector_meta(sched_out()).loads  # emitted once


@pytest.mark.parametrize("bad", ["count", "local", "no_probe"])
def test_commit_that_cannot_be_honoured_becomes_a_failed_load(bad):
    w = World()
    r = w.request("a", range(16))
    w.store(r.block_hashes)
    if bad != "no_probe":
        w.s.get_num_new_matched_tokens(r, 0)
    if bad == "count":
        w.s.update_state_after_alloc(r, blocks([5, 6]), 8)  # 2 blocks, lease covers 4
    elif bad == "local":
        w.s.update_state_after_alloc(r, blocks([5, 6, 7, 8], hashed=1), 15)
    else:
        w.s.update_state_after_alloc(r, blocks([5, 6, 7, 8]), 15)
    it = w.s.build_connector_meta(sched_out()).loads["a"]
    assert it.lease is None and it.block_ids
    assert not w.server.leases
    assert w.s.stats["commit_failures"] == 1


# ------------------------------------------------------------------ saves


def test_save_cursor_across_chunked_prefill_and_decode():
    w = World()
    r = w.request("a", range(10))  # 2 full blocks + 2 tokens
    w.s.get_num_new_matched_tokens(r, 0)
    w.s.update_state_after_alloc(r, blocks([7, 8]), 0)
    p = w.s.build_connector_meta(sched_out(new=[(r, [7, 8], 0, 6)]))  # chunk 1: 6 tokens
    assert p.saves["a"].block_ids == (7,)
    assert p.saves["a"].block_hashes == (r.block_hashes[0],)
    p = w.s.build_connector_meta(sched_out(cached=[("a", [9], 6, 4, False)]))  # chunk 2
    assert p.saves["a"].block_ids == (8,)
    # decode: block 2 (id 9, tokens 8..11) is full once token 11 is computed
    r.append_output_token_ids(100)  # token 10, computed in this step
    p = w.s.build_connector_meta(sched_out(cached=[("a", None, 10, 1, False)]))
    assert "a" not in p.saves
    r.append_output_token_ids(101)  # token 11
    p = w.s.build_connector_meta(sched_out(cached=[("a", None, 11, 1, False)]))
    assert p.saves["a"].block_ids == (9,)
    assert p.saves["a"].block_hashes == (r.block_hashes[2],)
    r.append_output_token_ids(102)
    p = w.s.build_connector_meta(sched_out(cached=[("a", [10], 12, 1, False)]))
    assert "a" not in p.saves


def test_only_publishable_block_hashes_are_saved():
    """vLLM main: blocks beyond request.num_publishable_block_hashes must not be stored
    by hash (successor-aware EAGLE hashing publishes them once the draft KV exists);
    they are saved in a later step, once publishable."""
    w = World()
    r = w.request("a", range(12))  # 3 full blocks
    r.mark_eagle_hashes_publishable(4, BS)  # only block 0 is publishable yet
    assert r.num_publishable_block_hashes == 1 < len(r.block_hashes)
    w.s.update_state_after_alloc(r, blocks([7, 8, 9]), 0)
    p = w.s.build_connector_meta(sched_out(new=[(r, [7, 8, 9], 0, 12)]))
    assert p.saves["a"].block_ids == (7,)
    r.mark_eagle_hashes_publishable(12, BS)
    r.append_output_token_ids(100)
    p = w.s.build_connector_meta(sched_out(cached=[("a", [10], 12, 1, False)]))
    assert p.saves["a"].block_ids == (8, 9)
    assert p.saves["a"].block_hashes == tuple(r.block_hashes[1:3])


def test_decode_fills_block_and_it_is_saved_exactly_once():
    w = World()
    r = w.request("a", range(6))
    w.s.update_state_after_alloc(r, blocks([3, 4]), 0)
    p = w.s.build_connector_meta(sched_out(new=[(r, [3, 4], 0, 6)]))
    assert p.saves["a"].block_ids == (3,)
    saved = []
    for i in range(6, 12):
        r.append_output_token_ids(50 + i)  # token i sampled; computed next step
        p = w.s.build_connector_meta(sched_out(cached=[("a", [5] if i == 8 else None, i, 1,
                                                        False)]))
        if "a" in p.saves:
            saved.append((i, p.saves["a"].block_ids))
    assert saved == [(7, (4,)), (11, (5,))]


def test_loaded_blocks_are_not_saved_again_and_null_block_never():
    w = World()
    r = w.request("a", range(17))
    w.store(r.block_hashes[:2])
    assert w.s.get_num_new_matched_tokens(r, 0) == (8, True)
    w.s.update_state_after_alloc(r, blocks([4, 5]), 8)
    w.s.build_connector_meta(sched_out())
    w.s.update_state_after_alloc(r, blocks([4, 5, 0, 6, 7]), 0)  # after the load
    p = w.s.build_connector_meta(sched_out(new=[(r, [4, 5, 0, 6, 7], 8, 9)]))
    assert p.saves["a"].block_ids == (6,)  # block index 2 is the null block (id 0)
    assert p.saves["a"].block_hashes == (r.block_hashes[3],)


def test_preemption_resumes_with_a_new_table_and_cursor():
    w = World()
    r = w.request("a", range(16))
    w.s.update_state_after_alloc(r, blocks([1, 2, 3, 4]), 0)
    p = w.s.build_connector_meta(sched_out(new=[(r, [1, 2, 3, 4], 0, 8)]))
    assert p.saves["a"].block_ids == (1, 2)
    p = w.s.build_connector_meta(sched_out(preempted={"a"}))
    assert p.preempted == {"a"}
    # re-admitted without local hits: all blocks are recomputed into new ids, saved again
    w.s.get_num_new_matched_tokens(r, 0)
    w.s.update_state_after_alloc(r, blocks([9, 10, 11, 12]), 0)
    p = w.s.build_connector_meta(sched_out(cached=[("a", [9, 10, 11, 12], 0, 16, True)]))
    assert p.saves["a"].block_ids == (9, 10, 11, 12)


def test_preemption_is_detected_without_preempted_req_ids():
    from vllm.v1.request import RequestStatus

    w = World()
    r = w.request("a", range(16))
    w.s.update_state_after_alloc(r, blocks([1, 2, 3, 4]), 0)
    w.s.build_connector_meta(sched_out(new=[(r, [1, 2, 3, 4], 0, 8)]))
    r.status = RequestStatus.PREEMPTED  # vLLM preempted it; the output does not say so
    assert w.s.build_connector_meta(sched_out(preempted=None)).preempted == {"a"}
    r.status = RequestStatus.RUNNING
    assert w.s.build_connector_meta(sched_out()).preempted == frozenset()


@pytest.mark.parametrize("legacy", [False, True])
def test_resumed_shapes(legacy):
    w = World()
    r = w.request("a", range(8))
    w.s.update_state_after_alloc(r, blocks([1, 2]), 0)
    w.s.build_connector_meta(sched_out(new=[(r, [1, 2], 0, 4)]))
    w.s.build_connector_meta(sched_out(preempted={"a"}))
    w.s.update_state_after_alloc(r, blocks([5, 6]), 0)
    p = w.s.build_connector_meta(sched_out(cached=[("a", [5, 6], 0, 8, True)], legacy=legacy))
    assert p.saves["a"].block_ids == (5, 6)


def test_save_only_saves_the_prefix_another_connector_loaded():
    w = World(mode="save_only")
    r = w.request("a", range(12))
    w.s.update_state_after_alloc(r, blocks([1, 2, 3], hashed=2), 0)
    p = w.s.build_connector_meta(sched_out(new=[(r, [1, 2, 3], 8, 4)]))
    assert p.saves["a"].block_ids == (1, 2, 3)


def test_request_finished_holds_blocks_until_finished_sending():
    from vllm.v1.outputs import KVConnectorOutput

    w = World()
    r = w.request("a", range(8))
    w.s.update_state_after_alloc(r, blocks([1, 2]), 0)
    w.s.build_connector_meta(sched_out(new=[(r, [1, 2], 0, 8)]))
    assert w.s.request_finished(r, [1, 2]) == (True, None)
    assert w.s.has_pending_push_work()
    w.s.update_connector_output(KVConnectorOutput(finished_sending={"a"}))
    assert not w.s.has_pending_push_work() and "a" not in w.s._reqs
    r2 = w.request("b", range(3))  # never a full block: nothing to save
    w.s.update_state_after_alloc(r2, blocks([3]), 0)
    w.s.build_connector_meta(sched_out(new=[(r2, [3], 0, 3)]))
    assert w.s.request_finished(r2, [3]) == (False, None)


def test_failed_load_blocks_are_saved_after_recompute():
    from vllm.v1.outputs import KVConnectorOutput

    w = World()
    r = w.request("a", range(17))
    w.store(r.block_hashes)
    w.s.get_num_new_matched_tokens(r, 0)
    w.s.update_state_after_alloc(r, blocks([4, 5, 6, 7]), 16)
    w.s.build_connector_meta(sched_out())
    w.s.update_connector_output(KVConnectorOutput(finished_recving={"a"},
                                                  invalid_block_ids={6}))
    w.s.update_state_after_alloc(r, blocks([4, 5, 6, 7, 8]), 0)
    p = w.s.build_connector_meta(sched_out(new=[(r, [4, 5, 6, 7, 8], 8, 9)]))
    assert p.saves["a"].block_ids == (6, 7)


def test_plan_is_picklable():
    import pickle

    w = World()
    r = w.request("a", range(8))
    w.s.update_state_after_alloc(r, blocks([1, 2]), 0)
    p = w.s.build_connector_meta(sched_out(new=[(r, [1, 2], 0, 8)], preempted={"x"}))
    q = pickle.loads(pickle.dumps(p))
    assert q == p


# ------------------------------------------------------------------ session


def test_session_opened_and_reopened_when_lost():
    w = World()
    assert w.s.session is not None and w.s.session.alive()
    assert w.server.count("session_open") == 1
    w.server.sessions["inst"] = 99  # superseded / server restarted
    # the server answers: the Session again at once, not after the retry interval
    assert w.s.ensure_session() and w.server.count("session_open") == 2


def test_session_end_probes_the_server_on_a_fresh_channel_then_reopens():
    w = World()
    w.server.restart()  # the server process is gone: the Session ends ...
    w.server.down = True  # ... and the new one is not listening yet
    assert w.s.ensure_session() is False
    assert w.server.count("health") == 1 and w.server.count("session_open") == 1
    assert w.s.ensure_session() is False  # inside the probe pause: not asked again
    assert w.server.count("health") == 1
    w.clock.advance(0.1)
    assert w.s.ensure_session() is False and w.server.count("health") == 2
    w.server.down = False  # the new process answers
    w.clock.advance(0.1)
    assert w.s.ensure_session() and w.server.count("health") == 3
    assert w.server.count("reconnect") == 1 and w.server.count("session_open") == 2


def test_session_open_failure_does_not_raise():
    clock = FakeClock()
    srv = FakeServer(clock)
    srv.down = True
    s = SchedulerConnector(ConnectorContext("inst", "ns", BS), FakeEngineClient(srv),
                           clock=clock, session_thread=False)
    assert s.session is None
    srv.down = False
    clock.advance(10)
    assert s.ensure_session()
    s.shutdown()
    assert s.session is None


def test_router_events_from_hits_and_misses():
    """Hit blocks are announced stored (once); an unreachable server is no answer; a
    server answer that no longer has them reports them removed."""
    w = World()
    r = w.request("a", range(13))  # 3 full blocks
    w.store(r.block_hashes)
    n, _ = w.s.get_num_new_matched_tokens(r, 0)
    assert n == 12
    w.s.update_state_after_alloc(r, blocks([5, 6, 7, 8]), n)
    ev = w.s.take_events()
    assert [(e[0], e[1]) for e in ev] == [("stored", bytes(h)) for h in r.block_hashes]
    assert ev[1][2] == bytes(r.block_hashes[0]) and ev[1][3] == [4, 5, 6, 7]
    assert w.s.take_events() == []
    w.server.down = True
    w.s.get_num_new_matched_tokens(w.request("b", range(13)), 0)
    assert w.s.take_events() == []  # UNAVAILABLE: nothing known
    w.server.down = False
    w.server.blocks.clear()
    w.s.get_num_new_matched_tokens(w.request("c", range(13)), 0)
    assert w.s.take_events() == [("removed", bytes(h)) for h in r.block_hashes]
