"""pegaflow-sim: flags, the run (set-up, workload, fault events, progress), the report.
See docs/simulation.md ("pegaflow-sim")."""

from __future__ import annotations

import argparse
import math
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time

from pegaflow.sim import cluster as cl
from pegaflow.sim import efficiency, promtext, report
from pegaflow.sim.engine import MODELS
from pegaflow.sim.workload import Workload

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
TIER_LABEL = {"ram": "ram", "ssd": "ssd", "remote": "rdma", "miss": "miss"}


class Usage(Exception):
    pass


def sanitizer_env(lib: str) -> dict[str, str]:
    """A libpegaflow built with SAN=address|thread loads into the node processes' python
    (not instrumented) only with its sanitizer runtime preloaded; Python's own allocations
    are not leak-checked."""
    try:
        out = subprocess.run(["ldd", lib], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    rts = [m for m in re.findall(r"=>\s*(\S*lib(?:asan|ubsan|tsan)\.so[.\d]*)", out)]
    if not rts:
        return {}
    env = {"LD_PRELOAD": " ".join(rts)}
    if any("asan" in r for r in rts):
        env["ASAN_OPTIONS"] = (os.environ.get("ASAN_OPTIONS", "") +
                               ":detect_leaks=0:verify_asan_link_order=0").lstrip(":")
    return env


def parse_when(s: str) -> tuple[str, float]:
    """'30s', '500ms', '30' (seconds since the workload started) or '40%' (of the
    requests dispatched)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|%)?\s*", s)
    if not m:
        raise Usage(f"bad time {s!r}: use 30s, 500ms or 40% (of the requests)")
    v, unit = float(m.group(1)), m.group(2) or "s"
    if unit == "%":
        if v > 100:
            raise Usage(f"bad time {s!r}: a percentage of the requests is at most 100%")
        return "pct", v
    return "t", v / 1000 if unit == "ms" else v


def parse_node_event(s: str, nodes: int, flag: str) -> tuple[int, str, float]:
    if "@" not in s:
        raise Usage(f"{flag} {s!r}: expected NODE@TIME, e.g. 2@30s (nodes are 1..{nodes})")
    n, when = s.split("@", 1)
    if not n.strip().isdigit() or not 1 <= int(n) <= nodes:
        raise Usage(f"{flag} {s!r}: node {n!r} is not one of 1..{nodes}")
    kind, v = parse_when(when)
    return int(n), kind, v


def parse_size(s: str) -> str:
    if not re.fullmatch(r"\d+(k|m|g|kb|mb|gb|kib|mib|gib)?", s.strip().lower()):
        raise Usage(f"--pool-size {s!r}: expected a size such as 256mb or 1gb")
    return s.strip().lower()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="pegaflow-sim",
        description="A local PegaFlow cluster: a MetaServer and N pegaflow-server nodes (sim "
        "GPUs, TCP fabric, optional SSD files), each in its own network namespace as root "
        "(distinct loopback addresses otherwise), driven through the real vLLM connector "
        "with a multi-turn, shared-prefix workload. Nodes are numbered 1..N.",
        epilog="Times: 30s, 500ms, or 40% (when that share of the requests has been "
        "dispatched). Example: pegaflow-sim --nodes 3 --requests 300 --kill-node 2@30% "
        "--restart-node 2@60% --json out.json --plot out.svg. See docs/simulation.md.")
    ap.add_argument("--nodes", type=int, default=3, help="pegaflow-server nodes (default 3)")
    ap.add_argument("--requests", type=int, default=300, help="requests (turns) to replay "
                    "(default 300)")
    ap.add_argument("--rate", type=float, default=20.0, help="arrivals per second, Poisson "
                    "(default 20; 0 = as fast as the nodes take them)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the workload and the KV "
                    "contents (default: random, printed)")
    ap.add_argument("--pool-size", default=None, help="each node's --pool-size (default per "
                    "model: tiny 32mb, llama-8b-like 256mb, mla-like 96mb)")
    ap.add_argument("--ssd", choices=("on", "off"), default="off", help="an SSD cache file "
                    "per node in the temporary directory (default off)")
    ap.add_argument("--ssd-capacity", default="1gb", help="each node's SSD file (default 1gb)")
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny",
                    help="KV shapes (default tiny)")
    ap.add_argument("--route", choices=("round-robin", "sticky", "random"),
                    default="round-robin", help="request routing (default round-robin; "
                    "sticky: a conversation stays on one node)")
    ap.add_argument("--json", metavar="FILE", help="write the report as JSON")
    ap.add_argument("--plot", metavar="FILE", help="write an SVG of hit ratio per tier over "
                    "time with the fault events")
    ap.add_argument("--kill-node", action="append", default=[], metavar="N@TIME",
                    help="SIGKILL node N's pegaflow-server at TIME (repeatable)")
    ap.add_argument("--restart-node", action="append", default=[], metavar="N@TIME",
                    help="start node N's server again (same address and flags) at TIME")
    ap.add_argument("--kill-metaserver", metavar="TIME", help="SIGKILL the MetaServer at TIME")
    ap.add_argument("--restart-metaserver", metavar="TIME",
                    help="start the MetaServer again at TIME")
    ap.add_argument("--fault-spec", action="append", default=[], metavar="[N:]SPEC",
                    help="HAL fault plan (docs/simulation.md, e.g. 'net.read:prob=0.05,"
                    "corrupt=1') for every node, or node N only; the servers get "
                    "--enable-debug. Repeatable")
    ap.add_argument("--keep", action="store_true", help="after the workload leave the "
                    "cluster up, print how to reach each node, tear down on Ctrl-C")
    ap.add_argument("--loopback", action="store_true", help="loopback addresses even as root")
    ap.add_argument("--logs", metavar="DIR", help="copy every process's log here at the end")
    ap.add_argument("--cleanup", action="store_true", help="only remove what a killed "
                    "earlier run left behind, then exit")
    ap.add_argument("--bin", default=os.environ.get("PF_BIN") or os.path.join(TOP, "build",
                    "rel", "bin"), help="directory of pegaflow-server and pegaflow-metaserver")
    ap.add_argument("--lib", default=os.environ.get("PEGAFLOW_LIB") or os.path.join(
                    TOP, "build", "rel", "lib", "libpegaflow.so"), help="libpegaflow.so")
    return ap


class Sim:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.tty = sys.stdout.isatty()
        self.model = MODELS[a.model]
        self.c: cl.Cluster | None = None
        self.ms: cl.Proc | None = None
        self.ms_port = 0
        self.servers: dict[int, cl.Proc | None] = {}
        self.ports: dict[int, tuple[int, int]] = {}
        self.drivers: dict[int, cl.Proc] = {}
        self.events: "queue.Queue[tuple[int, dict]]" = queue.Queue()
        self.faults: dict[int, list[str]] = {}
        self.base: dict[int, dict[str, float]] = {}
        self.last: dict[int, dict[str, float]] = {}
        self.done: dict[int, list[dict]] = {}
        self.timeline: list[dict] = []
        self.fault_log: list[dict] = []
        self.t0 = 0.0
        self.t0_wall = 0.0
        self.block_bytes = self.model.block_bytes
        self.lives = efficiency.Lives()  # server lives per node (wall clock)
        self.restarted: set[int] = set()  # nodes whose server was restarted
        self.holds = efficiency.Holdings(self.lives)  # who saved / loaded which block when

    def say(self, msg: str) -> None:
        if self.tty:
            sys.stdout.write("\r\033[K")
        print(msg, flush=True)

    # ------------------------------------------------------------ set-up

    def start_metaserver(self) -> None:
        m = self.c.members["ms"]
        log = self.c.log_path("metaserver")
        start = os.path.getsize(log) if os.path.exists(log) else 0  # a restart appends
        self.ms = self.c.spawn("metaserver", m, [
            os.path.join(self.a.bin, "pegaflow-metaserver"), "--addr", f"{m.ip}:{self.ms_port}",
            "--http-addr", f"{m.ip}:0", "--node-stale-secs", "5",
            "--cluster-token-file", self.c.token_file])
        pat = r"gRPC listening on \S+ \(port (\d+)\)"
        self.ms_port = int(self.c.wait_log(self.ms, pat, start_at=start).group(1))

    def server_argv(self, k: int) -> list[str]:
        m, ms = self.c.members[f"n{k}"], self.c.members["ms"]
        gp, hp = self.ports.get(k, (0, 0))
        pool = self.a.pool_size or {"tiny": "32mb", "llama-8b-like": "256mb",
                                    "mla-like": "96mb"}[self.model.name]
        argv = [os.path.join(self.a.bin, "pegaflow-server"), "--addr", f"{m.ip}:{gp}",
                "--http-addr", f"{m.ip}:{hp}", "--gpu-backend", "sim", "--sim-gpus", "1",
                "--pool-size", pool, "--net-backend", "tcp", "--nics", m.nic,
                "--metaserver-addr", f"http://{ms.ip}:{self.ms_port}",
                "--cluster-token-file", self.c.token_file]
        if self.a.ssd == "on":
            argv += ["--ssd-cache-path", self.c.ssd_path(f"n{k}.ssd"),
                     "--ssd-cache-capacity", self.a.ssd_capacity]
        if self.faults.get(k):
            argv += ["--enable-debug", "--fault-spec", ";".join(self.faults[k])]
        return argv

    def start_server(self, k: int, wait_meta: bool = True) -> None:
        """Starts node k's server and waits until it is ready (and, with wait_meta, holds its
        MetaServer session: a restarted node gets one only once the MetaServer considers
        its previous life stale, --node-stale-secs, so a restart does not wait for it)."""
        log = self.c.log_path(f"server n{k}")
        start = os.path.getsize(log) if os.path.exists(log) else 0  # a restart appends
        p = self.c.spawn(f"server n{k}", self.c.members[f"n{k}"], self.server_argv(k))
        self.servers[k] = p
        g = int(self.c.wait_log(p, r"gRPC listening on \S+ \(port (\d+)\)",
                                start_at=start).group(1))
        h = int(self.c.wait_log(p, r"HTTP listening on \S+ \(port (\d+)\)",
                                start_at=start).group(1))
        self.ports[k] = (g, h)
        self.c.wait_log(p, r": ready\n", start_at=start)
        self.lives.start(k, time.time())
        if wait_meta and self.ms is not None and self.ms.popen.poll() is None:
            self.c.wait_log(p, "MetaServer session established", start_at=start)

    def start_driver(self, k: int, seed: int) -> None:
        m = self.c.members[f"n{k}"]
        g, h = self.ports[k]
        env = dict(os.environ)
        stub = os.path.join(TOP, "tests", "python", "vllm_stub")
        env["PYTHONPATH"] = os.pathsep.join([os.path.join(TOP, "python"), stub]
                                            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                               else []))
        env["PEGAFLOW_LIB"] = self.a.lib
        env.update(sanitizer_env(self.a.lib))
        argv = [sys.executable, "-m", "pegaflow.sim.node", "--host", m.ip, "--port", str(g),
                "--metrics-url", f"http://{m.ip}:{h}/metrics", "--instance", f"sim-n{k}",
                "--model", self.model.name, "--seed", str(seed)]
        since = time.time()
        p = self.c.spawn(f"node n{k}", m, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         env=env)
        self.drivers[k] = p
        self.c.shm_pids.append([p.popen.pid, since])
        self.c.save_state()
        threading.Thread(target=self._reader, args=(k, p), daemon=True).start()

    def _reader(self, k: int, p: cl.Proc) -> None:
        import json

        for line in p.popen.stdout:
            try:
                self.events.put((k, json.loads(line)))
            except ValueError:
                pass
        self.events.put((k, {"ev": "eof"}))

    def send(self, k: int, obj: dict) -> None:
        import json

        p = self.drivers[k].popen
        p.stdin.write((json.dumps(obj) + "\n").encode())
        p.stdin.flush()

    # ------------------------------------------------------------ accounting

    def totals(self, k: int) -> dict[str, float]:
        out = dict(self.base.get(k, {}))
        for key, v in self.last.get(k, {}).items():
            out[key] = out.get(key, 0.0) + v
        return out

    def tier_blocks(self, m: dict[str, float]) -> dict[str, int]:
        return {t: int(promtext.get(m, "pegaflow_cache_tier_block_requests_total",
                                    tier=TIER_LABEL[t])) for t in report.TIERS}

    def handle(self, k: int, ev: dict, wl: Workload, pending: dict) -> None:
        kind = ev.get("ev")
        if kind in ("metrics", "paused") and ev.get("m") is not None:
            self.last[k] = ev["m"]
            self.record_point()
        elif kind == "saved":
            self.holds.hold(k, ev["t"], ev["h"])
        elif kind == "done":
            self.done.setdefault(k, []).append(ev)
            if ev.get("loaded_blocks") and ev.get("t_loaded"):
                self.holds.hold(k, ev["t_loaded"], (ev.get("asked") or [])[:ev["loaded_blocks"]])
            cid = pending.pop(ev["id"], None)
            if cid is not None:
                wl.answered(cid, ev["output"])
        elif kind == "eof" and not self.drivers[k].expected_exit:
            p = self.drivers[k]
            p.popen.wait(10)
            raise RuntimeError(f"node n{k} (vLLM stand-in) exited with {p.popen.returncode}; "
                               f"log {p.log}:\n{cl.tail(p.log)}")

    def record_point(self) -> None:
        pt = {"t": time.monotonic() - self.t0, **{t: 0 for t in report.TIERS}}
        for k in self.servers:
            for t, v in self.tier_blocks(self.totals(k)).items():
                pt[t] += v
        for k, dl in self.done.items():
            pt["miss"] += sum(d["requested"] for d in dl if d["unreachable"])
        self.timeline.append(pt)

    def pump(self, wl: Workload, pending: dict, timeout: float) -> None:
        try:
            k, ev = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        self.handle(k, ev, wl, pending)
        while True:
            try:
                k, ev = self.events.get_nowait()
            except queue.Empty:
                return
            self.handle(k, ev, wl, pending)

    # ------------------------------------------------------------ fault events

    def fire(self, what: str, k: int | None, wl: Workload, pending: dict) -> None:
        t = time.monotonic() - self.t0
        if what == "kill-node":
            p = self.servers.get(k)
            if p is None or p.popen.poll() is not None:
                self.say(f"[{t:6.1f}s] kill node n{k}: not running, skipped")
                return
            # pause the node's vLLM so the final scrape of this server life is exact
            self.send(k, {"op": "pause"})
            deadline = time.monotonic() + 10
            got = False
            while time.monotonic() < deadline and not got:
                try:
                    kk, ev = self.events.get(timeout=0.5)
                except queue.Empty:
                    continue
                self.handle(kk, ev, wl, pending)
                got = kk == k and ev.get("ev") == "paused"
            self.c.kill(p, signal.SIGKILL)
            self.lives.end(k, time.time())
            for key, v in self.last.pop(k, {}).items():
                self.base.setdefault(k, {})[key] = self.base.setdefault(k, {}).get(key, 0) + v
            self.send(k, {"op": "resume"})
            self.say(f"[{t:6.1f}s] killed node n{k}'s pegaflow-server (SIGKILL)")
        elif what == "restart-node":
            p = self.servers.get(k)
            if p is not None and p.popen.poll() is None:
                self.say(f"[{t:6.1f}s] restart node n{k}: still running, skipped")
                return
            self.start_server(k, wait_meta=False)
            self.restarted.add(k)
            self.say(f"[{t:6.1f}s] restarted node n{k}'s pegaflow-server (ready after "
                     f"{time.monotonic() - self.t0 - t:.1f} s)")
        elif what == "kill-metaserver":
            self.c.kill(self.ms, signal.SIGKILL)
            self.say(f"[{t:6.1f}s] killed the MetaServer (SIGKILL)")
        elif what == "restart-metaserver":
            if self.ms.popen.poll() is None:
                return
            self.start_metaserver()
            self.say(f"[{t:6.1f}s] restarted the MetaServer (ready after "
                     f"{time.monotonic() - self.t0 - t:.1f} s)")
        verb = what.split("-", 1)[0]  # kill | restart
        self.fault_log.append({"t": t, "what": f"{verb} {f'n{k}' if k else 'metaserver'}"})
        self.record_point()

    # ------------------------------------------------------------ the run

    def run(self) -> int:
        a = self.a
        seed = a.seed if a.seed is not None else random.SystemRandom().randrange(1, 2**31)
        for f in ("pegaflow-server", "pegaflow-metaserver"):
            if not os.access(os.path.join(a.bin, f), os.X_OK):
                raise Usage(f"{a.bin}/{f} not found: build first (make) or give --bin")
        if not os.path.exists(a.lib):
            raise Usage(f"{a.lib} not found: build first (make) or give --lib")
        sched = []
        for s in a.kill_node:
            sched.append(("kill-node", *parse_node_event(s, a.nodes, "--kill-node")))
        for s in a.restart_node:
            sched.append(("restart-node", *parse_node_event(s, a.nodes, "--restart-node")))
        if a.kill_metaserver:
            sched.append(("kill-metaserver", None, *parse_when(a.kill_metaserver)))
        if a.restart_metaserver:
            sched.append(("restart-metaserver", None, *parse_when(a.restart_metaserver)))
        for spec in a.fault_spec:
            m = re.match(r"^(\d+):(.+)$", spec)
            targets = [int(m.group(1))] if m else list(range(1, a.nodes + 1))
            if m and not 1 <= int(m.group(1)) <= a.nodes:
                raise Usage(f"--fault-spec {spec!r}: node {m.group(1)} is not one of "
                            f"1..{a.nodes}")
            for k in targets:
                self.faults.setdefault(k, []).append(m.group(2) if m else spec)
        ok, why = cl.netns_possible()
        mode = "netns" if ok and not a.loopback else "loopback"
        cl.clean_stale(self.say)
        self.c = cl.new_cluster(mode, a.logs)
        self.say(f"pegaflow-sim: {a.nodes} nodes, {a.requests} requests at "
                 f"{a.rate:g}/s, model {self.model.name} ({self.block_bytes // 1024} KiB/block),"
                 f" route {a.route}, ssd {a.ssd}, seed {seed}")
        if mode == "netns":
            self.say("network: a namespace per node (pfsim-*), bridge in pfsim-hub, "
                     f"{cl.SUBNET}.0/24")
        else:
            self.say("network: loopback addresses 127.0.0.1 (MetaServer), 127.0.0.2.. "
                     f"(nodes){' (' + why + ')' if why and not a.loopback else ''}")
        self.c.setup_network(a.nodes)
        self.start_metaserver()
        for k in range(1, a.nodes + 1):
            self.start_server(k)
        for k in range(1, a.nodes + 1):
            self.start_driver(k, seed)
        ready = set()
        deadline = time.monotonic() + 60
        while len(ready) < a.nodes:
            if time.monotonic() > deadline:
                raise RuntimeError("the node processes did not report ready in 60 s")
            try:
                k, ev = self.events.get(timeout=0.5)
            except queue.Empty:
                self.check_children()
                continue
            if ev.get("ev") == "ready":
                ready.add(k)
            elif ev.get("ev") == "eof":
                p = self.drivers[k]
                raise RuntimeError(f"node n{k} failed to start; log {p.log}:\n{cl.tail(p.log)}")
        for k in range(1, a.nodes + 1):
            g, h = self.ports[k]
            m = self.c.members[f"n{k}"]
            self.say(f"  n{k}: pegaflow-server {m.ip}:{g} (metrics http://{m.ip}:{h}/metrics)"
                     f"{' in netns ' + m.ns if m.ns else ''}")
        self.say(f"  MetaServer {self.c.members['ms'].ip}:{self.ms_port}; logs in "
                 f"{self.c.tmpdir}")

        wl = Workload(seed, a.nodes, route=a.route)
        arrivals = random.Random(seed ^ 0x5EED)
        pending: dict[str, int] = {}
        dispatched = 0
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        next_at = 0.0
        last_print = 0.0
        last_plain = -1
        while True:
            now = time.monotonic() - self.t0
            for ev in list(sched):
                what, k, kind, v = ev
                if (kind == "t" and now >= v) or (kind == "pct" and
                                                  dispatched >= a.requests * v / 100):
                    sched.remove(ev)
                    self.fire(what, k, wl, pending)
            ndone = sum(len(v) for v in self.done.values())
            if ndone >= a.requests and not sched:
                break
            if ndone >= a.requests and sched:
                # events after the last request: fire them now, in order
                sched.sort(key=lambda e: e[3])
                continue_at = sched[0]
                sched.remove(continue_at)
                self.fire(continue_at[0], continue_at[1], wl, pending)
                continue
            while dispatched < a.requests and now >= next_at:
                rid, node, prompt, max_tokens, cid = wl.next_request()
                pending[rid] = cid
                self.send(node + 1, {"op": "req", "id": rid, "prompt": prompt,
                                     "max_tokens": max_tokens})
                dispatched += 1
                next_at += arrivals.expovariate(a.rate) if a.rate > 0 else 0.0
            self.check_children()
            self.pump(wl, pending, 0.05)
            if now - last_print >= (0.25 if self.tty else 2.0):
                last_print = now
                line = self.progress(ndone, now)
                if self.tty:
                    sys.stdout.write("\r\033[K" + line)
                    sys.stdout.flush()
                elif ndone * 10 // max(1, a.requests) != last_plain:
                    last_plain = ndone * 10 // max(1, a.requests)
                    print(line, flush=True)
        elapsed = time.monotonic() - self.t0
        if self.tty:
            sys.stdout.write("\r\033[K")
        print(self.progress(a.requests, elapsed), flush=True)
        # final scrapes (the nodes answer with a last metrics line before pausing)
        for k in self.drivers:
            self.send(k, {"op": "pause"})
        want = set(k for k in self.drivers)
        deadline = time.monotonic() + 15
        while want and time.monotonic() < deadline:
            try:
                k, ev = self.events.get(timeout=0.5)
            except queue.Empty:
                continue
            self.handle(k, ev, wl, pending)
            if ev.get("ev") == "paused":
                want.discard(k)
        doc = self.build_report(seed, elapsed, mode)
        print(report.table(doc["nodes"], doc["total"]))
        print(report.delivery_table(doc))
        tot = doc["total"]
        verdict = ("every loaded block matched what was saved"
                   if tot["integrity_failures"] == 0 else
                   f"{tot['integrity_failures']} LOADED BLOCKS DIFFER from what was saved "
                   f"({tot['bytes_mismatched']} bytes)")
        print(f"integrity: {tot['verified_blocks']} loaded blocks checked byte for byte: "
              f"{verdict}; {tot['checksum_rejections']} blocks rejected by checksum "
              "(turned into misses)")
        if not doc["accounting_ok"]:
            print("accounting: ram + ssd + remote + miss != requested on "
                  + ", ".join(r["node"] for r in doc["nodes"] if not r["accounting_ok"]))
        if a.json:
            report.write_json(a.json, doc)
            print(f"json: {a.json}")
        if a.plot:
            report.svg(a.plot, self.timeline, self.fault_log,
                       f"pegaflow-sim: {a.nodes} nodes, {a.requests} requests, "
                       f"{self.model.name}, seed {seed}",
                       efficiency=efficiency.windowed(self.done, self.t0_wall))
            print(f"plot: {a.plot}")
        if a.keep:
            for k in self.drivers:
                self.send(k, {"op": "resume"})
            print("cluster kept up (Ctrl-C tears it down):")
            for k in range(1, a.nodes + 1):
                m = self.c.members[f"n{k}"]
                pre = f"ip netns exec {m.ns} " if m.ns else ""
                print(f"  n{k}: {pre}curl -s http://{m.ip}:{self.ports[k][1]}/metrics")
            while True:
                self.check_children()
                try:
                    self.events.get(timeout=1.0)
                except queue.Empty:
                    pass
        self.stop_drivers()
        bad = tot["integrity_failures"] or not doc["accounting_ok"]
        return 1 if bad else 0

    def progress(self, ndone: int, now: float) -> str:
        a = self.a
        pt = self.timeline[-1] if self.timeline else {t: 0 for t in report.TIERS}
        n = sum(pt[t] for t in report.TIERS) or 1
        rate = ndone / now if now > 0 else 0.0
        eta = (a.requests - ndone) / rate if rate > 0 else float("inf")
        hit = " ".join(f"{t} {100 * pt[t] / n:.0f}%" for t in report.TIERS)
        etas = f"{eta:.0f}s" if math.isfinite(eta) else "?"
        return (f"[{ndone:>{len(str(a.requests))}}/{a.requests}] {rate:5.1f} req/s  "
                f"blocks: {hit}  elapsed {now:.0f}s ETA {etas}")

    def check_children(self) -> None:
        p = self.c.crashed()
        if p is not None:
            raise RuntimeError(f"{p.what} exited unexpectedly with {p.popen.returncode}; "
                               f"log {p.log}:\n{cl.tail(p.log)}")

    def stop_drivers(self) -> None:
        for k, p in self.drivers.items():
            p.expected_exit = True
            try:
                self.send(k, {"op": "quit"})
            except (BrokenPipeError, OSError):
                pass
        for k, p in self.drivers.items():
            try:
                p.popen.wait(20)
            except subprocess.TimeoutExpired:
                self.c.kill(p)

    def tier_delivered(self, m: dict[str, float], row: dict) -> tuple[dict[str, int], str]:
        """Blocks per tier that arrived: the server's
        pegaflow_cache_tier_blocks_delivered_total{tier} where it has it, else an estimate
        (RAM as decided, SSD prefetch successes, peer bytes / block size, miss 0). The
        server's counter has the prefetch tiers only (ssd, rdma: docs/metrics.md): RAM hits
        are handed over in the query's own answer (its lease), so RAM delivered is RAM
        decided, and a miss delivers nothing."""
        if any(key.startswith("pegaflow_cache_tier_blocks_delivered_total") for key in m):
            out = {t: int(promtext.get(m, "pegaflow_cache_tier_blocks_delivered_total",
                                       tier=TIER_LABEL[t])) for t in ("ssd", "remote")}
            return ({"ram": row["ram"], **out, "miss": 0}, "server")
        return ({"ram": row["ram"], "ssd": row["ssd_delivered"],
                 "remote": row["remote_delivered"], "miss": 0}, "estimate")

    @staticmethod
    def shortfall_reasons(m: dict[str, float]) -> dict[str, int]:
        """pegaflow_prefetch_shortfall_blocks_total summed per reason ("rdma/down": 4)."""
        inv = {v: k for k, v in TIER_LABEL.items()}
        out: dict[str, int] = {}
        for key, v in m.items():
            if key.startswith("pegaflow_prefetch_shortfall_blocks_total{") and v:
                labels = dict(x.split("=", 1) for x in key[key.index("{") + 1:-1].split(",")
                              if "=" in x)
                k = f"{inv.get(labels.get('tier', ''), labels.get('tier', '?'))}/" \
                    f"{labels.get('reason', '?')}"
                out[k] = out.get(k, 0) + int(v)
        return out

    @staticmethod
    def tier_shortfall(m: dict[str, float]) -> dict[str, int]:
        out = {t: 0 for t in report.TIERS}
        inv = {v: k for k, v in TIER_LABEL.items()}
        for key, v in m.items():
            if key.startswith("pegaflow_prefetch_shortfall_blocks_total{"):
                labels = dict(x.split("=", 1) for x in key[key.index("{") + 1:-1].split(",")
                              if "=" in x)
                t = inv.get(labels.get("tier", ""))
                if t:
                    out[t] += int(v)
        return out

    def restart_ssd(self) -> dict[str, dict[str, int]]:
        """Per node whose server was restarted: what its current life recovered from its SSD
        file (pegaflow_ssd_recovered_blocks, docs/ssd.md "Recovery") and how many blocks its
        SSD delivered into requests since that start (the life's own
        pegaflow_cache_tier_blocks_delivered_total{tier="ssd"}): a restarted node that
        serves from the SSD it had before shows both above 0."""
        out = {}
        for k in sorted(self.restarted):
            m = self.last.get(k, {})
            out[f"n{k}"] = {
                "recovered_blocks": int(promtext.get(m, "pegaflow_ssd_recovered_blocks")),
                "ssd_delivered": int(promtext.get(m, "pegaflow_cache_tier_blocks_delivered_total",
                                                  tier="ssd")),
            }
        return out

    def build_report(self, seed: int, elapsed: float, mode: str) -> dict:
        rows = []
        bs = self.model.block_size
        eff = efficiency.summarize(self.done, self.holds, self.lives)
        for k in range(1, self.a.nodes + 1):
            m = self.totals(k)
            tiers = self.tier_blocks(m)
            dl = self.done.get(k, [])
            down = sum(d["requested"] for d in dl if d["unreachable"])
            requested = sum(d["requested"] for d in dl)
            tiers["miss"] += down
            hist = promtext.histogram(m, "pegaflow_rdma_fetch_duration_seconds")
            row = {
                "node": f"n{k}", "requested": requested, **tiers, "miss_node_down": down,
                "bytes": {t: tiers[t] * self.block_bytes for t in report.TIERS},
                "integrity_failures": sum(d["bad_blocks"] for d in dl),
                "bytes_mismatched": sum(d["bad_bytes"] for d in dl),
                "verified_blocks": sum(d["loaded_blocks"] for d in dl),
                "checksum_rejections": int(sum(v for key, v in m.items() if key.startswith(
                    "pegaflow_integrity_failures_total"))),
                "load_failures": sum(1 for d in dl if d["load_failed"]),
                "p2p_fetches": int(sum(v for key, v in m.items()
                                       if key.startswith("pegaflow_rdma_fetch_total"))),
                "p2p_fetch_p50_s": promtext.quantile(hist, 0.5),
                "p2p_fetch_p99_s": promtext.quantile(hist, 0.99),
                "prefill_tokens_saved": sum(d["loaded_blocks"] for d in dl) * bs,
                # outcomes (the tiers above are the query path's decisions)
                "ssd_delivered": int(promtext.get(m, "pegaflow_ssd_prefetch_success_total")),
                "remote_delivered": int(promtext.get(m, "pegaflow_rdma_fetch_bytes_total")
                                        // self.block_bytes),
                "ssd_written_blocks": int(promtext.get(m, "pegaflow_ssd_write_bytes_total")
                                          // self.block_bytes),
                "requests": len(dl),
                "faults_injected": int(sum(v for key, v in m.items() if key.startswith(
                    "pegaflow_faults_injected_total"))),
            }
            row["accounting_ok"] = sum(tiers[t] for t in report.TIERS) == requested
            row["tier_decided"] = {t: tiers[t] for t in report.TIERS}
            row["tier_delivered"], row["delivered_source"] = self.tier_delivered(m, row)
            row["tier_shortfall"] = self.tier_shortfall(m)
            row["shortfall_reasons"] = self.shortfall_reasons(m)
            e = eff["nodes"].get(k, {"available": 0, "delivered": 0, "efficiency": None,
                                     "loading_then_nothing": 0, "unreachable_requests": 0})
            row["unreachable_requests"] = e["unreachable_requests"]
            row["available"] = e["available"]
            row["delivered"] = e["delivered"]
            row["efficiency"] = e["efficiency"]
            row["loading_then_nothing"] = e["loading_then_nothing"]
            rows.append(row)
        total = {"node": "total"}
        for key in ("requested", "ram", "ssd", "remote", "miss", "miss_node_down",
                    "integrity_failures", "bytes_mismatched", "verified_blocks",
                    "checksum_rejections", "load_failures", "p2p_fetches",
                    "prefill_tokens_saved", "requests", "faults_injected", "ssd_delivered",
                    "remote_delivered", "ssd_written_blocks"):
            total[key] = sum(r[key] for r in rows)
        total["bytes"] = {t: sum(r["bytes"][t] for r in rows) for t in report.TIERS}
        for key in ("tier_decided", "tier_delivered", "tier_shortfall"):
            total[key] = {t: sum(r[key][t] for r in rows) for t in report.TIERS}
        total["shortfall_reasons"] = {}
        for r in rows:
            for k, v in r["shortfall_reasons"].items():
                total["shortfall_reasons"][k] = total["shortfall_reasons"].get(k, 0) + v
        total["delivered_source"] = ("server" if all(r["delivered_source"] == "server"
                                                     for r in rows) else "estimate")
        total["available"] = eff["available"]
        total["delivered"] = eff["delivered"]
        total["efficiency"] = eff["efficiency"]
        total["loading_then_nothing"] = eff["loading_then_nothing"]
        total["unreachable_requests"] = eff["unreachable_requests"]
        total["load_wait_ms"] = eff["load_wait_ms"]
        total["restart_to_hit_s"] = eff["restart_to_hit_s"]
        total["restart_ssd"] = self.restart_ssd()
        allm: dict[str, float] = {}
        for k in range(1, self.a.nodes + 1):
            for key, v in self.totals(k).items():
                allm[key] = allm.get(key, 0.0) + v
        hist = promtext.histogram(allm, "pegaflow_rdma_fetch_duration_seconds")
        total["p2p_fetch_p50_s"] = promtext.quantile(hist, 0.5)
        total["p2p_fetch_p99_s"] = promtext.quantile(hist, 0.99)
        total["accounting_ok"] = all(r["accounting_ok"] for r in rows)
        return {"seed": seed, "mode": mode, "nodes_count": self.a.nodes,
                "model": self.model.name, "block_bytes": self.block_bytes,
                "route": self.a.route, "ssd": self.a.ssd, "rate": self.a.rate,
                "elapsed_s": elapsed, "events": self.fault_log,
                "fault_specs": {f"n{k}": v for k, v in self.faults.items()},
                "tmpdir": self.c.tmpdir, "ssd_dir": self.c.ssd_dir,
                "state_file": self.c.state_file,
                "pids": {"metaserver": self.ms.popen.pid if self.ms else None,
                         "servers": [p.popen.pid for p in self.c.procs
                                     if p.what.startswith("server")],
                         "nodes": [p.popen.pid for p in self.drivers.values()]},
                "shm_owners": self.c.shm_pids,
                "namespaces": list(self.c.namespaces),
                "nodes": rows, "total": total, "accounting_ok": total["accounting_ok"],
                "load_wait_ms": eff["load_wait_ms"], "restart_to_hit_s": eff["restart_to_hit_s"],
                "restart_ssd": total["restart_ssd"], "timeline": self.timeline}


def _term(signum, frame):
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.cleanup:
        cl.clean_stale(print)
        return 0
    if a.nodes < 1 or a.nodes > 200:
        ap.error("--nodes must be 1..200")
    if a.requests < 1:
        ap.error("--requests must be at least 1")
    if a.rate < 0:
        ap.error("--rate must be >= 0")
    if a.pool_size:
        try:
            a.pool_size = parse_size(a.pool_size)
        except Usage as e:
            ap.error(str(e))
    # Ctrl-C tears down even when started in the background of a script (which starts
    # it with SIGINT ignored)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _term)
    signal.signal(signal.SIGHUP, _term)
    sim = Sim(a)
    rc = 1
    try:
        rc = sim.run()
    except Usage as e:
        print(f"pegaflow-sim: {e}", file=sys.stderr)
        rc = 2
    except KeyboardInterrupt:
        sim.say("pegaflow-sim: interrupted, tearing down")
        rc = 130
    except SystemExit as e:
        sim.say(f"pegaflow-sim: signal {int(e.code) - 128}, tearing down")
        rc = int(e.code)
    except RuntimeError as e:
        sim.say(f"pegaflow-sim: {e}")
        sim.say("pegaflow-sim: tearing down")
        rc = 1
    finally:
        # a second Ctrl-C must not stop the teardown half-way
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        if sim.c is not None:
            for msg in sim.c.teardown():
                print(f"pegaflow-sim: {msg}", file=sys.stderr)
                rc = rc or 1
        signal.signal(signal.SIGINT, old)
    return rc


if __name__ == "__main__":
    sys.exit(main())
