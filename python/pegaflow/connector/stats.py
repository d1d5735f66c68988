"""Connector statistics in vLLM's KVConnectorStats shape (plain data, no vLLM import).

Both sides record into a StatsRecorder; vLLM collects them every step:

* workers: ``get_kv_connector_stats()`` goes into KVConnectorOutput; vLLM's
  KVOutputAggregator sums the workers' objects with ``aggregate``;
* scheduler: vLLM adds the scheduler connector's ``get_kv_connector_stats()`` to the
  workers' (main always; releases up to ~0.19 only in steps where the workers reported
  stats - nothing is lost, the scheduler's counts wait in its recorder);
* the frontend rebuilds the object with ``build_kv_connector_stats(data)``, logs
  ``reduce()`` and feeds ``data`` to the connector's Prometheus metrics.

``data`` holds counters (ints) and, for latencies and sizes, lists of observations (one
per Load / Save RPC, at most MAX_OBSERVATIONS per interval; more are counted in
``dropped_observations``). Everything is msgpack/pickle friendly.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping

# Tiers of a hit as the scheduler sees them: answered Ready at once (the server's RAM),
# or after one or more Loading answers (fetched from SSD or a peer over P2P first).
TIER_RAM = "ram"
TIER_PREFETCHED = "prefetched"
TIER_MISS = "miss"
TIERS = (TIER_RAM, TIER_PREFETCHED, TIER_MISS)

COUNTERS = (
    # scheduler
    "hit_tokens_ram", "hit_tokens_prefetched", "miss_tokens", "query_errors",
    # workers (one Load / Save RPC = one operation)
    "load_success", "load_failures", "load_timeouts", "load_blocks", "load_bytes",
    "save_success", "save_failures", "save_blocks", "save_bytes",
    "dropped_observations",
)
SERIES = ("load_duration_s", "save_duration_s", "load_op_blocks", "save_op_blocks")
MAX_OBSERVATIONS = 10000


def empty() -> dict[str, Any]:
    return {}


def is_empty(data: Mapping[str, Any] | None) -> bool:
    if not data:
        return True
    return not any(data.get(k) for k in COUNTERS + SERIES)


def aggregate(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> dict[str, Any]:
    """Sum of two data dicts (counters add, observation lists concatenate, capped)."""
    out: dict[str, Any] = dict(a or {})
    for k, v in (b or {}).items():
        if k in SERIES:
            merged = list(out.get(k, ())) + list(v)
            if len(merged) > MAX_OBSERVATIONS:
                out["dropped_observations"] = (out.get("dropped_observations", 0)
                                               + len(merged) - MAX_OBSERVATIONS)
                merged = merged[-MAX_OBSERVATIONS:]
            out[k] = merged
        elif isinstance(v, (int, float)):
            out[k] = out.get(k, 0) + v
        else:
            out.setdefault(k, v)
    return out


def reduce(data: Mapping[str, Any] | None) -> dict[str, int | float]:
    """One line's worth for vLLM's periodic "KV Transfer metrics" log."""
    d = data or {}
    hit = d.get("hit_tokens_ram", 0) + d.get("hit_tokens_prefetched", 0)
    asked = hit + d.get("miss_tokens", 0)
    out: dict[str, int | float] = {
        "pega_hit_tokens": hit,
        "pega_hit_tokens_prefetched": d.get("hit_tokens_prefetched", 0),
        "pega_hit_rate": round(hit / asked, 4) if asked else 0.0,
        "pega_loads": d.get("load_success", 0),
        "pega_load_failures": d.get("load_failures", 0),
        "pega_load_MB": round(d.get("load_bytes", 0) / 2**20, 3),
        "pega_saves": d.get("save_success", 0),
        "pega_save_failures": d.get("save_failures", 0),
        "pega_save_MB": round(d.get("save_bytes", 0) / 2**20, 3),
    }
    for name, key in (("pega_load_avg_ms", "load_duration_s"),
                      ("pega_save_avg_ms", "save_duration_s")):
        obs = d.get(key) or ()
        out[name] = round(1000 * sum(obs) / len(obs), 3) if obs else 0.0
    return out


class StatsRecorder:
    """Thread-safe accumulator (the save thread records while vLLM's thread takes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {}

    def add(self, key: str, n: int | float = 1) -> None:
        if not n:
            return
        with self._lock:
            self._data[key] = self._data.get(key, 0) + n

    def observe(self, key: str, value: float) -> None:
        with self._lock:
            self._observe(key, value)

    def _observe(self, key: str, value: float) -> None:
        obs = self._data.setdefault(key, [])
        if len(obs) >= MAX_OBSERVATIONS:
            self._data["dropped_observations"] = self._data.get("dropped_observations", 0) + 1
            return
        obs.append(value)

    def record(self, counts: Mapping[str, int | float],
               observations: Mapping[str, float] = ()) -> None:
        """Several ``add`` and ``observe`` at once, under one lock (one RPC's figures)."""
        with self._lock:
            d = self._data
            for key, n in counts.items():
                if n:
                    d[key] = d.get(key, 0) + n
            for key, value in dict(observations).items():
                self._observe(key, value)

    def take(self) -> dict[str, Any] | None:
        """The data recorded since the last take (None when nothing happened)."""
        with self._lock:
            data, self._data = self._data, {}
        return None if is_empty(data) else data

    def peek(self) -> dict[str, Any]:
        with self._lock:
            return {k: (list(v) if isinstance(v, list) else v) for k, v in self._data.items()}
