"""Against the real pegaflow-server only: version handshake, liveness Session cleanup
after kill -9 of the vLLM process, and recovery of the client after a server restart.
(The step-loop scenarios against the server are in test_step_loop.py[real].)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import HERE, pf_bin, require_engine_server
from pegaflow.client import errors
from pegaflow.client.engine import EngineClient
from pegaflow.connector.config import ConnectorContext
from pegaflow.connector.worker import WorkerConnector


@pytest.fixture
def server(server_factory, engine_lib):
    s = server_factory()
    c = EngineClient(s.target, lib=engine_lib, timeout_ms=5000)
    require_engine_server(c)
    yield s, c
    c.close()


def test_library_version_is_the_servers(server, engine_lib):
    out = subprocess.run([os.path.join(pf_bin(), "pegaflow-server"), "--version"],
                         capture_output=True, text=True, timeout=30).stdout.strip()
    assert engine_lib.version() == out


def test_version_mismatch_is_rejected_at_registration(server, engine_lib):
    from pegaflow.device.sim import SimDeviceAdapter, allocate_kv_caches

    s, c = server
    kv, ts = allocate_kv_caches(["l0"], (2, 8, 16, 2, 8), np.uint16, lib=engine_lib)
    try:
        ctx = ConnectorContext("vm-inst", "ns", 16, client_version="0.0.0-bogus")
        w = WorkerConnector(ctx, c, SimDeviceAdapter(0), save_thread=False)
        with pytest.raises(RuntimeError, match="(?i)version mismatch.*0.0.0-bogus"):
            w.register_kv_caches(ts)
        # the same registration with the library's own version is accepted
        ok = WorkerConnector(ConnectorContext("vm-inst", "ns", 16), c, SimDeviceAdapter(0),
                             save_thread=False)
        ok.register_kv_caches(ts)
        ok.shutdown()
    finally:
        kv.close()


def test_kill_9_of_the_vllm_process_drops_the_instance(server, engine_lib, tmp_path):
    s, c = server
    inst = "killed-" + str(os.getpid())
    log = open(tmp_path / "child.log", "w+")
    child = subprocess.Popen([sys.executable, os.path.join(HERE, "helpers", "session_child.py"),
                              s.target, engine_lib.path, inst], stdout=subprocess.PIPE,
                             stderr=log, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "READY", open(tmp_path / "child.log").read()
        assert c.query_raw(inst, "probe", [b"\1" * 32]).num_hit_blocks == 0  # instance known
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                c.query_raw(inst, "probe", [b"\1" * 32])
            except errors.FailedPrecondition:
                return  # the server dropped the instance when the Session broke
            time.sleep(0.05)
        pytest.fail(f"instance {inst} still known 10 s after kill -9; server log:\n{s.log()}")
    finally:
        if child.poll() is None:
            child.kill()
        log.close()


def test_client_recovers_after_a_server_restart(plain_server_factory, lib):
    """Needs only connect/health: runs before the engine merge too."""
    s = plain_server_factory()
    c = EngineClient(s.target, lib=lib, timeout_ms=2000)
    c.health()
    s.kill()
    with pytest.raises(errors.Unavailable):
        c.health()
    if lib.has("pf_client_query"):
        assert c.query("any", "r", [b"\1" * 32]).num_hit_blocks == 0  # a miss, no raise
    s2 = plain_server_factory("restarted", port=s.port)
    t0 = time.monotonic()
    while True:  # the channel reconnects with gRPC's backoff (seconds)
        try:
            c.health(timeout_ms=1000)
            break
        except (errors.Unavailable, errors.DeadlineExceeded):
            if time.monotonic() - t0 > 30:
                raise
            time.sleep(0.1)
    print(f"health recovered {time.monotonic() - t0:.1f}s after the restart")
    try:
        c.shutdown_server()  # Shutdown RPC: the server exits by itself
    except errors.Unavailable:
        pass  # the server may cancel the in-flight Shutdown call while stopping
    assert s2.proc.wait(10) == 0
    c.close()


def test_worker_reregisters_as_soon_as_a_restarted_server_answers(server_factory, engine_lib):
    """The worker's watch Session ends with the killed server; the worker registers its KV
    caches with the new process without any Save or Load failing first (the 10 s retry
    interval of that path never applies)."""
    from pegaflow.device.sim import SimDeviceAdapter, allocate_kv_caches

    s = server_factory()
    c = EngineClient(s.target, lib=engine_lib, timeout_ms=5000)
    require_engine_server(c)
    kv, ts = allocate_kv_caches(["l0"], (2, 8, 16, 2, 8), np.uint16, lib=engine_lib)
    w = WorkerConnector(ConnectorContext("rereg-inst", "ns", 16), c, SimDeviceAdapter(0),
                        save_thread=False, reregister_interval_s=3600.0)
    try:
        w.register_kv_caches(ts)
        assert c.query_raw("rereg-inst", "p", [b"\1" * 32]).num_hit_blocks == 0
        s.kill()
        s2 = server_factory("restarted", port=s.port)
        t0 = time.monotonic()
        while True:
            try:
                c.query_raw("rereg-inst", "p", [b"\1" * 32], timeout_ms=1000)
                break
            except (errors.FailedPrecondition, errors.Unavailable, errors.DeadlineExceeded):
                assert time.monotonic() - t0 < 30, f"not re-registered; log:\n{s2.log()}"
                time.sleep(0.02)
        print(f"re-registered {time.monotonic() - t0:.2f} s after the restarted server's ready")
        assert w.stats.get("reregistrations") == 1
    finally:
        w.shutdown()
        kv.close()
        c.close()


def _metric(s, name: str) -> float:
    import re as _re
    import urllib.request

    port = int(_re.findall(r"HTTP listening on \S+ \(port (\d+)\)", s.log())[-1])
    body = urllib.request.urlopen(f"http://{s.http_host}:{port}/metrics", timeout=5).read()
    m = _re.search(rf"^{_re.escape(name)} (\S+)$", body.decode(), _re.M)
    return float(m.group(1)) if m else 0.0


def wait_load_reported(w, timeout_s):
    """The receiving request ids of the worker's first get_finished that reports any."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, recv = w.get_finished(set())
        if recv:
            return recv
        assert time.monotonic() < deadline, f"no load reported in {timeout_s} s"
        time.sleep(0.01)


SEAL_DELAY_MS = 600


def test_seal_fault_holds_saved_blocks_back_for_its_delay(server_factory, engine_lib):
    """`engine.seal:delay=MS` (the fault `make test-races` runs every suite under) really
    delays queryability: the insert thread takes a Save's batch only after the Save began
    and then waits MS before sealing it, so the first answer with hits can arrive no sooner
    than MS after the Save was sent (a lower bound the fault guarantees, not a timing
    guess), and the blocks do become queryable, byte-exact on load, after it."""
    from pegaflow.connector.plan import LoadIntent, SaveIntent, StepPlan
    from pegaflow.device.sim import SimDeviceAdapter, allocate_kv_caches

    s = server_factory(extra_args=("--enable-debug", "--fault-spec",
                                   f"engine.seal:delay={SEAL_DELAY_MS}"))
    c = EngineClient(s.target, lib=engine_lib, timeout_ms=10000)
    require_engine_server(c)
    nb = 8
    kv, ts = allocate_kv_caches(["l0"], (2, 32, 16, 2, 8), np.uint16, lib=engine_lib)
    arr = ts["l0"].numpy()
    arr[...] = np.random.default_rng(27).integers(0, 65535, arr.shape, dtype=np.uint16)
    w = WorkerConnector(ConnectorContext("seal-inst", "ns", 16), c, SimDeviceAdapter(0),
                        save_thread=False)
    try:
        w.register_kv_caches(ts)
        src = list(range(1, nb + 1))
        hashes = [bytes([7, i]) * 16 for i in src]
        t_save = time.monotonic()
        w.wait_for_save(StepPlan(saves={"a": SaveIntent(tuple(src), tuple(hashes))}))
        deadline = time.monotonic() + 20
        while True:
            q = c.query_raw("seal-inst", "b", hashes)
            t_answer = time.monotonic()
            if not q.loading and q.num_hit_blocks == nb:
                break
            if q.lease:
                c.release(q.lease)
            assert t_answer < deadline, f"{q.num_hit_blocks} of {nb} queryable after 20 s"
            time.sleep(0.02)
        assert t_answer - t_save >= SEAL_DELAY_MS / 1000, (
            f"hits {1000 * (t_answer - t_save):.0f} ms after the Save began: the seal fault "
            f"did not delay them {SEAL_DELAY_MS} ms")
        dst = tuple(range(16, 16 + nb))
        w.start_load_kv(StepPlan(loads={"b": LoadIntent(dst, q.lease, nb * 16)}))
        wait_load_reported(w, 20)
        assert w.get_block_ids_with_load_errors() == set()
        for s_id, d_id in zip(src, dst):
            assert np.array_equal(arr[:, d_id], arr[:, s_id]), f"block {s_id} -> {d_id}"
    finally:
        w.shutdown()
        c.close()
        kv.close()


def test_timed_out_load_is_reported_only_after_the_server_stopped_copying(server_factory,
                                                                           engine_lib):
    """Every H2D batch of the server waits 2 s (fault layer): the connector gives up after
    0.3 s, asks the server to stop, and reports the blocks failed only once the server
    confirmed. From that report on no destination byte changes (checked after the server's
    load thread moved on), and only whole chunks from the start landed (byte-exact)."""
    from pegaflow.connector.plan import LoadIntent, SaveIntent, StepPlan
    from pegaflow.device.sim import SimDeviceAdapter, allocate_kv_caches

    # chunks of the 64-copy floor (--load-cancel-chunk 1): the default 128 MiB would carry
    # this whole small Load in one chunk
    s = server_factory(extra_args=("--enable-debug", "--fault-spec", "gpu.h2d:delay=2000",
                                   "--load-cancel-chunk", "1"))
    c = EngineClient(s.target, lib=engine_lib, timeout_ms=10000)
    require_engine_server(c)
    nb, dst0 = 64, 80  # one layer, split K/V: 2 copies a block, 32 blocks a 64-copy chunk
    kv, ts = allocate_kv_caches(["l0"], (2, 160, 16, 2, 8), np.uint16, lib=engine_lib)
    arr = ts["l0"].numpy()
    rng = np.random.default_rng(24)
    arr[...] = rng.integers(0, 65535, arr.shape, dtype=np.uint16)
    ctx = ConnectorContext("cancel-inst", "ns", 16, load_timeout_s=0.3)
    w = WorkerConnector(ctx, c, SimDeviceAdapter(0), save_thread=False)
    try:
        w.register_kv_caches(ts)
        src = list(range(1, nb + 1))
        hashes = [bytes([i % 256, i // 256]) * 16 for i in src]
        w.wait_for_save(StepPlan(saves={"a": SaveIntent(tuple(src), tuple(hashes))}))
        assert w.stats["saves"] == 1, w.stats
        deadline = time.monotonic() + 20
        while True:  # saved blocks become queryable once sealed
            q = c.query_raw("cancel-inst", "b", hashes)
            if not q.loading and q.num_hit_blocks == nb:
                break
            if q.lease:
                c.release(q.lease)
            assert time.monotonic() < deadline, f"{q.num_hit_blocks} of {nb} queryable"
            time.sleep(0.01)
        dst = tuple(range(dst0, dst0 + nb))
        before = arr[:, dst0:dst0 + nb].copy()
        w.start_load_kv(StepPlan(loads={"b": LoadIntent(dst, q.lease, nb * 16)}))
        recv = wait_load_reported(w, 30)
        assert recv == {"b"} and w.get_block_ids_with_load_errors() == set(dst)
        assert w.stats["load_timeouts"] == 1
        at_report = arr[:, dst0:dst0 + nb].copy()
        # the load thread is FIFO: once a second load completed, the first's batch is over
        q2 = c.query_raw("cancel-inst", "c", hashes[:1])
        w.start_load_kv(StepPlan(loads={"c": LoadIntent((150,), q2.lease, 16)}))
        deadline = time.monotonic() + 30
        while not w.get_finished(set())[1]:
            assert time.monotonic() < deadline, "second load never reported"
            time.sleep(0.01)
        assert np.array_equal(arr[:, 150], arr[:, 1])
        assert np.array_equal(arr[:, dst0:dst0 + nb], at_report), \
            "destination blocks changed after the failure was reported"
        landed = 0
        while landed < nb and np.array_equal(at_report[:, landed], arr[:, 1 + landed]):
            landed += 1
        assert landed % 32 == 0 and landed < nb, f"{landed} blocks landed"
        assert np.array_equal(at_report[:, landed:], before[:, landed:])
        assert _metric(s, "pegaflow_load_cancelled_total") == 1
        print(f"{landed} of {nb} blocks landed before the cancel, none after the report")
    finally:
        w.shutdown()
        kv.close()
        c.close()
