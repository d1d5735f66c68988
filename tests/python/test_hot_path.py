"""The connector's hot path, pinned without timing (bench/connector.py measures its cost).

vLLM runs the connector's hooks inside every scheduler step, so their work must not grow
with the number of blocks a step saves or loads, and they must make no server call the
step does not need:

* Python lines executed by pegaflow's own code (python/pegaflow, counted with
  sys.settrace on the thread that runs the hooks) for the same requests with 4x the
  blocks grow by less than one line per extra block: no Python loop per block in the
  scheduler, the workers or the binding (with vLLM's default of no KV events; KV events
  for routers describe each block, so they are work per block by design and only done
  when vLLM publishes them: config.kv_events_enabled).
* Server calls: one QueryPrefetch per request (the probe is memoised), one Save per worker
  per step covering every layer, one Load per worker per step covering every request, no
  Release of a lease a Load consumed, nothing in a step with nothing to save or load.
* The binding marshals each distinct id / hash sequence of a Save once (every layer of a
  group shares them), reads the joined hashes in place, and maps None targets of a Load
  to -1, with no Python line per block either.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import Counter

import pytest

from conftest import HERE, REAL_VLLM, TOP

PKG = os.path.join(TOP, "python", "pegaflow") + os.sep
REQUESTS = 4
TP = 2
LAYERS = 4


class LineCounter:
    """Lines executed in files under ``prefix`` on the calling thread (sys.settrace is
    per thread: the watch / Session threads are not counted)."""

    def __init__(self, prefix: str = PKG):
        self.prefix = prefix
        self.n = 0
        self.where: Counter = Counter()

    def _global(self, frame, event, arg):
        return self._local if frame.f_code.co_filename.startswith(self.prefix) else None

    def _local(self, frame, event, arg):
        if event == "line":
            self.n += 1
            self.where[(os.path.relpath(frame.f_code.co_filename, TOP), frame.f_lineno)] += 1
        return self._local

    def __enter__(self):
        self._old = sys.gettrace()
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc):
        sys.settrace(self._old)
        return False


def _prompts(nblocks: int) -> list[list[int]]:
    return [[(r * 7919 + t * 31) % 30000 + 1 for t in range(nblocks * 16 + 1)]
            for r in range(REQUESTS)]


def _steps(monkeypatch, nblocks: int, kv_events: bool):
    """REQUESTS prompts of ``nblocks`` blocks: saved by one vLLM (TP 2, 4 layers, each
    prompt prefilled in one step), then loaded by another; returns (pegaflow lines
    executed in the hooks, the fake server's calls per method of each phase, steps)."""
    import pegaflow.connector.worker as worker_mod
    from fakes import FakeServer
    from harness import Engine, FakeBackend

    orig = worker_mod.WorkerConnector.__init__

    def sync_init(self, *a, **kw):  # saves on the thread that runs the hooks (traced)
        kw["save_thread"] = False
        orig(self, *a, **kw)

    monkeypatch.setattr(worker_mod.WorkerConnector, "__init__", sync_init)
    server = FakeServer(clock=time.monotonic)
    backend = FakeBackend(server)
    kw = dict(tp=TP, layers=LAYERS, num_blocks=REQUESTS * nblocks + 8,
              token_budget=REQUESTS * (nblocks * 16 + 1), kv_events=kv_events)
    saver = Engine(backend, monkeypatch.setattr, instance_id=f"hot-save-{nblocks}", **kw)
    loader = Engine(backend, monkeypatch.setattr, instance_id=f"hot-load-{nblocks}", **kw)
    calls = []
    try:
        with LineCounter() as lines:
            for phase, eng, tag in ((0, saver, "s"), (1, loader, "l")):
                mark = len(server.calls)
                for i, p in enumerate(_prompts(nblocks)):
                    eng.add_request(f"{tag}{i}", p, max_tokens=1)
                eng.run()
                calls.append(Counter(m for m, _ in server.calls[mark:]))
        for i in range(REQUESTS):  # the path measured is the one that loads everything
            lg = loader.logs[f"l{i}"]
            assert lg.loaded_blocks == nblocks and not lg.load_failed
            snap = saver.logs[f"s{i}"].snapshot
            assert all(blocks == snap[h] for h, blocks in lg.loaded.items())
        return lines, calls, saver.steps + loader.steps
    finally:
        saver.shutdown()
        loader.shutdown()


@pytest.mark.skipif(REAL_VLLM, reason="SKIP: the harness drives the vLLM stub; a real vLLM "
                    "is installed")
def test_hooks_run_no_python_per_block(monkeypatch):
    small, big = 4, 16
    ls, cs, ss = _steps(monkeypatch, small, kv_events=False)
    lb, cb, sb = _steps(monkeypatch, big, kv_events=False)
    assert ss == sb  # same steps, same requests: only the block count differs
    extra = REQUESTS * (big - small)
    grown = {k: v - ls.where.get(k, 0) for k, v in lb.where.items() if v > ls.where.get(k, 0)}
    assert lb.n - ls.n < extra, (
        f"{lb.n - ls.n} more Python lines for {extra} more blocks; lines that ran more "
        f"often: {sorted(grown.items(), key=lambda x: -x[1])[:10]}")
    # the server calls are the same too, and the fewest the steps need
    assert cs == cb
    save_phase, load_phase = cb
    assert save_phase["query"] == REQUESTS and save_phase["save"] == TP
    assert load_phase["query"] == REQUESTS and load_phase["load"] == TP
    assert load_phase["release"] == 0 and load_phase["save"] == 0
    assert sum(save_phase.values()) == REQUESTS + TP
    assert sum(load_phase.values()) == REQUESTS + TP


@pytest.mark.skipif(REAL_VLLM, reason="SKIP: the harness drives the vLLM stub; a real vLLM "
                    "is installed")
def test_kv_events_cost_nothing_unless_published(monkeypatch):
    """With KV events published the same run announces every block (work per block), with
    vLLM's default none of that runs: the lines of events.py are not executed at all."""
    off, _, _ = _steps(monkeypatch, 4, kv_events=False)
    on, calls, _ = _steps(monkeypatch, 4, kv_events=True)
    ev = os.path.join("python", "pegaflow", "connector", "events.py")
    assert not [k for k in off.where if k[0] == ev]
    assert sum(v for k, v in on.where.items() if k[0] == ev) > REQUESTS * 4
    assert calls[0]["save"] == TP  # the events change no server call


# ------------------------------------------------------------------ the binding


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    """tests/python/c/recorder.c: pegaflow.h implemented by logging the arguments."""
    from pegaflow.client import _lib

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("SKIP: no C compiler for the recorder library")
    out = tmp_path_factory.mktemp("rec") / "librecorder.so"
    r = subprocess.run([cc, "-std=c11", "-shared", "-fPIC", "-Wall", "-Werror",
                        "-I", os.path.join(TOP, "src", "client"),
                        os.path.join(HERE, "c", "recorder.c"), "-o", str(out), "-lrt"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    import ctypes

    lib = _lib.load_library(str(out))
    take = lib._cdll.rec_take
    take.restype = ctypes.c_char_p
    lib.take = lambda: take().decode()
    return lib


def _binding_calls(rec, n: int) -> tuple[LineCounter, str]:
    from pegaflow.client.engine import EngineClient, LeaseLoad, SaveLayer

    c = EngineClient("127.0.0.1:5", lib=rec, timeout_ms=100)
    rec.take()
    ids = list(range(1, n + 1))
    hashes = [bytes([i % 251]) * 32 for i in ids]
    try:
        with LineCounter() as lines:
            c.save("i", 0, 0, 0, [SaveLayer(f"l{k}", ids, hashes) for k in range(8)])
            c.query("i", "r", hashes)
            targets = list(ids)
            targets[0] = None
            c.load("i", 0, 0, "/pega_load_x", [["l0", "l1"]], [LeaseLoad(b"\x07" * 16,
                                                                         [targets])])
        return lines, rec.take()
    finally:
        c.close()


def test_binding_marshals_without_python_per_block(rec):
    small, big = _binding_calls(rec, 8), _binding_calls(rec, 64)
    assert big[0].n == small[0].n, (small[0].where, big[0].where)
    log = big[1]
    ids = ",".join(str(i) for i in range(1, 65))
    hs = " ".join((bytes([i % 251]) * 32).hex() for i in range(1, 65))
    # every layer of the Save carries the shared ids and hashes (marshalled once)
    assert log.count(f"lens=uniform ids={ids} hashes= {hs}\n") == 8
    assert "query inst=i req=r n=64" in log and f"hashes= {hs}\n" in log
    assert f"g0=-1,{ids.split(',', 1)[1]}" in log  # None -> -1
