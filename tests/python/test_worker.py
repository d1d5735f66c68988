"""Worker side: registration, loads (success, RPC failure, error state, timeout on a fake
clock), saves on the background thread (after their save fence, failures still
complete the lifecycle), get_finished semantics, handle_preemptions, shutdown."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from fakes import FakeClock, FakeEngineClient, FakeServer, HostDeviceAdapter, HostTensor
from pegaflow.client.errors import Internal
from pegaflow.connector.config import ConnectorContext
from pegaflow.connector.plan import LoadIntent, SaveIntent, StepPlan
from pegaflow.connector.worker import WorkerConnector

BS, N, H, D = 4, 16, 2, 8
LAYERS = ["l0", "l1"]


def h(i: int) -> bytes:
    return bytes([i]) * 32


class W:
    def __init__(self, rank=0, tp=1, server=None, clock=None, thread=False,
                 reregister_interval_s=None, **ctx_kw):
        wkw = {} if reregister_interval_s is None else \
            {"reregister_interval_s": reregister_interval_s}
        self.clock = clock or FakeClock()
        self.server = server or FakeServer(self.clock)
        self.client = FakeEngineClient(self.server)
        self.dev = HostDeviceAdapter(rank)
        kw = dict(tp_rank=rank, tp_size=tp, world_size=tp, physical_tp_rank=rank)
        kw.update(ctx_kw)
        self.ctx = ConnectorContext("inst", "ns", BS, **kw)
        self.w = WorkerConnector(self.ctx, self.client, self.dev, clock=self.clock,
                                 save_thread=thread, watch_thread=False, **wkw)
        self.kv = {n: HostTensor(np.zeros((2, N, BS, H, D), np.uint16), rank) for n in LAYERS}

    def register(self):
        self.w.register_kv_caches(self.kv)
        return self

    def fill(self, block: int, value: int):
        for t in self.kv.values():
            t.numpy()[:, block] = value

    def block(self, block: int) -> list[np.ndarray]:
        return [t.numpy()[:, block].copy() for t in self.kv.values()]


def test_register_sends_inferred_layouts():
    x = W().register()
    (m, kw), = [c for c in x.server.calls if c[0] == "register"]
    a = kw["args"]
    assert [l.name for l in a.layers] == LAYERS
    l0 = a.layers[0]
    assert (l0.num_blocks, l0.bytes_per_block, l0.kv_stride_bytes, l0.segments) == \
        (N, BS * H * D * 2, N * BS * H * D * 2, 2)
    assert l0.ipc.startswith(b"host:")
    assert (a.instance_id, a.namespace, a.tp_rank, a.tp_size, a.world_size, a.device_id) == \
        ("inst", "ns", 0, 1, 1, 0)
    assert x.server.instances["inst"].sealed
    with pytest.raises(RuntimeError, match="already registered"):
        x.w.register_kv_caches(x.kv)


def test_cross_layer_registration_is_one_pseudo_layer():
    x = W()
    t = HostTensor(np.zeros((N, 2, 2, BS, H, D), np.uint16))
    x.w.register_cross_layers_kv_cache(t, None)
    a = x.server.calls[-1][1]["args"]
    assert [l.name for l in a.layers] == ["ALL_LAYERS"]
    assert (a.layers[0].num_blocks, a.layers[0].segments) == (N, 1)
    assert x.w.layers == ["ALL_LAYERS"]


def test_version_mismatch_stops_startup_with_the_servers_message():
    x = W(client_version="0.0.0-bogus")
    with pytest.raises(RuntimeError, match="rejected this connector's version.*version "
                       "mismatch: client=0.0.0-bogus server=0.23.12"):
        x.register()
    assert not x.w.registered


def test_other_registration_failures_list_the_layers():
    x = W()
    x.server.down = True
    with pytest.raises(RuntimeError, match=r"device 0 layers \[l0, l1\]"):
        x.register()


def _save(x: W, reqs: dict[str, tuple[list[int], list[bytes]]]):
    plan = StepPlan(saves={r: SaveIntent(tuple(b), tuple(hs)) for r, (b, hs) in reqs.items()})
    x.w.wait_for_save(plan)


def _stored(x: W, rid: str, blocks: list[int], hashes: list[bytes]):
    for b, i in zip(blocks, range(len(blocks))):
        x.fill(b, 100 + i)
    _save(x, {rid: (blocks, hashes)})


def test_load_moves_bytes_and_reports_once():
    x = W().register()
    _stored(x, "a", [1, 2, 3], [h(1), h(2), h(3)])
    q = x.client.query("inst", "b", [h(1), h(2), h(3)])
    assert q.num_hit_blocks == 3
    x.w.start_load_kv(StepPlan(loads={"b": LoadIntent((7, 8, 9), q.lease, 11)}))
    assert x.w.get_finished(set()) == (None, {"b"})
    assert x.w.get_finished(set()) == (None, None)
    assert x.w.get_block_ids_with_load_errors() == set()
    for src, dst in ((1, 7), (2, 8), (3, 9)):
        for a, b in zip(x.block(src), x.block(dst)):
            assert (a == b).all()
    assert not x.server.leases  # world_size 1: the only share was consumed


def test_load_rpc_failure_reports_errors_and_releases_the_lease():
    x = W().register()
    _stored(x, "a", [1, 2], [h(1), h(2)])
    q = x.client.query("inst", "b", [h(1), h(2)])
    x.server.fail_next["load"] = Internal("pf_client_load", -5, 13, "boom")
    x.w.start_load_kv(StepPlan(loads={"b": LoadIntent((7, 8), q.lease, 8)}))
    assert x.w.get_finished(set()) == (None, {"b"})
    assert x.w.get_block_ids_with_load_errors() == {7, 8}
    assert x.w.get_block_ids_with_load_errors() == set()  # drained
    assert not x.server.leases and x.w.stats["load_failures"] == 1


def test_load_with_server_down_never_raises():
    x = W().register()
    x.server.down = True
    x.w.start_load_kv(StepPlan(loads={"b": LoadIntent((7, 8), b"\1" * 16, 8)}))
    assert x.w.get_finished(set()) == (None, {"b"})
    assert x.w.get_block_ids_with_load_errors() == {7, 8}


def test_uncommitted_intent_is_reported_as_failed():
    x = W().register()
    x.w.start_load_kv(StepPlan(loads={"b": LoadIntent((4, 5), None, 8)}))
    assert x.w.get_finished(set()) == (None, {"b"})
    assert x.w.get_block_ids_with_load_errors() == {4, 5}
    assert x.server.count("load") == 0


def test_error_state_is_a_failure():
    x = W().register()
    _stored(x, "a", [1], [h(1)])
    q = x.client.query("inst", "b", [h(1)])
    x.server.load_mode = "error"
    x.w.start_load_kv(StepPlan(loads={"b": LoadIntent((7,), q.lease, 3)}))
    assert x.w.get_finished(set()) == (None, {"b"})
    assert x.w.get_block_ids_with_load_errors() == {7}


def test_load_that_never_completes_is_cancelled_strictly_after_the_timeout():
    x = W(load_timeout_s=120.0).register()
    _stored(x, "a", [1, 2], [h(1), h(2)])
    q = x.client.query("inst", "b", [h(1), h(2)])
    x.server.load_mode = "never"
    x.w.start_load_kv(StepPlan(loads={"b": LoadIntent((7, 8), q.lease, 8)}))
    assert x.w.get_finished(set()) == (None, None)
    st = x.server.pending_states[0]
    x.clock.advance(120.0)
    assert x.w.get_finished(set()) == (None, None)
    assert st.get() == 0  # not asked yet
    x.clock.advance(0.001)
    # asked to stop, but not reported before the server confirmed
    assert x.w.get_finished(set()) == (None, None)
    assert st.get() == 2
    assert x.w.stats["load_timeouts"] == 1
    assert x.w.get_block_ids_with_load_errors() == set()
    x.server.complete_pending(-2)  # the server: stopped before its next copy
    assert x.w.get_finished(set()) == (None, {"b"})
    assert x.w.get_block_ids_with_load_errors() == {7, 8}
    assert x.w.stats["load_timeouts"] == 1


def _stalled_load(x, targets=(7, 8)):
    _stored(x, "a", [1, 2], [h(1), h(2)])  # blocks 1, 2 hold 100, 101
    q = x.client.query("inst", "b", [h(1), h(2)])
    for b in targets:
        x.fill(b, 99)  # what vLLM's recomputation would have written
    x.server.load_mode = "stall"
    x.w.start_load_kv(StepPlan(loads={"b": LoadIntent(tuple(targets), q.lease, 8)}))
    assert x.w.get_finished(set()) == (None, None)


def test_cancelled_load_copies_nothing_after_the_failure_is_reported():
    """The stalled copies run only after the worker gave up: the fake load thread sees the
    cancel and copies nothing; the blocks vLLM recomputes keep its bytes."""
    x = W(load_timeout_s=5.0).register()
    _stalled_load(x)
    before = [x.block(7), x.block(8)]
    x.clock.advance(5.001)
    assert x.w.get_finished(set()) == (None, None)  # cancel asked, unconfirmed
    x.server.run_stalled()  # the server reaches its next copy: stops, confirms -2
    assert x.w.get_finished(set()) == (None, {"b"})
    assert x.w.get_block_ids_with_load_errors() == {7, 8}
    for b, old in zip((7, 8), before):
        assert all(np.array_equal(a, o) for a, o in zip(x.block(b), old))


def test_load_that_finished_while_being_cancelled_is_a_success():
    x = W(load_timeout_s=5.0).register()
    _stalled_load(x)
    x.server.run_stalled()  # completes before the worker looks
    x.clock.advance(5.001)
    assert x.w.get_finished(set()) == (None, {"b"})
    assert x.w.get_block_ids_with_load_errors() == set()
    assert x.block(7)[0].flat[0] == 100 and x.block(8)[0].flat[0] == 101


def test_cancelled_load_is_reported_once_the_server_process_is_gone():
    srv_clock = FakeClock()
    srv = FakeServer(srv_clock)
    srv.watch = True
    x = W(load_timeout_s=5.0, server=srv, clock=srv_clock).register()
    assert srv.count("watch_open") == 1
    _stalled_load(x)
    x.clock.advance(5.001)
    assert x.w.get_finished(set()) == (None, None)
    x.w.watch_step()  # the server is still this process: nothing changes
    assert x.w.get_finished(set()) == (None, None)
    srv.restart()  # kill -9 and a new process: the old one's copies never run
    x.w.watch_step()
    assert x.w.get_finished(set()) == (None, {"b"})
    assert x.w.get_block_ids_with_load_errors() == {7, 8}


def test_cancel_unconfirmed_by_a_live_server_is_given_up_after_cancel_wait():
    x = W(load_timeout_s=5.0).register()
    x.w._cancel_wait = 30.0
    _stalled_load(x)
    x.clock.advance(5.001)
    assert x.w.get_finished(set()) == (None, None)
    x.clock.advance(30.0)
    assert x.w.get_finished(set()) == (None, None)
    x.clock.advance(0.01)
    assert x.w.get_finished(set()) == (None, {"b"})


def test_watch_end_reregisters_as_soon_as_the_server_answers():
    """No Save or Load has to fail, and the 10 s retry interval does not apply."""
    srv = FakeServer()
    srv.watch = True
    x = W(server=srv, clock=srv.clock).register()
    assert srv.count("register") == 1
    x.w.watch_step()
    assert srv.count("register") == 1 and srv.count("watch_open") == 1
    srv.restart()
    srv.down = True  # the new process is not listening yet
    x.w.watch_step()
    assert srv.count("register") == 1
    x.clock.advance(0.1)
    x.w.watch_step()  # still down: one more try, every WATCH_RETRY_S
    assert srv.count("watch_open") == 3 and srv.count("register") == 1
    srv.down = False
    x.w.watch_step()  # inside the retry pause
    assert srv.count("watch_open") == 3
    x.clock.advance(0.1)
    x.w.watch_step()
    assert srv.count("watch_open") == 4 and srv.count("register") == 2
    assert "inst" in srv.instances and x.w.stats["reregistrations"] == 1
    x.w.watch_step()
    assert srv.count("register") == 2  # the new watch is alive: nothing more


def test_pending_load_completes_later():
    x = W().register()
    _stored(x, "a", [1], [h(1)])
    q = x.client.query("inst", "b", [h(1)])
    x.server.load_mode = "never"
    x.w.start_load_kv(StepPlan(loads={"b": LoadIntent((7,), q.lease, 3)}))
    assert x.w.get_finished(set()) == (None, None)
    x.server.complete_pending(1)
    assert x.w.get_finished(set()) == (None, {"b"})


def test_tp_workers_share_a_lease():
    clock = FakeClock()
    srv = FakeServer(clock)
    ws = [W(rank=r, tp=2, server=srv, clock=clock).register() for r in range(2)]
    for x in ws:
        x.fill(1, 5 + x.ctx.tp_rank)
        _save(x, {"a": ([1], [h(1)])})
    q = ws[0].client.query("inst", "b", [h(1)])
    assert q.num_hit_blocks == 1
    for i, x in enumerate(ws):
        x.w.start_load_kv(StepPlan(loads={"b": LoadIntent((3,), q.lease, 3)}))
        assert x.w.get_finished(set()) == (None, {"b"})
        assert (x.block(3)[0] == 5 + i).all()
        assert (q.lease in srv.leases) == (i == 0)


# ------------------------------------------------------------------ saves


def test_save_on_thread_waits_for_its_fence_and_covers_every_layer():
    x = W(thread=True).register()
    seen = {}
    orig = x.client.save

    def save(*a, **k):
        seen["fences"], seen["syncs"] = x.dev.fences, x.dev.syncs
        seen["layers"] = [(l.name, list(l.block_ids), list(l.block_hashes)) for l in a[4]]
        return orig(*a, **k)

    x.client.save = save
    _save(x, {"a": ([1, 0, 2], [h(1), h(9), h(2)]), "b": ([3], [h(1)])})
    assert x.w.wait_saves_idle(5)
    assert seen["fences"] == 1 and seen["syncs"] == 0  # no device-wide synchronize
    assert seen["layers"] == [("l0", [1, 2], [h(1), h(2)]), ("l1", [1, 2], [h(1), h(2)])]
    x.w.shutdown()


def test_adapter_without_a_save_fence_synchronises_the_device_instead():
    class OldAdapter(HostDeviceAdapter):  # a DeviceAdapter written before save_fence
        save_fence = None

    x = W(thread=True)
    x.dev = x.w.device = OldAdapter(0)
    x.register()
    _save(x, {"a": ([1], [h(1)])})
    assert x.w.wait_saves_idle(5)
    assert x.dev.syncs == 1 and x.w.stats["saves"] == 1


def test_finished_sending_only_after_the_request_finished_and_saves_done():
    x = W().register()
    _save(x, {"a": ([1], [h(1)])})
    assert x.w.get_finished(set()) == (None, None)
    assert x.w.get_finished({"a", "zzz"}) == ({"a"}, None)
    assert x.w.get_finished({"a"}) == (None, None)  # once


def test_save_failure_still_completes_the_request():
    x = W().register()
    x.server.fail_next["save"] = Internal("pf_client_save", -5, 13, "pinned pool exhausted")
    _save(x, {"a": ([1], [h(1)])})
    assert x.w.stats["save_failures"] == 1
    assert x.w.get_finished({"a"}) == ({"a"}, None)


def test_handle_preemptions_waits_for_saves_reading_the_blocks():
    x = W(thread=True).register()
    gate = threading.Event()
    orig = x.client.save
    x.client.save = lambda *a, **k: (gate.wait(10), orig(*a, **k))
    _save(x, {"a": ([1], [h(1)])})
    done = threading.Event()
    t = threading.Thread(target=lambda: (x.w.handle_preemptions({"a"}), done.set()))
    t.start()
    assert not done.wait(0.2)
    x.w.handle_preemptions({"other"})  # unrelated requests do not wait
    gate.set()
    assert done.wait(5)
    t.join()
    assert x.w.get_finished({"a"}) == ({"a"}, None)
    x.w.shutdown()


def test_finished_before_the_save_completed_is_reported_later():
    x = W(thread=True).register()
    gate = threading.Event()
    orig = x.client.save
    x.client.save = lambda *a, **k: (gate.wait(10), orig(*a, **k))
    _save(x, {"a": ([1], [h(1)])})
    assert x.w.get_finished({"a"}) == (None, None)
    gate.set()
    assert x.w.wait_saves_idle(5)
    assert x.w.get_finished(set()) == ({"a"}, None)
    x.w.shutdown()


def test_collapsed_mla_replicas_skip_the_copy_but_report():
    x = W(rank=1, tp=2, is_mla=True, collapse_mla_tp=True, tp_rank=0, tp_size=1)
    x.w.register_kv_caches({"mla": HostTensor(np.zeros((N, BS, 64), np.uint16), 1)})
    _save(x, {"a": ([1], [h(1)])})
    assert x.server.count("save") == 0
    assert x.w.get_finished({"a"}) == ({"a"}, None)
    # for routers, the replica reports the hash as rank 0 would (rank 0's own report
    # decides whether the block counts as stored)
    assert [r[1] for r in x.w.event_log.take()] == [h(1)]
    assert x.w.recorder.take() is None  # it moved no bytes


def test_saves_are_recorded_for_stats_and_events():
    x = W().register()
    _save(x, {"a": ([1, 2], [h(1), h(2)])})
    d = x.w.recorder.take()
    block_bytes = len(LAYERS) * 2 * BS * H * D * 2
    assert d["save_success"] == 1 and d["save_blocks"] == 2
    assert d["save_bytes"] == 2 * block_bytes and d["save_op_blocks"] == [2]
    assert [r[1] for r in x.w.event_log.take()] == [h(1), h(2)]
    x.server.fail_next["save"] = Internal("pf_client_save", -5, 13, "injected")
    _save(x, {"b": ([3], [h(3)])})
    assert x.w.recorder.take() == {"save_failures": 1}
    assert x.w.event_log.take() == []  # a failed save is not reported stored


def test_shutdown_unregisters_from_rank_zero_only():
    clock = FakeClock()
    srv = FakeServer(clock)
    ws = [W(rank=r, tp=2, server=srv, clock=clock).register() for r in range(2)]
    ws[1].w.shutdown()
    assert srv.count("unregister") == 0
    ws[0].w.shutdown()
    assert srv.count("unregister") == 1 and "inst" not in srv.instances


def test_reregisters_after_the_server_lost_the_instance():
    x = W(reregister_interval_s=10).register()
    x.server.drop_instance("inst")  # e.g. pegaflow-server restarted
    _save(x, {"a": ([1], [h(1)])})
    assert x.w.stats["save_failures"] == 1
    assert x.w.get_finished({"a"}) == ({"a"}, None)  # the lifecycle still completes
    x.w.start_load_kv(StepPlan())  # vLLM calls it every step: the retry point
    assert x.server.count("register") == 2 and x.server.instances["inst"].sealed
    assert x.w.stats["reregistrations"] == 1
    _save(x, {"b": ([2], [h(2)])})
    assert x.server.stored("ns", h(2))


def test_reregistration_is_rate_limited_while_the_server_is_away():
    x = W(reregister_interval_s=10).register()
    x.server.drop_instance("inst")
    _save(x, {"a": ([1], [h(1)])})
    x.server.down = True
    x.w.start_load_kv(StepPlan())
    x.w.start_load_kv(StepPlan())
    assert x.server.count("register") == 2  # one attempt, then wait
    x.server.down = False
    x.clock.advance(10)
    x.w.start_load_kv(StepPlan())
    assert x.server.count("register") == 3 and x.w.stats["reregistrations"] == 1


def test_null_block_destinations_get_no_target():
    from pegaflow.connector.plan import LoadIntent, StepPlan

    x = W().register()
    _save(x, {"a": ([1, 2], [h(1), h(2)])})
    q = x.server.query("inst", "q", [h(1), h(2)])
    x.w.start_load_kv(StepPlan(loads={"b": LoadIntent((0, 5), q.lease, 2 * BS)}))
    assert x.w.get_finished(set()) == (None, {"b"})
    loads = [c[1]["loads"] for c in x.server.calls if c[0] == "load"]
    assert loads == [[(q.lease, [[None, 5]])]]
