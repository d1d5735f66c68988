"""The few Prometheus text-format families pegaflow-sim reads from a node's /metrics."""

from __future__ import annotations

import re
import urllib.request

WANTED = (
    "pegaflow_cache_tier_block_requests_total",
    "pegaflow_integrity_failures_total",
    "pegaflow_rdma_fetch_total",
    "pegaflow_rdma_fetch_duration_seconds_bucket",
    "pegaflow_rdma_fetch_duration_seconds_count",
    "pegaflow_rdma_fetch_bytes_total",
    "pegaflow_load_bytes_total",
    "pegaflow_save_bytes_total",
    "pegaflow_faults_injected_total",
    "pegaflow_ssd_prefetch_success_total",
    "pegaflow_ssd_write_bytes_total",
    # issue 24's attribution counters, where the server has them
    "pegaflow_cache_tier_blocks_delivered_total",
    "pegaflow_prefetch_shortfall_blocks_total",
    "pegaflow_load_cancelled_total",
    # issue 25: what a restarted node's SSD scan put back (a gauge of the current life)
    "pegaflow_ssd_recovered_blocks",
)
_LINE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[str, float]:
    """{'name{k=v,...}': value} for the WANTED families (labels sorted, unquoted)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m or m.group(1) not in WANTED:
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(_LABEL.findall(m.group(2) or "")))
        try:
            out[f"{m.group(1)}{{{labels}}}"] = float(m.group(3))
        except ValueError:
            continue
    return out


def scrape(url: str, timeout_s: float = 2.0) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return parse(r.read().decode(errors="replace"))


def get(m: dict[str, float], name: str, **labels: str) -> float:
    key = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return m.get(f"{name}{{{key}}}", 0.0)


def histogram(m: dict[str, float], name: str) -> list[tuple[float, float]]:
    """[(upper bound, cumulative count)] of histogram ``name`` sorted by bound."""
    pre = f"{name}_bucket{{le="
    out = []
    for k, v in m.items():
        if k.startswith(pre):
            le = k[len(pre):-1]
            out.append((float("inf") if le == "+Inf" else float(le), v))
    return sorted(out)


def quantile(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Linear interpolation inside the bucket (as PromQL's histogram_quantile)."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_b, prev_c = 0.0, 0.0
    for b, c in buckets:
        if c >= rank:
            if b == float("inf"):
                return prev_b
            if c == prev_c:
                return b
            return prev_b + (b - prev_b) * (rank - prev_c) / (c - prev_c)
        prev_b, prev_c = b, c
    return prev_b
