"""ctypes marshalling of every Engine call, checked against C that reads the arguments.

tests/python/c/recorder.c implements pegaflow.h (compiled against the header here, so a
signature drift fails to compile) by logging what it receives; this runs today, before
the engine functions of the real libpegaflow exist."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import HERE, TOP
from pegaflow.client import _lib, errors
from pegaflow.client.engine import (EngineClient, LayerRegistration, LeaseLoad, QueryResult,
                                    RegisterArgs, SaveLayer, ipc_cuda, ipc_sim)


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("SKIP: no C compiler for the recorder library")
    out = tmp_path_factory.mktemp("rec") / "librecorder.so"
    r = subprocess.run([cc, "-std=c11", "-shared", "-fPIC", "-Wall", "-Werror",
                        "-I", os.path.join(TOP, "src", "client"),
                        os.path.join(HERE, "c", "recorder.c"), "-o", str(out), "-lrt"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lib = _lib.load_library(str(out))
    assert not lib.missing
    take = lib._cdll.rec_take
    take.restype = ctypes.c_char_p
    fail = lib._cdll.rec_fail
    fail.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p]

    class R:
        pass

    R.lib = lib
    R.delay = staticmethod(lambda ms: lib._cdll.rec_delay(ms))
    R.take = staticmethod(lambda: take().decode())
    R.fail = staticmethod(lambda rc=0, code=0, msg=b"": fail(rc, code, msg))
    return R


@pytest.fixture
def cl(rec):
    rec.fail()
    c = EngineClient("http://127.0.0.1:5", lib=rec.lib, timeout_ms=1234, query_timeout_ms=77)
    rec.take()
    yield c
    rec.fail()
    c.close()


def test_register(rec, cl):
    cl.register(RegisterArgs("inst", "ns1", 1, 2, 4, 3, 5, [
        LayerRegistration("l0", b"\x01\x02", 10, 1024, 10240, 2),
        LayerRegistration("ALL_LAYERS", b"\xff", 7, 4096, 0, 1, 0)], transfer_mode=1))
    assert rec.take() == (
        "register inst=inst ns=ns1 tp=1/2 world=4 pp=3 dev=5 mode=1 pf=0 ver=(null) n=2 t=1234\n"
        " layer l0 blocks=10 bpb=1024 kvs=10240 seg=2 grp=0 ipc=0102\n"
        " layer ALL_LAYERS blocks=7 bpb=4096 kvs=0 seg=1 grp=0 ipc=ff\n")
    cl.register(RegisterArgs("i", "n", 0, 1, 1, 0, 0, [LayerRegistration("x", b"z", 1, 1)],
                             client_version="9.9", page_first=True), timeout_ms=5)
    assert "pf=1 ver=9.9 n=1 t=5" in rec.take()


def test_save_uniform_and_mixed_hash_lengths(rec, cl):
    cl.save("inst", 1, 2, 3, [SaveLayer("a", [5, 6], [b"\x11" * 2, b"\x22" * 2]),
                              SaveLayer("b", [7, 8], [b"\x33", b"\x44" * 3])])
    assert rec.take() == ("save inst=inst tp=1 pp=2 dev=3 n=2 t=1234\n"
                          " layer a lens=uniform ids=5,6 hashes= 1111 2222\n"
                          " layer b lens=array ids=7,8 hashes= 33 444444\n")
    with pytest.raises(ValueError, match="2 block ids but 1 hashes"):
        cl.save("i", 0, 0, 0, [SaveLayer("a", [1, 2], [b"x"])])


def test_query_ready_loading_and_positions(rec, cl):
    r = cl.query("inst", "req", [b"\xaa" * 4, b"\xbb" * 4, b"\xcc" * 4],
                 wait_for_full_prefix=True, group_id=2)
    # a group > 0 answer brings its positions (one per asked hash at most)
    assert rec.take() == ("query inst=inst req=req n=3 wfp=1 group=2 cap=3 t=77 "
                          "hashes= aaaaaaaa bbbbbbbb cccccccc\n")
    assert r == QueryResult(False, 2, bytes(range(0xA0, 0xB0)), (10, 11))
    assert cl.query("inst", "loading", [b"\x01"]) == QueryResult(loading=True)
    r = cl.query_raw("i", "r", [b"\x01", b"\x02", b"\x03"], hit_cap=8, timeout_ms=9)
    assert r.hit_positions == (10, 11) and "cap=8 t=9" in rec.take()
    assert cl.query("i", "r", []) == QueryResult(False, 0, b"")


def test_query_error_mapping(rec, cl):
    rec.fail(-111, errors.UNAVAILABLE, b"connection refused")
    assert cl.query("i", "r", [b"\x01"]) == QueryResult.miss()
    rec.fail(-110, errors.DEADLINE_EXCEEDED, b"deadline")
    assert cl.query("i", "r", [b"\x01"]) == QueryResult.miss()
    rec.fail(-1, errors.FAILED_PRECONDITION, b"instance i not found")
    with pytest.raises(errors.FailedPrecondition, match="instance i not found"):
        cl.query("i", "r", [b"\x01"])
    rec.fail(-22, errors.INVALID_ARGUMENT, b"req_id must not be empty")
    with pytest.raises(errors.InvalidArgument):
        cl.query("i", "", [b"\x01"])


def test_errors_are_read_on_the_calling_thread(rec, cl):
    import threading

    rec.fail(-5, errors.INTERNAL, b"pinned pool exhausted")
    got = []
    t = threading.Thread(target=lambda: got.append(pytest.raises(errors.Internal, cl.health)))
    t.start()
    t.join()
    assert "pinned pool exhausted" in str(got[0].value)


def test_release_load_unregister_session(rec, cl):
    cl.release(b"\x01\x02")
    assert rec.take() == "release t=1234 lease=0102\n"
    cl.load("inst", 1, 3, "pega_load_x", [["a", "b"], ["c"]],
            [LeaseLoad(b"\xab" * 16, [[4, 5], [None]]), LeaseLoad(b"\xcd", [[], [9]])])
    assert rec.take() == (
        "load inst=inst tp=1 dev=3 shm=pega_load_x groups=2 items=2 t=1234\n"
        " group0 a b\n group1 c\n"
        f" item lease={'ab' * 16} g0=4,5 g1=-1\n"
        " item lease=cd g0= g1=9\n")
    with pytest.raises(ValueError, match="target groups"):
        cl.load("i", 0, 0, "s", [["a"]], [LeaseLoad(b"x", [[1], [2]])])
    cl.unregister("inst", timeout_ms=3)
    assert rec.take() == "unregister inst=inst t=3\n"
    s = cl.open_session("inst", "ns", 2, 4)
    assert rec.take() == "session inst=inst ns=ns tp=2 world=4 t=1234\n"
    assert s.alive()
    s.close()
    s.close()
    assert rec.take() == "session_close\n" and not s.alive()
    rec.fail(-111, errors.UNAVAILABLE, b"down")
    with pytest.raises(errors.Unavailable):
        cl.open_session("inst", "ns", 1, 1)
    rec.fail(0, 0, b"")
    rec.take()
    assert cl.has_watch()
    w = cl.open_watch("inst", timeout_ms=77)
    assert rec.take() == "watch inst=inst t=77\n" and w.alive()
    w.close()
    assert rec.take() == "session_close\n"
    cl.reconnect()
    assert rec.take().startswith("reconnect ")


def test_ipc_builders_and_buffer_growth(rec):
    u = bytes(range(16))
    hnd = bytes(range(64))
    assert ipc_cuda(rec.lib, u, hnd, 5, 6) == \
        f"cuda:{u.hex()}:{hnd.hex()}:5:6".encode()
    long_name = "/" + "n" * 300  # > the first 256-byte buffer: the -ENOSPC retry
    assert ipc_sim(rec.lib, long_name, 2, 7, 8) == f"sim:{long_name}:2:7:8".encode()
    with pytest.raises(ValueError):
        ipc_cuda(rec.lib, u, hnd[:63], 0, 1)


def test_sim_adapter_over_simkv(rec):
    from pegaflow.device.sim import SimDeviceAdapter, allocate_kv_caches

    kv, ts = allocate_kv_caches(["a", "b"], (2, 4, 16, 2, 8), np.uint16, sim_device=2,
                                lib=rec.lib)
    try:
        path = "/dev/shm" + kv.name
        assert os.path.exists(path)
        t = ts["b"]
        assert t.offset == 4096 and t.nbytes == 2 * 4 * 16 * 2 * 8 * 2
        ad = SimDeviceAdapter(2)
        assert ad.export_ipc(t) == f"sim:{kv.name}:2:4096:{t.nbytes}".encode()
        t.numpy()[1, 2, 3] = 0xBEEF
        with open(path, "rb") as f:
            raw = np.frombuffer(f.read(), dtype=np.uint16)
        arr = raw[4096 // 2: 4096 // 2 + t.nbytes // 2].reshape(t.shape)
        assert (arr[1, 2, 3] == 0xBEEF).all() and arr.sum() == 0xBEEF * 16
    finally:
        kv.close()
    assert not os.path.exists(path)


def test_worker_and_scheduler_over_the_binding(rec, cl):
    """The connector's calls arrive in C as intended (register from sim tensors, save of
    every layer, one load per step, query/release/session from the scheduler)."""
    from pegaflow.client.loadstate import ShmLoadState
    from pegaflow.connector.config import ConnectorContext
    from pegaflow.connector.plan import LoadIntent, SaveIntent, StepPlan
    from pegaflow.connector.scheduler import SchedulerConnector
    from pegaflow.connector.worker import WorkerConnector
    from pegaflow.device.sim import SimDeviceAdapter, allocate_kv_caches

    ctx = ConnectorContext("inst", "ns", 16, tp_rank=1, tp_size=2, world_size=2,
                           physical_tp_rank=1, rpc_timeout_ms=999, query_timeout_ms=55)
    kv, ts = allocate_kv_caches(["l0", "l1"], (2, 4, 16, 2, 8), np.uint16, sim_device=1,
                                lib=rec.lib)
    states = []

    def new_state():
        states.append(ShmLoadState.create())
        return states[-1]

    w = WorkerConnector(ctx, cl, SimDeviceAdapter(1), save_thread=False,
                        load_state_factory=new_state)
    try:
        w.register_kv_caches(ts)
        log = rec.take()
        assert "register inst=inst ns=ns tp=1/2 world=2 pp=0 dev=1 mode=0" in log
        assert f"layer l0 blocks=4 bpb=512 kvs=2048 seg=2 grp=0 ipc=" \
               f"{('sim:%s:1:0:4096' % kv.name).encode().hex()}" in log
        w.wait_for_save(StepPlan(saves={"r": SaveIntent((2, 3), (b"\x01" * 32, b"\x02" * 32))}))
        log = rec.take()
        assert log.startswith("save inst=inst tp=1 pp=0 dev=1 n=2 t=999\n")
        assert f" layer l1 lens=uniform ids=2,3 hashes= {'01' * 32} {'02' * 32}" in log
        w.start_load_kv(StepPlan(loads={"a": LoadIntent((1, 2), b"\x07" * 16, 20),
                                        "b": LoadIntent((3,), b"\x08" * 16, 5)}))
        log = rec.take()
        assert f"shm={states[0].name} groups=1 items=2" in log and " group0 l0 l1\n" in log
        assert f"item lease={'07' * 16} g0=1,2" in log and f"item lease={'08' * 16} g0=3" in log
        srv_side = ShmLoadState.attach(states[0].name)  # the server's completion write
        srv_side.set(1)
        srv_side.close()
        assert w.get_finished(set()) == (None, {"a", "b"})
        assert w.get_finished({"r"}) == ({"r"}, None)
    finally:
        w.shutdown()
        kv.close()
    assert "unregister" not in rec.take()  # TP rank 1 never unregisters

    s = SchedulerConnector(ctx, cl, session_thread=False)
    assert rec.take() == "session inst=inst ns=ns tp=2 world=2 t=55\n"

    class Req:
        request_id = "q"
        block_hashes = [b"\x0a" * 32, b"\x0b" * 32, b"\x0c" * 32]
        num_tokens = 50

    assert s.get_num_new_matched_tokens(Req, 16) == (16, True)  # recorder: n-1 hits
    assert rec.take() == f"query inst=inst req=q n=2 wfp=0 group=0 cap=0 t=55 hashes= " \
                         f"{'0b' * 32} {'0c' * 32}\n"
    s.request_finished(Req, [])
    assert rec.take() == f"release t=55 lease={bytes(range(0xA0, 0xB0)).hex()}\n"
    s.shutdown()
    assert rec.take() == "session_close\n"


def test_calls_release_the_gil(rec, cl):
    """While one thread is inside the library (a 500 ms call), another keeps running
    Python: no gap between its iterations comes near the call's length (with the GIL held
    during the call there would be one of ~500 ms)."""
    import threading
    import time

    rec.delay(500)
    try:
        t = threading.Thread(target=cl.health)
        t.start()
        t0 = last = time.monotonic()
        gap = 0.0
        while t.is_alive():
            now = time.monotonic()
            gap = max(gap, now - last)
            last = now
        elapsed = last - t0
    finally:
        rec.delay(0)
    assert elapsed >= 0.4
    assert gap < 0.35, f"main thread stalled {gap:.3f}s during a {elapsed:.3f}s call"
