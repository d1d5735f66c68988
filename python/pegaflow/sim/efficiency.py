"""What the cluster could have delivered against what it did (docs/simulation.md
"Efficiency").

The controller knows which node saved which block when (the nodes report every Save the
server accepted, and every block they loaded), and when each server life began (its
``ready``) and ended (the kill). A block is *available* to a request when, at the
request's first query, some node that is up holds it: it saved or loaded the block during
its current life. "At the request's query" is the query the server answered Ready (a
request answered Loading asks again; a block saved by another request meanwhile can still
be served to it). A restart loses what the previous life held (RAM; the SSD index is not
counted across a restart). Evictions are not modelled: a pool too small for the workload
shows as lost efficiency. A request can use only a contiguous prefix, so its available
count is the longest prefix of its asked blocks that are all available, and its delivered
count the blocks it loaded. efficiency = delivered / available over all requests. A request whose own server was
down (its query failed: "unreachable") has nothing available: no node could serve it;
those are counted apart (unreachable_requests).

Pure functions over plain data, so they are unit-tested without a cluster.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class Lives:
    """Per node, the [start, end) wall-clock intervals its server was up (end None: still
    up)."""

    spans: dict[int, list[list[float | None]]] = field(default_factory=dict)

    def start(self, k: int, t: float) -> None:
        self.spans.setdefault(k, []).append([t, None])

    def end(self, k: int, t: float) -> None:
        s = self.spans.get(k)
        if s and s[-1][1] is None:
            s[-1][1] = t

    def life_at(self, k: int, t: float) -> int | None:
        for i, (a, b) in enumerate(self.spans.get(k, ())):
            if a <= t and (b is None or t < b):
                return i
        return None

    def restarts(self, k: int) -> list[float]:
        """The ready times of every life after the first."""
        return [a for a, _ in self.spans.get(k, ())[1:]]


class Holdings:
    """Which node held which block from when: hold(k, t, hashes)."""

    def __init__(self, lives: Lives):
        self.lives = lives
        self._by: dict[str, dict[int, list[float]]] = {}  # hash -> node -> sorted times

    def hold(self, k: int, t: float, hashes) -> None:
        for h in hashes:
            ts = self._by.setdefault(h, {}).setdefault(k, [])
            bisect.insort(ts, t)

    def held(self, h: str, t: float) -> bool:
        """Some node up at t holds h since a time in the same life."""
        for k, ts in self._by.get(h, {}).items():
            life = self.lives.life_at(k, t)
            if life is None:
                continue
            start = self.lives.spans[k][life][0]
            i = bisect.bisect_right(ts, t)
            if i and ts[i - 1] >= start:
                return True
        return False

    def available(self, asked: list[str], t: float) -> int:
        n = 0
        for h in asked:
            if not self.held(h, t):
                break
            n += 1
        return n


def _pct(vals: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..1)."""
    if not vals:
        return None
    v = sorted(vals)
    i = max(0, min(len(v) - 1, int(-(-q * len(v) // 1)) - 1))
    return v[i]


def summarize(done: dict[int, list[dict]], holds: Holdings, lives: Lives) -> dict:
    """done: node -> its requests' "done" events (asked, t_query, t_ready, loaded_blocks,
    ready_wait_s, load_wait_s, prefetched). Returns per-node and total available,
    delivered, efficiency, load waits, Loading-then-nothing, restart-to-first-hit."""
    per: dict[int, dict] = {}
    ready_w, load_w = [], []
    for k, evs in sorted(done.items()):
        av = dl = nothing = down = 0
        for d in evs:
            if d.get("unreachable"):
                # its own server was down (or did not know the instance): nothing in the
                # cluster could reach this request; counted apart, not as available
                d["available"] = 0
                down += 1
                continue
            # asked last when the server answered Ready (a Loading answer is asked again)
            a = holds.available(d.get("asked") or [], d.get("t_ready") or d.get("t_query") or 0.0)
            d["available"] = a
            av += a
            dl += d.get("loaded_blocks", 0)
            if d.get("prefetched") and not d.get("loaded_blocks"):
                nothing += 1
            if d.get("ready_wait_s") is not None:
                ready_w.append(d["ready_wait_s"])
            if d.get("loaded_blocks"):
                load_w.append(d.get("load_wait_s") or 0.0)
        per[k] = {"available": av, "delivered": dl,
                  "efficiency": (dl / av) if av else None, "loading_then_nothing": nothing,
                  "unreachable_requests": down}
    restart_to_hit: dict[str, float | None] = {}
    for k in sorted(lives.spans):
        for r in lives.restarts(k):
            hits = [d["t_ready"] for d in done.get(k, ())
                    if d.get("loaded_blocks") and d.get("t_ready") and d["t_query"] >= r]
            restart_to_hit[f"n{k}"] = (min(hits) - r) if hits else None
    av = sum(p["available"] for p in per.values())
    dl = sum(p["delivered"] for p in per.values())
    ms = lambda v: None if v is None else v * 1000  # noqa: E731
    return {
        "nodes": per,
        "available": av, "delivered": dl, "efficiency": (dl / av) if av else None,
        "loading_then_nothing": sum(p["loading_then_nothing"] for p in per.values()),
        "unreachable_requests": sum(p["unreachable_requests"] for p in per.values()),
        "load_wait_ms": {"ready_p50": ms(_pct(ready_w, 0.5)), "ready_p99": ms(_pct(ready_w, 0.99)),
                         "loaded_p50": ms(_pct(load_w, 0.5)), "loaded_p99": ms(_pct(load_w, 0.99)),
                         "requests": len(ready_w), "loaded_requests": len(load_w)},
        "restart_to_hit_s": restart_to_hit,
    }


def windowed(done: dict[int, list[dict]], t0: float, window_s: float = 4.0) -> list[tuple[float, float]]:
    """Efficiency of the requests first asked in the last window_s, at each request
    (seconds since t0); after summarize() set each event's "available"."""
    evs = sorted((d for v in done.values() for d in v if d.get("t_query")),
                 key=lambda d: d["t_query"])
    out, j, av, dl = [], 0, 0, 0
    for i, d in enumerate(evs):
        av += d.get("available", 0)
        dl += d.get("loaded_blocks", 0)
        while evs[j]["t_query"] < d["t_query"] - window_s:
            av -= evs[j].get("available", 0)
            dl -= evs[j].get("loaded_blocks", 0)
            j += 1
        if av > 0:
            out.append((d["t_query"] - t0, min(1.0, dl / av)))
    return out
