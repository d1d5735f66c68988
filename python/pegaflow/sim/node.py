"""One node's vLLM stand-in process (``python3 -m pegaflow.sim.node``), started by
pegaflow-sim in the node's network namespace next to its pegaflow-server.

Protocol: JSON lines. stdin (from pegaflow-sim):
  {"op": "req", "id": ..., "prompt": [...], "max_tokens": N}
  {"op": "pause"}   stop stepping, scrape /metrics, answer {"ev": "paused", "m": {...}}
  {"op": "resume"}
  {"op": "quit"}    finish, shut the connector down, exit 0
stdout (to pegaflow-sim; everything else the process prints goes to stderr):
  {"ev": "ready"}
  {"ev": "done", "id": ..., ...per-request figures..., "output": [...]}
  {"ev": "metrics", "t": ..., "m": {...}}   every --scrape-interval while not paused
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time


def _stdin_reader(q: "queue.Queue[dict | None]") -> None:
    for line in sys.stdin:
        line = line.strip()
        if line:
            q.put(json.loads(line))
    q.put(None)  # EOF: pegaflow-sim went away


def _short(h: bytes) -> str:
    """A block hash as the controller keys it (the first 12 bytes, hex)."""
    return bytes(h)[:12].hex()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pegaflow-sim-node")
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--metrics-url", required=True)
    ap.add_argument("--instance", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--gpu-blocks", type=int, default=512)
    ap.add_argument("--scrape-interval", type=float, default=0.5)
    a = ap.parse_args(argv)

    # protocol on a private copy of stdout; fd 1 becomes stderr (the node's log)
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj, separators=(",", ":")) + "\n")

    import faulthandler
    import logging
    import signal

    faulthandler.register(signal.SIGUSR1)  # kill -USR1 PID: every thread's stack to the log

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from pegaflow.sim import promtext
    from pegaflow.sim.engine import MODELS, Engine

    eng = Engine(MODELS[a.model], host=a.host, port=a.port, instance_id=a.instance,
                 seed=a.seed, num_blocks=a.gpu_blocks)
    q: "queue.Queue[dict | None]" = queue.Queue()
    threading.Thread(target=_stdin_reader, args=(q,), daemon=True).start()
    send({"ev": "ready", "block_bytes": eng.m.block_bytes, "cross_layer": eng.cross})

    def scrape_msg(ev: str) -> dict:
        try:
            return {"ev": ev, "t": time.time(), "m": promtext.scrape(a.metrics_url)}
        except Exception as e:  # the server is down (a fault event) or not up yet
            return {"ev": ev, "t": time.time(), "m": None, "error": str(e)}

    paused = False
    quitting = False
    next_scrape = 0.0
    while True:
        block = not eng.busy() or paused
        try:
            msg = q.get(timeout=0.05) if block else q.get_nowait()
        except queue.Empty:
            msg = {}
        if msg is None:
            quitting = True
            msg = {}
        op = msg.get("op")
        if op == "req":
            eng.add(msg["id"], msg["prompt"], int(msg["max_tokens"]))
        elif op == "pause":
            paused = True
            send(scrape_msg("paused"))
        elif op == "resume":
            paused = False
        elif op == "quit":
            quitting = True
        if quitting and (not eng.busy() or paused):
            break
        now = time.monotonic()
        if not paused and now >= next_scrape:
            next_scrape = now + a.scrape_interval
            send(scrape_msg("metrics"))
        for t_saved, hs in eng.take_saved():  # (the save thread's, timed when accepted)
            send({"ev": "saved", "t": t_saved, "h": [_short(h) for h in hs]})
        if paused or not eng.busy():
            continue
        if eng.step() == 0:
            time.sleep(0.002)  # only asynchronous transfers pending
        for st in eng.take_completed():
            send({"ev": "done", "id": st.rid, "requested": st.requested_blocks,
                  "unreachable": st.unreachable, "prefetched": st.prefetched,
                  "ext_tokens": st.ext_tokens, "loaded_blocks": st.loaded_blocks,
                  "load_failed": st.load_failed, "bad_blocks": st.bad_blocks,
                  "bad_bytes": st.bad_bytes, "prompt_len": st.req.num_prompt_tokens,
                  "latency_s": time.monotonic() - st.arrived,
                  "load_wait_s": (st.load_done - st.first_query) if st.load_done else 0.0,
                  "ready_wait_s": (st.ready_at - st.first_query) if st.ready_at else None,
                  "t_query": st.first_query_wall, "t_ready": st.ready_wall or None,
                  "t_loaded": st.load_done_wall or None,
                  "asked": [_short(h) for h in eng.asked.pop(st.rid, [])],
                  "output": list(st.req.output_token_ids)})
    for t_saved, hs in eng.take_saved():
        send({"ev": "saved", "t": t_saved, "h": [_short(h) for h in hs]})
    send(scrape_msg("metrics"))
    eng.shutdown()
    send({"ev": "bye"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
