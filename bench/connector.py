#!/usr/bin/env python3
"""bench/connector: the Python connector's per-step cost against the same libpegaflow calls
made directly, through one real pegaflow-server (sim GPU), same run, interleaved.

Each round runs vLLM-shaped steps through the connector (tests/python/harness.py: vLLM's
scheduler/worker call order around PegaKVConnector, KV caches in sim-GPU shared memory):
a saving instance computes --requests prompts of --blocks blocks (one prefill step each,
KV of every layer saved), then a second instance receives the same prompts and loads them
(query -> lease -> load, every loaded byte compared with what the saver wrote). Saves run
synchronously in wait_for_save (the save thread is off) so that every call is inside a hook.

  connector  wall time inside the connector's hooks (top-level calls from the harness, both
             roles: get_num_new_matched_tokens, build_connector_meta, start_load_kv,
             wait_for_save, get_finished, ...). The harness's own model and scheduler work
             is not counted.
  direct     the libpegaflow calls the connector made in that run (save, query, release,
             load; recorded at the EngineClient binding, the thin ctypes layer over
             libpegaflow), replayed back to back on the same instances with the same
             arguments (leases mapped to the replay's own). Neither side counts a load's
             transfer (the connector posts it and later sees it done; the replay waits for
             it untimed before the next call), nor the wait until the saves are queryable.

Between the two the server's RAM cache is emptied (POST /cache/memory/cleanup), so both
start from the same state and no save is deduplicated. Rounds alternate who goes first
(ABBA; a direct-first round replays the previous round's recording). Ratio: direct /
connector time (1.0: the connector adds nothing), min/median/max over rounds.

    python3 bench/connector.py [--rounds 5] [--requests 8] [--blocks 8] [--layers 8]
                               [--kv-events off|on|both] [--json FILE]
Environment: PF_BIN (pegaflow-server), PEGAFLOW_LIB (libpegaflow.so; default build/rel).
"""
from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(TOP, "python"))
sys.path.insert(0, os.path.join(TOP, "tests", "python"))
if importlib.util.find_spec("vllm") is None:
    sys.path.insert(0, os.path.join(TOP, "tests", "python", "vllm_stub"))

os.environ.setdefault("PYTHONHASHSEED", "0")


class Server:
    def __init__(self, bindir: str, logdir: str):
        self.log_path = os.path.join(logdir, "connector-server.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [os.path.join(bindir, "pegaflow-server"), "--gpu-backend", "sim", "--pool-size",
             "1gb", "--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            text = open(self.log_path, "rb").read()
            g = re.findall(rb"gRPC listening on \S+ \(port (\d+)\)", text)
            h = re.findall(rb"HTTP listening on \S+ \(port (\d+)\)", text)
            if g and h and b": ready" in text:
                self.port, self.http = int(g[-1]), int(h[-1])
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise RuntimeError("pegaflow-server did not start:\n" + open(self.log_path).read())

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cleanup_ram(self) -> None:
        req = urllib.request.Request(f"http://127.0.0.1:{self.http}/cache/memory/cleanup",
                                     method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


REPLAYED = ("save", "query", "query_raw", "release", "load")
MAX_GAP_S = 0.02  # longer pauses between two calls (the harness's own work) replay as this


class Recorder:
    """Wraps an EngineClient: records the replayable calls (name, args, result) and the
    wall time spent in them (``binding``: the share of the hook time that is the binding
    and libpegaflow, the rest is the connector's own Python)."""

    def __init__(self, client, calls: list, binding: list):
        self._c = client
        self._calls = calls
        self._binding = binding  # [seconds in calls, end of the last call (or None)]

    def __getattr__(self, name):
        fn = getattr(self._c, name)
        if name not in REPLAYED:
            return fn

        def call(*a, **kw):
            t0 = time.perf_counter()
            last = self._binding[1]
            try:
                r = fn(*a, **kw)
            finally:
                t1 = self._binding[1] = time.perf_counter()
                self._binding[0] += t1 - t0
            # the time since the previous call ended: the spaced replay waits as long
            gap = min(t0 - last, MAX_GAP_S) if last is not None else 0.0
            self._calls.append((name, a, kw, r, gap))
            return r

        return call


class HookTimer:
    """Wall time of top-level calls into the connector objects (nested calls not twice)."""

    def __init__(self):
        self.total = 0.0
        self.cpu = 0.0  # this thread's CPU time inside the hooks (robust on a loaded machine)
        self.depth = 0

    def wrap(self, obj) -> None:
        for name in dir(type(obj)):
            if name.startswith("_") or name in ("role", "prefer_cross_layer_blocks",
                                                "requires_kv_delivery"):
                continue
            attr = getattr(type(obj), name, None)
            if not callable(attr) or isinstance(attr, property):
                continue
            fn = getattr(obj, name)
            setattr(obj, name, self._timed(fn))

    def _timed(self, fn):
        @functools.wraps(fn)
        def call(*a, **kw):
            if self.depth:
                return fn(*a, **kw)
            self.depth += 1
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.total += time.perf_counter() - t0
                self.cpu += time.thread_time() - c0
                self.depth -= 1

        return call


def _settle_loads(w, deadline_s: float = 60.0) -> None:
    """After the (timed) start_load_kv hook, wait untimed until the server finished the
    Loads it posted, as the replay waits after each Load: the sim GPU's transfer is CPU
    work of the server, which would otherwise run during the connector's next hooks on
    this machine's cores but never during the replay's next calls (on a GPU it is DMA).
    The connector still sees the Loads done in its own get_finished."""
    timed = w.start_load_kv

    @functools.wraps(timed)
    def call(*a, **kw):
        r = timed(*a, **kw)
        dl = time.monotonic() + deadline_s
        for p in list(w._worker._pending):
            while p.state.get() == 0:  # PENDING
                if time.monotonic() > dl:
                    raise RuntimeError("a Load posted by the connector did not finish")
        return r

    w.start_load_kv = call


def prompts(round_no: int, n: int, tokens: int) -> list[list[int]]:
    return [[(round_no * 7919 + r * 104729 + t * 31) % 30000 + 1 for t in range(tokens)]
            for r in range(n)]


def connector_run(args, srv, lib, round_no, patch):
    """One connector round; returns (hook seconds, steps, recorded calls, engines)."""
    import pegaflow.connector.worker as worker_mod
    from harness import Engine, RealBackend

    calls: list = []
    binding = [0.0, None]
    backend = RealBackend(srv.target, lib)
    make = backend.client
    backend.client = lambda: Recorder(make(), calls, binding)
    timer = HookTimer()
    kw = dict(tp=1, layers=args.layers, num_blocks=max(64, 2 * args.requests * args.blocks + 8),
              block_size=16, heads=4, head_dim=64, token_budget=args.blocks * 16 * args.requests,
              kv_events=args.kv_events)
    saver = Engine(backend, patch, instance_id=f"bench-save-{round_no}", **kw)
    loader = Engine(backend, patch, instance_id=f"bench-load-{round_no}", **kw)
    for e in (saver, loader):
        # vLLM allocates its KV cache zero-filled at startup, so its pages exist before the
        # first step; do the same (untimed) rather than charge the connector with the
        # first touch of fresh sim memory, which the replay (on these instances) never pays
        for kv in e.kv:
            for t in kv.values():
                t.numpy()[...] = 0
        warm_server(make(), e)
    srv.cleanup_ram()
    for e in (saver, loader):
        timer.wrap(e.sched)
        for w in e.workers:
            timer.wrap(w)
            _settle_loads(w)
    binding[:] = [0.0, None]  # from here on every recorded call is inside a hook
    ps = prompts(round_no, args.requests, args.blocks * 16 + 1)
    for i, p in enumerate(ps):
        saver.add_request(f"s{round_no}-{i}", p, max_tokens=1)
    steps = saver.run(timeout_s=120)
    # the saves are sealed before the loader asks (a query would otherwise miss)
    probe = make()
    want = [bytes(h) for i in range(len(ps))
            for h in saver.requests[f"s{round_no}-{i}"].block_hashes[:args.blocks]]
    wait_queryable(probe, f"bench-load-{round_no}", want)
    probe.close()
    calls.append(("barrier", (f"bench-load-{round_no}", want), {}, None, 0.0))
    binding[1] = None  # the loader's first call: no gap across the barrier
    for i, p in enumerate(ps):
        loader.add_request(f"l{round_no}-{i}", p, max_tokens=1)
    steps += loader.run(timeout_s=120)
    for i in range(len(ps)):
        lg = loader.logs[f"l{round_no}-{i}"]
        snap = saver.logs[f"s{round_no}-{i}"].snapshot
        if lg.loaded_blocks < args.blocks:
            raise RuntimeError(f"request {i}: loaded {lg.loaded_blocks} of {args.blocks} blocks")
        for h, blocks in lg.loaded.items():
            if blocks != snap[h]:
                raise RuntimeError(f"request {i}: loaded bytes differ from the saved ones")
    del worker_mod
    return timer.total, timer.cpu, binding[0], steps, calls, (saver, loader)


def warm_server(client, engine) -> None:
    """One untimed Save of every block of every worker of a fresh instance (other hashes),
    waited for until queryable: the server maps the instance's KV memory and touches each
    page once, as during the first steps of a running vLLM. The caller then empties the RAM
    cache. Without it the connector run (fresh instances) pays the sim's first-touch page
    faults that the replay, on the same instances afterwards, never sees."""
    from pegaflow.client.engine import SaveLayer

    for i, w in enumerate(engine.workers):
        wc = w._worker
        inst = wc.ctx.instance_id
        ids = list(range(engine.num_blocks))
        hs = [f"warm-{inst}-{i}-{b}".encode().ljust(32, b"#") for b in ids]
        client.save(inst, wc.ctx.tp_rank, wc.ctx.pp_rank, wc.device_id,
                    [SaveLayer(n, ids, hs) for n in wc.layers])
        wait_queryable(client, inst, hs)
    client.close()


def wait_queryable(client, instance_id: str, hashes: list, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        q = client.query_raw(instance_id, "probe", hashes)
        if q.lease:
            client.release(q.lease)
        if not q.loading and q.num_hit_blocks == len(hashes):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"saved blocks not queryable after {timeout_s} s")
        time.sleep(0.002)


def replay(calls, client, lib, deadline_s=60.0, spaced: bool = False) -> float:
    """The recorded calls, back to back (``spaced``: each after the pause that preceded it
    in the connector's run, untimed); returns (wall seconds, this thread's CPU seconds)
    (waits for visibility between the save and load halves are not counted, as in the
    connector run)."""
    import dataclasses

    from pegaflow.client.loadstate import create_load_state, state_is_done, state_is_success

    leases: dict[bytes, bytes] = {}
    total = cpu = 0.0
    for name, a, kw, rec, gap in calls:
        if name == "barrier":  # untimed: the saves are sealed before the loads begin
            wait_queryable(client, *a)
            continue
        a = list(a)
        if name == "release":
            a[0] = leases.get(a[0], a[0])
        st = None
        if name == "load":
            a[5] = [dataclasses.replace(ll, lease=leases.get(ll.lease, ll.lease)) for ll in a[5]]
        if spaced and gap > 0:
            # untimed: as long as the connector's run went between its two calls (idle
            # here, the connector's and the harness's own work there)
            time.sleep(gap)
        t0, c0 = time.perf_counter(), time.thread_time()
        if name == "load":
            # timed: a Load needs its completion record (pf_loadstate_create), which the
            # connector creates inside start_load_kv and destroys when it saw it final
            st = create_load_state(lib)
            a[3] = st.name
        r = getattr(client, name)(*a, **kw)
        total += time.perf_counter() - t0
        cpu += time.thread_time() - c0
        if st is not None:
            # untimed, as in the connector, whose hooks post a load and later see it done
            dl = time.monotonic() + deadline_s
            while not state_is_done(st.get()):
                if time.monotonic() > dl:
                    raise RuntimeError("replayed load not done")
            ok = state_is_success(st.get())
            t0, c0 = time.perf_counter(), time.thread_time()
            st.close()
            total += time.perf_counter() - t0
            cpu += time.thread_time() - c0
            if not ok:
                raise RuntimeError("replayed load failed")
        if name in ("query", "query_raw") and rec is not None and rec.lease and r.lease:
            leases[rec.lease] = r.lease
        elif name in ("query", "query_raw") and r.lease and not (rec and rec.lease):
            client.release(r.lease)  # the connector got no lease here: do not hold one
    for new in leases.values():
        try:
            client.release(new)
        except Exception:
            pass
    return total, cpu


def measure(a, srv, lib, direct, patch, kv_events: bool) -> dict:
    """The ABBA rounds of one configuration; medians and min/median/max ratios."""
    a.kv_events = kv_events
    conn_s, direct_s, ratios, steps_l, ncalls = [], [], [], [], []
    cpu_ratios, conn_cpu, direct_cpu, bind_s = [], [], [], []
    spaced_s, spaced_cpu, sratios = [], [], []
    live: list = []  # engines of the last round (a direct-first round replays on them)
    try:
        prev = None
        for r in range(-1, a.rounds):  # round -1: warm-up, untimed
            direct_first = r >= 0 and r % 2 == 1 and prev is not None
            d = None
            # each side starts from a collected heap: a collection the other side's garbage
            # triggers would otherwise land in whichever runs second
            if direct_first:
                d, dc, sp, spc = replays(prev, srv, direct, lib)
            # older instances are shut down (untimed): their watch threads would otherwise
            # pile up round after round and compete for the GIL with both sides
            _shutdown(live)
            srv.cleanup_ram()
            gc.collect()
            # (instance ids and prompts distinct per configuration and round)
            c, cc, cb, steps, calls, engines = connector_run(a, srv, lib,
                                                             r + 1 + 100 * kv_events, patch)
            live = list(engines)
            if not direct_first:
                d, dc, sp, spc = replays(calls, srv, direct, lib)
            prev = calls
            if r < 0:
                continue
            conn_s.append(c)
            direct_s.append(d)
            spaced_s.append(sp)
            spaced_cpu.append(spc)
            sratios.append(sp / c)
            bind_s.append(cb)
            ratios.append(d / c)
            conn_cpu.append(cc)
            direct_cpu.append(dc)
            cpu_ratios.append(dc / cc if cc > 0 else 0.0)
            steps_l.append(steps)
            ncalls.append(sum(1 for x in calls if x[0] != "barrier"))
            print(f"  events {'on' if kv_events else 'off'}, round {r + 1}: connector "
                  f"{c * 1e3:.1f} ms in hooks over {steps} steps ({cb * 1e3:.1f} ms of it in "
                  f"the binding), direct {d * 1e3:.1f} ms for {ncalls[-1]} calls, ratio "
                  f"{d / c:.2f}; CPU {cc * 1e3:.1f} / {dc * 1e3:.1f} ms, ratio "
                  f"{cpu_ratios[-1]:.2f}; spaced direct {sp * 1e3:.1f} ms (CPU "
                  f"{spc * 1e3:.1f}), ratio {sp / c:.2f}", file=sys.stderr, flush=True)
    finally:
        _shutdown(live)
    med_c, med_d = statistics.median(conn_s), statistics.median(direct_s)
    steps = statistics.median(steps_l)
    return {"connector_ms": med_c * 1e3, "direct_ms": med_d * 1e3,
            "binding_in_hooks_ms": statistics.median(bind_s) * 1e3,
            "ratio": [min(ratios), statistics.median(ratios), max(ratios)], "steps": steps,
            "overhead_us_per_step": (med_c - med_d) / steps * 1e6 if steps else 0.0,
            "calls": statistics.median(ncalls),
            "connector_cpu_ms": statistics.median(conn_cpu) * 1e3,
            "direct_cpu_ms": statistics.median(direct_cpu) * 1e3,
            "cpu_ratio": [min(cpu_ratios), statistics.median(cpu_ratios), max(cpu_ratios)],
            "spaced_direct_ms": statistics.median(spaced_s) * 1e3,
            "spaced_direct_cpu_ms": statistics.median(spaced_cpu) * 1e3,
            "spaced_ratio": [min(sratios), statistics.median(sratios), max(sratios)]}


def replays(calls, srv, direct, lib):
    """The recording replayed back to back, then spaced as the connector made it; the RAM
    cache emptied and the heap collected before each."""
    out = []
    for spaced in (False, True):
        srv.cleanup_ram()
        gc.collect()
        out += replay(calls, direct, lib, spaced=spaced)
    return out


def _shutdown(engines) -> None:
    for e in engines:
        try:
            e.shutdown()
        except Exception:
            pass
    engines[:] = []


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--kv-events", choices=("off", "on", "both"), default="both",
                    help="vLLM's kv_events_config: off (vLLM's default: no KV events "
                         "published), on (enable_kv_cache_events), or both, one row each")
    ap.add_argument("--json")
    a = ap.parse_args()
    bindir = os.environ.get("PF_BIN", os.path.join(TOP, "build", "rel", "bin"))
    libpath = os.environ.get("PEGAFLOW_LIB", os.path.join(TOP, "build", "rel", "lib",
                                                          "libpegaflow.so"))
    from pegaflow.client import _lib
    from pegaflow.client.engine import EngineClient
    import pegaflow.connector.worker as worker_mod

    lib = _lib.load_library(libpath)
    # saves inside wait_for_save (no background thread): every call is inside a hook
    orig_init = worker_mod.WorkerConnector.__init__

    def sync_init(self, *x, **kw):
        kw["save_thread"] = False
        orig_init(self, *x, **kw)

    worker_mod.WorkerConnector.__init__ = sync_init
    undo = []

    def patch(obj, name, value):
        undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    configs = {"off": [False], "on": [True], "both": [False, True]}[a.kv_events]
    logdir = tempfile.mkdtemp(prefix="pf-bench-connector-")
    srv = Server(bindir, logdir)
    direct = EngineClient(srv.target, lib=lib, timeout_ms=30000)
    res = {}
    try:
        for ev in configs:
            res[ev] = measure(a, srv, lib, direct, patch, ev)
    finally:
        direct.close()
        srv.stop()
        worker_mod.WorkerConnector.__init__ = orig_init
        for obj, name, v in reversed(undo):
            setattr(obj, name, v)
    print(f"{'path':<48} {'connector ms':>12} {'direct ms':>10} {'min':>6} {'median':>6} "
          f"{'max':>6}")
    for ev, j in res.items():
        rs, crs = j["ratio"], j["cpu_ratio"]
        label = ("KV events on (enable_kv_cache_events)" if ev
                 else "KV events off (vLLM's default)")
        print(f"{'save+load of vLLM-shaped steps, ' + label:<48}")
        print(f"{'  wall time in hooks':<48} {j['connector_ms']:>12.1f} {j['direct_ms']:>10.1f} "
              f"{rs[0]:>6.2f} {rs[1]:>6.2f} {rs[2]:>6.2f}")
        print(f"{'    of it in the binding (libpegaflow calls)':<48} "
              f"{j['binding_in_hooks_ms']:>12.1f}")
        print(f"{'  CPU time of the calling thread':<48} {j['connector_cpu_ms']:>12.1f} "
              f"{j['direct_cpu_ms']:>10.1f} {crs[0]:>6.2f} {crs[1]:>6.2f} {crs[2]:>6.2f}")
        srs = j["spaced_ratio"]
        print(f"{'  wall, direct spaced as the connector':<48} {j['connector_ms']:>12.1f} "
              f"{j['spaced_direct_ms']:>10.1f} {srs[0]:>6.2f} {srs[1]:>6.2f} {srs[2]:>6.2f}"
              f"   (direct CPU {j['spaced_direct_cpu_ms']:.1f} ms)")
        print(f"  connector overhead: {j['connector_ms'] - j['direct_ms']:.2f} ms per round, "
              f"{j['overhead_us_per_step']:.0f} us per computing step ({j['steps']:.0f} steps, "
              f"{j['calls']:.0f} libpegaflow calls per round)")
    print(f"method: {a.rounds} rounds ABBA per row (odd rounds replay first), warm-up untimed; "
          f"{a.requests} requests x {a.blocks} blocks of 16 tokens, {a.layers} layers, TP 1, "
          f"sim GPU; connector = wall time inside its hooks (saves synchronous), of which the "
          f"recorded binding calls; direct = the same recorded libpegaflow calls replayed "
          f"through the ctypes binding back to back, and spaced (each after the pause that "
          f"preceded it in the connector's run, at most {MAX_GAP_S * 1e3:.0f} ms, untimed), "
          f"a Load with its load state's creation and destruction "
          f"(load transfers and the wait for sealed saves untimed on both sides); RAM cache "
          f"emptied before each; every loaded byte compared with the saved one; "
          f"ratio = direct / connector")
    # top level: the first configuration (events off unless --kv-events on)
    first = res[configs[0]]
    doc = {"bench": "connector", "rounds": a.rounds, "requests": a.requests,
           "blocks": a.blocks, "layers": a.layers, "kv_events": configs[0], **first}
    if True in res and configs[0] is not True:
        doc["kv_events_on"] = res[True]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
