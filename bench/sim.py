#!/usr/bin/env python3
"""pegaflow-sim as a benchmark (issue 24): the `make demo` scenario (3 nodes, llama-8b-like
blocks, SSD on, node 2 killed at 40% and restarted at 70% of the requests), or a shorter one
with --quick, and its efficiency (delivered / available), load waits and the restarted
node's time to its first hit (docs/simulation.md "Efficiency").

    bench/sim.py [--requests N] --json OUT.json

Writes {"efficiency", "available", "delivered", "load_wait_ms", "restart_to_hit_s", ...}."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    binp = os.environ.get("PF_BIN", os.path.join(TOP, "build", "rel", "bin"))
    lib = os.environ.get("PEGAFLOW_LIB", os.path.join(TOP, "build", "rel", "lib",
                                                      "libpegaflow.so"))
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "sim.json")
        env = dict(os.environ, PYTHONPATH=os.path.join(TOP, "python"))
        cmd = [sys.executable, "-m", "pegaflow.sim", "--bin", binp, "--lib", lib,
               "--nodes", "3", "--requests", str(a.requests), "--rate", "10",
               "--model", "llama-8b-like", "--ssd", "on", "--pool-size", "64mb",
               "--kill-node", "2@40%", "--restart-node", "2@70%", "--seed", "24",
               "--json", out]
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            print(f"pegaflow-sim exited with {rc}", file=sys.stderr)
            return 1
        with open(out) as f:
            doc = json.load(f)
    t = doc["total"]
    res = {"requests": a.requests, "available": t["available"], "delivered": t["delivered"],
           "efficiency": t["efficiency"], "loading_then_nothing": t["loading_then_nothing"],
           "load_wait_ms": doc["load_wait_ms"], "restart_to_hit_s": doc["restart_to_hit_s"],
           "mode": doc["mode"]}
    with open(a.json, "w") as f:
        json.dump(res, f, indent=2)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
