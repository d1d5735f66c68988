"""End-to-end step loop: scheduler + N TP workers driven in vLLM's call order (harness.py,
a model of vLLM main @003df29) with KV caches in "GPU" memory, against

  * fake: the in-memory FakeServer (always runs; checks the connector and the harness),
  * real: pegaflow-server (--gpu-backend sim) through libpegaflow, KV caches as numpy
          arrays over sim-GPU shared memory (skips, saying why, while PF_BIN is unset or
          the library/server lack the engine).

Every loaded block is compared byte for byte with what the saving request wrote.
"""

from __future__ import annotations

import time
import uuid

import pytest

from conftest import REAL_VLLM, require_engine_server
from harness import Engine, FakeBackend, RealBackend

pytestmark = pytest.mark.skipif(REAL_VLLM, reason="SKIP: the harness drives the vLLM stub; "
                                "a real vLLM is installed")

PROMPT_A = [1000 + (i * 37) % 5000 for i in range(80)]  # 5 blocks of 16


class FakeWorld:
    name = "fake"

    def __init__(self):
        from fakes import FakeServer

        self.server = FakeServer(clock=time.monotonic)
        self.backend = FakeBackend(self.server)

    def kill_server(self):
        self.server.down = True

    def restart_server(self):
        from fakes import FakeServer

        fresh = FakeServer(clock=time.monotonic)
        self.server.__dict__.update(fresh.__dict__)

    def lease_released(self, lease: bytes) -> bool:
        return lease not in self.server.leases

    def visible(self, instance_id: str, hashes, group: int = 0) -> int:
        q = self.server.query(instance_id, "probe-" + uuid.uuid4().hex, list(hashes), False,
                              group)
        if q.lease:
            self.server.release(q.lease)
        return q.num_hit_blocks

    def close(self):
        pass


class RealWorld:
    name = "real"

    def __init__(self, server_factory, lib):
        from pegaflow.client.engine import EngineClient

        self.factory = server_factory
        self.lib = lib
        self.srv = server_factory("server")
        self.client = EngineClient(self.srv.target, lib=lib, timeout_ms=5000)
        require_engine_server(self.client)
        self.backend = RealBackend(self.srv.target, lib)
        self.restarts = 0

    def kill_server(self):
        self.srv.kill()

    def restart_server(self):
        self.restarts += 1
        self.srv = self.factory(f"server{self.restarts}", port=self.srv.port)

    def lease_released(self, lease: bytes) -> bool:
        from pegaflow.client.errors import FailedPrecondition

        try:
            self.client.release(lease)
        except FailedPrecondition:
            return True
        return False

    def visible(self, instance_id: str, hashes, group: int = 0) -> int:
        q = self.client.query_raw(instance_id, "probe-" + uuid.uuid4().hex, list(hashes),
                                  group_id=group)
        if q.lease:
            self.client.release(q.lease)
        return 0 if q.loading else q.num_hit_blocks

    def close(self):
        self.client.close()


@pytest.fixture(params=["fake", "real"])
def world(request, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    if request.param == "fake":
        w = FakeWorld()
    else:
        w = RealWorld(request.getfixturevalue("server_factory"),
                      request.getfixturevalue("engine_lib"))
    yield w
    w.close()


@pytest.fixture
def engines(world, monkeypatch):
    made = []

    def make(instance_id=None, **kw):
        e = Engine(world.backend, monkeypatch.setattr,
                   instance_id=instance_id or "inst-" + uuid.uuid4().hex[:8], **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        try:
            e.shutdown()
        except Exception:
            pass


def wait_visible(world, engine, req, n=None, timeout=10.0, group=0, hashes=None):
    hashes = req.block_hashes if hashes is None else hashes
    n = len(hashes) if n is None else n
    deadline = time.monotonic() + timeout
    got = 0
    while time.monotonic() < deadline:
        got = world.visible(engine.vllm_config.kv_transfer_config.engine_id,
                            hashes[:n] if hashes is req.block_hashes else hashes, group)
        if got >= n:
            return
        time.sleep(0.01)
    raise AssertionError(f"only {got}/{n} blocks of {req.request_id} visible after {timeout}s")


def run_a(world, engines, cross: bool, monkeypatch, **kw):
    """Request A misses, computes, saves; returns (engine, request)."""
    monkeypatch.setenv("PEGAFLOW_CROSS_LAYER_BLOCKS", "1" if cross else "0")
    e1 = engines(**kw)
    assert e1.cross is cross
    a = e1.add_request("A", PROMPT_A, max_tokens=4)
    e1.run()
    la = e1.logs["A"]
    assert la.loaded_blocks == 0 and la.waited_remote_steps == 0
    assert la.finished_status.name == "FINISHED_LENGTH_CAPPED"
    assert la.delayed_free and la.freed, "blocks must be held until the saves completed"
    assert e1.free_block_count() == e1.num_blocks - 1
    assert len(la.snapshot) == 5
    wait_visible(world, e1, a)
    return e1, a


def assert_loaded_equal(eng, rid, ref_snapshot, nblocks):
    lg = eng.logs[rid]
    assert lg.loaded_blocks == nblocks and len(lg.loaded) == nblocks
    for hsh, per_worker in lg.loaded.items():
        assert per_worker == ref_snapshot[hsh], f"{rid}: block {hsh.hex()[:8]} differs"
        assert any(any(b) for b in per_worker), "loaded block is all zeros"


@pytest.mark.parametrize("cross", [False, True], ids=["per-layer", "cross-layer"])
def test_miss_save_then_hit_load(world, engines, monkeypatch, cross):
    e1, a = run_a(world, engines, cross, monkeypatch)
    snap = e1.logs["A"].snapshot
    e1.shutdown()

    e2 = engines()  # another "vLLM launch": new instance, zeroed caches, same namespace
    assert e2.sched._ctx.namespace == e1.sched._ctx.namespace
    assert all(not t.numpy().any() for kv in e2.kv for t in kv.values())
    e2.add_request("B", PROMPT_A, max_tokens=4)
    e2.run()
    assert_loaded_equal(e2, "B", snap, 5)
    assert not e2.logs["B"].load_failed
    assert e2.sched._scheduler.stats["hit_tokens"] == 79  # the last prompt token recomputed
    assert e2.requests["B"].output_token_ids == e1.requests["A"].output_token_ids
    assert e2.free_block_count() == e2.num_blocks - 1


def test_tp1(world, engines, monkeypatch):
    e1, a = run_a(world, engines, False, monkeypatch, tp=1)
    e2 = engines(tp=1)
    e2.add_request("B", PROMPT_A, max_tokens=2)
    e2.run()
    assert_loaded_equal(e2, "B", e1.logs["A"].snapshot, 5)


def test_partial_prefix_hit(world, engines, monkeypatch):
    e1, a = run_a(world, engines, False, monkeypatch)
    e2 = engines()
    prompt_c = PROMPT_A[:48] + [7 + i for i in range(40)]
    c = e2.add_request("C", prompt_c, max_tokens=3)
    e2.run()
    assert_loaded_equal(e2, "C", e1.logs["A"].snapshot, 3)
    assert e2.sched._scheduler.stats["hit_tokens"] == 48
    # C's own new blocks were saved: a third engine hits all 5 of C's blocks
    wait_visible(world, e2, c)
    e3 = engines()
    e3.add_request("C2", prompt_c, max_tokens=1)
    e3.run()
    assert_loaded_equal(e3, "C2", e2.logs["C"].snapshot, 5)


def test_abort_before_commit_releases_the_lease(world, engines, monkeypatch):
    e1, a = run_a(world, engines, False, monkeypatch)
    e2 = engines(num_blocks=4)  # 3 usable blocks: the 5-block load cannot be allocated
    e2.add_request("B", PROMPT_A, max_tokens=2)
    e2.step()
    probe = e2.sched._scheduler._probes["B"]
    assert probe.hit_blocks == 5 and probe.lease
    e2.step()  # vLLM asks again: the memoised probe answers, no second lease
    assert e2.sched._scheduler._probes["B"] is probe
    if world.name == "fake":  # (checking it on the real server would release it)
        assert probe.lease in world.server.leases and len(world.server.leases) == 1
    lease = probe.lease
    e2.abort("B")
    assert "B" not in e2.sched._scheduler._probes
    assert world.lease_released(lease)
    e2.run()
    assert e2.idle()


def test_abort_while_loading_frees_after_the_load(world, engines, monkeypatch):
    e1, a = run_a(world, engines, False, monkeypatch)
    e2 = engines()
    e2.add_request("B", PROMPT_A, max_tokens=2)
    seen = []

    def abort_during_load(so):  # after the commit, before the workers start the load
        if so.kv_connector_metadata.plan.loads:
            assert e2.requests["B"].status.name == "WAITING_FOR_REMOTE_KVS"
            e2.abort("B")
            seen.append("B" in e2.delayed)  # vLLM keeps the blocks until the load reports

    e2.before_workers = abort_during_load
    e2.run()
    assert seen == [True]
    assert e2.idle() and e2.free_block_count() == e2.num_blocks - 1


def test_server_killed_mid_run(world, engines, monkeypatch):
    e1, a = run_a(world, engines, False, monkeypatch)
    e2 = engines()
    e2.add_request("B", PROMPT_A, max_tokens=3)
    killed = []

    def kill_before_load(so):
        if so.kv_connector_metadata.plan.loads and not killed:
            world.kill_server()
            killed.append(True)

    e2.before_workers = kill_before_load
    e2.add_request("C", [3] * 40, max_tokens=3)  # misses; its saves fail silently
    e2.run()
    assert killed
    lb = e2.logs["B"]
    assert lb.load_failed and lb.loaded_blocks == 0
    assert lb.finished_status.name == "FINISHED_LENGTH_CAPPED"
    # recomputed locally: greedy output identical to A's
    assert e2.requests["B"].output_token_ids == e1.requests["A"].output_token_ids[:3]
    assert e2.logs["C"].finished_status.name == "FINISHED_LENGTH_CAPPED"
    assert e2.idle() and e2.free_block_count() == e2.num_blocks - 1
    # queries against the dead server are misses, never errors
    e2.add_request("D", PROMPT_A, max_tokens=1)
    e2.run()
    assert e2.logs["D"].loaded_blocks == 0
    # the server comes back (empty): the connector keeps working (misses), and the first
    # Save that reaches it fails with "instance ... not found", which makes the workers
    # register again: caching resumes without restarting vLLM. (The clients reconnect
    # with gRPC's backoff, so this takes a few requests / seconds.)
    world.restart_server()
    deadline = time.monotonic() + 30
    i = 0
    # the workers re-register and the scheduler sees its server back (its Session reopened
    # and its channel's reconnect backoff reset: scheduler.py _server_back); until both,
    # requests are misses
    sch = e2.sched._scheduler
    # (a Session object is not enough: the dead one stays in place until the scheduler's
    # keeper notices that it ended, and until then its channel still sits in gRPC's backoff)
    while not (all(w._worker.stats.get("reregistrations") for w in e2.workers)
               and not any(sch._down)
               and all(x is not None and x.alive() for x in sch.sessions)):
        assert time.monotonic() < deadline, "the workers did not register again within 30 s"
        rid = f"E{i}"
        # a prompt of its own: once the workers have registered again, E{i}'s saves land,
        # and the same prompt would hit them in E{i+1} before the scheduler's Session is back
        e2.add_request(rid, [20000 + 100 * i + k for k in range(len(PROMPT_A))], max_tokens=1)
        e2.run()
        assert e2.logs[rid].finished_status.name == "FINISHED_LENGTH_CAPPED"
        assert e2.logs[rid].loaded_blocks == 0
        i += 1
        time.sleep(0.1)
    assert all(w._worker.stats["reregistrations"] == 1 for w in e2.workers)
    prompt_g = [9000 + i for i in range(64)]
    g = e2.add_request("G", prompt_g, max_tokens=1)
    e2.run()
    wait_visible(world, e2, g)
    e2.add_request("H", prompt_g, max_tokens=1)
    e2.run()
    assert_loaded_equal(e2, "H", e2.logs["G"].snapshot, 4)


def test_load_failure_with_policy_fail(world, engines, monkeypatch):
    e1, a = run_a(world, engines, False, monkeypatch)
    e2 = engines(policy="fail")
    e2.add_request("B", PROMPT_A, max_tokens=3)
    e2.before_workers = lambda so: so.kv_connector_metadata.plan.loads and world.kill_server()
    e2.run()
    assert e2.logs["B"].finished_status.name == "FINISHED_ERROR"
    assert e2.idle()


@pytest.mark.parametrize("report", [True, False], ids=["preempted-listed", "status-only"])
def test_preemption_under_block_pressure_keeps_saved_bytes_right(world, engines, monkeypatch,
                                                                 report):
    """Saves still reading a preempted request's blocks finish before the blocks are
    reused (handle_preemptions), whether or not vLLM lists the preemption."""
    monkeypatch.setenv("PEGAFLOW_CROSS_LAYER_BLOCKS", "0")
    if world.name == "fake":
        world.server.save_delay_s = 0.005  # saves lag behind the forward: races show
    e1 = engines(num_blocks=12, token_budget=48,  # 11 usable blocks for 3 x (4..6) blocks
                 report_preempted=report)
    prompts = {f"P{i}": [500 * (i + 1) + j for j in range(64)] for i in range(3)}
    for rid, p in prompts.items():
        e1.add_request(rid, p, max_tokens=24)
    e1.run(max_steps=600)
    assert sum(lg.preemptions for lg in e1.logs.values()) > 0, "no preemption happened"
    assert all(lg.finished_status.name == "FINISHED_LENGTH_CAPPED" for lg in e1.logs.values())
    assert e1.free_block_count() == e1.num_blocks - 1
    # what the server holds is what the requests computed
    if world.name == "fake":
        world.server.save_delay_s = 0.0
    e2 = engines()
    for rid, p in prompts.items():
        req = e1.requests[rid]
        wait_visible(world, e1, req, n=4)
        e2.add_request(rid + "b", p, max_tokens=1)
    e2.run()
    for rid in prompts:
        snap = e1.logs[rid].snapshot
        lg = e2.logs[rid + "b"]
        assert lg.loaded_blocks == 4
        for hsh, blocks in lg.loaded.items():
            assert blocks == snap[hsh]


def test_loading_server_answers_are_retried(engines, monkeypatch):
    """Fake only: the C server answers Loading only with an SSD/P2P tier."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    w = FakeWorld()
    e1 = Engine(w.backend, monkeypatch.setattr, instance_id="l1")
    e1.add_request("A", PROMPT_A, max_tokens=1)
    e1.run()
    e2 = Engine(w.backend, monkeypatch.setattr, instance_id="l2")
    w.server.loading["B"] = 3
    e2.add_request("B", PROMPT_A, max_tokens=1)
    e2.run()
    assert e2.logs["B"].loaded_blocks == 5
    assert sum(1 for m, kw in w.server.calls if m == "query" and kw["req_id"] == "B") == 4
    e1.shutdown()
    e2.shutdown()


# ------------------------------------------------------------------ vLLM stats / metrics


def _frontend_stats(engine):
    """What vLLM's frontend builds from the SchedulerStats it received (KVConnectorLogging
    rebuilds each dict with build_kv_connector_stats and aggregates them)."""
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging

    logging_ = KVConnectorLogging(engine.vllm_config.kv_transfer_config)
    for data in engine.stats_log:
        logging_.observe(data)
    acc = logging_.transfer_stats_accumulator
    return acc, logging_


@pytest.mark.parametrize("mode", ["main", "legacy"])
def test_connector_stats_reach_vllm(world, engines, monkeypatch, mode):
    """Scheduler-side hit/miss tokens and worker-side load/save counts, bytes and
    latencies travel the way vLLM ships them (per-worker objects aggregated, the
    scheduler's added, the dict rebuilt in the frontend) and add up exactly."""
    import numpy as np

    from harness import DTYPE

    monkeypatch.setenv("PEGAFLOW_CROSS_LAYER_BLOCKS", "0")
    e1 = engines(stats_mode=mode)
    a = e1.add_request("A", PROMPT_A, max_tokens=4)
    e1.run()
    wait_visible(world, e1, a)
    block_bytes = e1.L * 2 * e1.bs * e1.heads * e1.head_dim * np.dtype(DTYPE).itemsize
    s1, _ = _frontend_stats(e1)
    d1 = s1.data
    assert d1.get("hit_tokens_ram", 0) == 0 and d1["miss_tokens"] == 80
    assert d1["save_blocks"] == 5 * e1.tp and d1["save_bytes"] == 5 * e1.tp * block_bytes
    assert d1["save_success"] == len(d1["save_duration_s"]) >= e1.tp
    assert not d1.get("save_failures") and not d1.get("load_success")
    e2 = engines(stats_mode=mode)
    e2.add_request("B", PROMPT_A, max_tokens=4)
    e2.run()
    s2, logging_ = _frontend_stats(e2)
    d2 = s2.data
    assert d2["hit_tokens_ram"] == 79 and d2["miss_tokens"] == 1
    assert d2["load_success"] == e2.tp and not d2.get("load_failures")
    assert d2["load_blocks"] == 5 * e2.tp and d2["load_bytes"] == 5 * e2.tp * block_bytes
    assert len(d2["load_duration_s"]) == e2.tp and all(t >= 0 for t in d2["load_duration_s"])
    assert d2["load_op_blocks"] == [5] * e2.tp
    red = s2.reduce()
    assert red["pega_hit_tokens"] == 79 and red["pega_hit_rate"] == round(79 / 80, 4)
    assert red["pega_load_MB"] == round(5 * e2.tp * block_bytes / 2**20, 3)
    lines = []
    logging_.log(log_fn=lambda fmt, *a: lines.append(fmt % a))
    assert len(lines) == 1 and "pega_hit_tokens=79" in lines[0]


def test_load_failures_are_counted(world, engines, monkeypatch):
    e1, a = run_a(world, engines, False, monkeypatch)
    e2 = engines()
    e2.add_request("B", PROMPT_A, max_tokens=3)
    e2.before_workers = lambda so: so.kv_connector_metadata.plan.loads and world.kill_server()
    e2.run()
    d, _ = _frontend_stats(e2)
    assert d.data["load_failures"] == e2.tp and not d.data.get("load_success")
    assert d.data["hit_tokens_ram"] == 79  # committed before the server went away


def test_prometheus_series_on_vllms_metrics(world, engines, monkeypatch):
    """vLLM's /metrics: KVConnectorPrometheus builds our metrics once and observes every
    stats dict; the exposition shows the vllm:pega_* series with the right values."""
    prom = pytest.importorskip("prometheus_client", reason="SKIP: prometheus_client is "
                               "not installed (Debian python3-prometheus-client)")
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPrometheus

    reg = prom.CollectorRegistry()

    def bound(cls):
        class Bound(cls):
            def __init__(self, *a, **k):
                super().__init__(*a, registry=reg, **k)
        return Bound

    class Prom(KVConnectorPrometheus):
        _gauge_cls = bound(prom.Gauge)
        _counter_cls = bound(prom.Counter)
        _histogram_cls = bound(prom.Histogram)

    e1, a = run_a(world, engines, False, monkeypatch)
    e2 = engines()
    e2.add_request("B", PROMPT_A, max_tokens=3)
    e2.run()
    p = Prom(e2.vllm_config, ["model_name", "engine"], {0: ["tiny", "0"]})
    for data in e1.stats_log + e2.stats_log:
        p.observe(data, 0)
    text = prom.generate_latest(reg).decode()
    lab = 'engine="0",model_name="tiny"'

    def value(series):
        for line in text.splitlines():
            if line.startswith(series + " "):
                return float(line.split()[-1])
        raise AssertionError(f"{series} not exposed:\n{text}")

    assert value(f'vllm:pega_hit_tokens_total{{{lab},tier="ram"}}') == 79
    assert value(f'vllm:pega_hit_tokens_total{{{lab},tier="miss"}}') == 81  # A's 80 + B's 1
    assert value(f"vllm:pega_load_success_total{{{lab}}}") == e2.tp
    assert value(f"vllm:pega_load_failure_total{{{lab}}}") == 0
    assert value(f"vllm:pega_save_failure_total{{{lab}}}") == 0
    assert value(f"vllm:pega_save_success_total{{{lab}}}") >= e1.tp
    assert value(f"vllm:pega_load_bytes_total{{{lab}}}") > 0
    assert value(f"vllm:pega_load_duration_seconds_count{{{lab}}}") == e2.tp
    assert value('vllm:pega_load_blocks_bucket{engine="0",le="8.0",model_name="tiny"}') \
        == e2.tp
    assert value(f"vllm:pega_save_duration_seconds_count{{{lab}}}") >= e1.tp


# ------------------------------------------------------------------ KV events


def _stored(engine):
    from vllm.distributed.kv_events import BlockStored

    return [e for e in engine.events if isinstance(e, BlockStored)]


def _removed(engine):
    from vllm.distributed.kv_events import BlockRemoved

    return [e for e in engine.events if isinstance(e, BlockRemoved)]


def test_kv_events_for_a_router(world, engines, monkeypatch):
    """BlockStored once every TP worker saved a block (with its tokens, parent and
    block size, medium CPU); a second vLLM announces what it hit; BlockRemoved for
    announced blocks a later query no longer finds (the server restarted)."""
    from vllm.distributed.kv_events import MEDIUM_CPU

    e1, a = run_a(world, engines, False, monkeypatch)
    st = _stored(e1)
    hashes = [bytes(h) for h in a.block_hashes]
    assert [e.block_hashes for e in st] == [[h] for h in hashes]  # each once, in order
    assert [e.parent_block_hash for e in st] == [None] + hashes[:-1]
    assert [e.token_ids for e in st] == [PROMPT_A[16 * i:16 * (i + 1)] for i in range(5)]
    assert all(e.block_size == 16 and e.medium == MEDIUM_CPU and e.lora_id is None
               for e in st)
    assert not _removed(e1)
    e2 = engines()
    e2.add_request("B", PROMPT_A, max_tokens=2)
    e2.run()
    assert [e.block_hashes for e in _stored(e2)] == [[h] for h in hashes]  # hit: announced
    world.kill_server()
    world.restart_server()  # everything PegaFlow held on this node is gone
    # until e2's channel reconnected (gRPC backoff): an unreachable server is no answer,
    # so nothing is reported removed before the server could say so
    deadline = time.monotonic() + 30
    i = 0
    while not _removed(e2):
        assert time.monotonic() < deadline, "no BlockRemoved 30 s after the restart"
        i += 1
        e2.add_request(f"B{i + 1}", PROMPT_A, max_tokens=1)
        e2.run()
    assert [e.block_hashes for e in _removed(e2)] == [[h] for h in hashes]
    assert all(e.medium == MEDIUM_CPU for e in _removed(e2))


def test_kv_events_need_every_worker(engines, monkeypatch):
    """Fake only: a block one TP worker failed to save is not announced."""
    from pegaflow.client.errors import Internal

    monkeypatch.setenv("PYTHONHASHSEED", "0")
    w = FakeWorld()
    e1 = Engine(w.backend, monkeypatch.setattr, instance_id="ev1")
    w.server.fail_next["save"] = Internal("pf_client_save", -5, 13, "injected")
    e1.add_request("A", PROMPT_A[:32], max_tokens=1)  # 2 blocks, saved in one step
    e1.run()
    assert _stored(e1) == [] and w.server.count("save") == 2
    e1.add_request("C", PROMPT_A[:32] + [9] * 16, max_tokens=1)
    e1.run()  # C hits A's blocks? no: one worker lacks them, so the query misses
    e1.shutdown()


# ------------------------------------------------------------------ hybrid


def test_hybrid_attention_and_state_groups_through_the_step_loop(world, engines, monkeypatch):
    """An attention group and a Mamba-style state group (vLLM's hybrid manager on,
    SupportsHMA): A prefills in two chunks ending on block boundaries (states after 4
    and 5 blocks saved), B resumes at 4 blocks (5 would leave no token to compute) with
    the state of block 3 loaded byte-exact, then computes the rest."""
    e1 = engines(hybrid=True)
    assert not e1.cross and e1.sched._ctx.hybrid
    a = e1.add_request("A", PROMPT_A, max_tokens=4)
    e1.run()
    la = e1.logs["A"]
    assert la.delayed_free and la.freed and la.loaded_blocks == 0
    wait_visible(world, e1, a)
    wait_visible(world, e1, a, n=2, group=1, hashes=a.block_hashes[3:5])
    e2 = engines(hybrid=True)
    e2.add_request("B", PROMPT_A, max_tokens=4)
    e2.run()
    lb = e2.logs["B"]
    assert lb.loaded_blocks == 4 and lb.states_checked == 1 and not lb.load_failed
    for h, per_worker in lb.loaded.items():
        assert per_worker == la.snapshot[h]
    assert e2.sched._scheduler.stats["hit_tokens"] == 64
    assert e2.requests["B"].output_token_ids == e1.requests["A"].output_token_ids
    assert e2.free_block_count() == e2.num_blocks - 1


def test_hybrid_prefix_shorter_than_the_saved_states(world, engines, monkeypatch):
    """C shares 3 blocks with A; A's states exist after 4 and 5 blocks only: no resume
    point inside the shared prefix, so C computes everything (the prefix lease is
    released), and its own saves then add states at its chunk boundaries."""
    e1 = engines(hybrid=True)
    a = e1.add_request("A", PROMPT_A, max_tokens=2)
    e1.run()
    wait_visible(world, e1, a, n=2, group=1, hashes=a.block_hashes[3:5])
    e2 = engines(hybrid=True)
    prompt_c = PROMPT_A[:48] + [9 + i for i in range(40)]
    e2.add_request("C", prompt_c, max_tokens=2)
    e2.run()
    lc = e2.logs["C"]
    assert lc.loaded_blocks == 0 and lc.states_checked == 0
    st = e2.sched._scheduler.stats
    assert st["hits"] == 0 and st["releases"] == 1 and st["release_errors"] == 0


# ------------------------------------------------------------------ MLA


def test_mla_tp4_through_the_step_loop(world, engines, monkeypatch):
    """MLA on TP=4 through the facade: page-first registration, each rank saves 1/4 of
    the blocks, every block counts as stored once all four reported it (KV events), and
    another vLLM's four ranks load every block byte-exact."""
    e1 = engines(mla=True, tp=4)
    ctx = e1.workers[1]._ctx
    assert ctx.page_first and ctx.stripe_saves and (ctx.tp_size, ctx.world_size) == (1, 4)
    a = e1.add_request("A", PROMPT_A, max_tokens=3)
    e1.run()
    wait_visible(world, e1, a)
    saved = [w._worker.stats["saved_blocks"] for w in e1.workers]
    assert sum(saved) == 5 and max(saved) <= 2  # blocks of A split over the ranks
    stored = {h for ev in e1.events if type(ev).__name__ == "BlockStored"
              for h in ev.block_hashes}
    assert stored >= set(a.block_hashes[:5])
    e2 = engines(mla=True, tp=4)
    e2.add_request("B", PROMPT_A, max_tokens=3)
    e2.run()
    assert_loaded_equal(e2, "B", e1.logs["A"].snapshot, 5)
    assert e2.requests["B"].output_token_ids == e1.requests["A"].output_token_ids


# ------------------------------------------------------------------ TP over two hosts


def test_tp_group_over_two_servers_through_the_step_loop(world, monkeypatch):
    """TP=4 over two servers (pegaflow.tp_shard_endpoints): ranks 0-1 register with
    server 0, ranks 2-3 with server 1, each as a local TP=2 topology; B (another vLLM)
    loads A's blocks with one lease per shard; with server 1 killed, C misses and
    recomputes, with the same outputs."""
    from fakes import FakeServer
    from harness import ShardedBackend

    from pegaflow.client.engine import EngineClient

    if world.name == "fake":
        srv2 = FakeServer(clock=time.monotonic)
        b2 = FakeBackend(srv2)
        eps = ["fake-0:1", "fake-1:1"]

        def visible2(iid, hs):
            q = srv2.query(iid, "probe-" + uuid.uuid4().hex, list(hs))
            if q.lease:
                srv2.release(q.lease)
            return q.num_hit_blocks

        def kill2():
            srv2.down = True
    else:
        proc2 = world.factory("server-b")
        b2 = RealBackend(proc2.target, world.lib)
        eps = [world.srv.target, proc2.target]
        c2 = EngineClient(proc2.target, lib=world.lib, timeout_ms=5000)

        def visible2(iid, hs):
            q = c2.query_raw(iid, "probe-" + uuid.uuid4().hex, list(hs))
            if q.lease:
                c2.release(q.lease)
            return 0 if q.loading else q.num_hit_blocks

        def kill2():
            proc2.kill()
    backend = ShardedBackend({eps[0]: world.backend, eps[1]: b2})
    made = []

    def engine(iid):
        e = Engine(backend, monkeypatch.setattr, instance_id=iid, tp=4,
                   extra_config={"pegaflow.tp_shard_endpoints": eps})
        made.append(e)
        return e

    try:
        e1 = engine("tp-a")
        w3 = e1.workers[3]._ctx
        assert (w3.shard_index, w3.tp_rank, w3.tp_size, w3.world_size) == (1, 1, 2, 2)
        assert w3.namespace.endswith(":tp-shard-1-of-2")
        assert all(s is not None for s in e1.sched._scheduler.sessions)
        a = e1.add_request("A", PROMPT_A, max_tokens=3)
        e1.run()
        wait_visible(world, e1, a)
        deadline = time.monotonic() + 10
        while visible2("tp-a", a.block_hashes[:5]) < 5:
            assert time.monotonic() < deadline, "shard 1 never held A's blocks"
            time.sleep(0.01)
        e2 = engine("tp-b")
        e2.add_request("B", PROMPT_A, max_tokens=3)
        e2.run()
        assert_loaded_equal(e2, "B", e1.logs["A"].snapshot, 5)
        assert e2.requests["B"].output_token_ids == e1.requests["A"].output_token_ids
        e3 = engine("tp-c")  # (registration with a server that is down fails start-up)
        kill2()
        e3.add_request("C", PROMPT_A, max_tokens=3)
        e3.run()
        assert e3.logs["C"].loaded_blocks == 0 and not e3.logs["C"].load_failed
        assert e3.requests["C"].output_token_ids == e1.requests["A"].output_token_ids
    finally:
        for e in made:
            try:
                e.shutdown()
            except Exception:
                pass
