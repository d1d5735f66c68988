"""PegaFlow series on vLLM's own ``/metrics`` (``KVConnectorBase_V1.build_prom_metrics``).

vLLM's frontend calls ``build_prom_metrics`` once with its metric classes (it may wrap
prometheus_client's Gauge/Counter/Histogram, e.g. for Ray) and then ``observe(data,
engine_idx)`` with every aggregated ``PegaKVConnectorStats.data`` (pegaflow.connector.stats).
Names follow the reference connector (``vllm:pega_*``) where it has one:

  vllm:pega_load_success_total, vllm:pega_load_failure_total       Load RPCs
  vllm:pega_save_success_total, vllm:pega_save_failure_total       Save RPCs
  vllm:pega_load_duration_seconds, vllm:pega_save_duration_seconds per RPC (histograms)
  vllm:pega_load_blocks, vllm:pega_save_blocks                     blocks per RPC
and, new here:
  vllm:pega_hit_tokens_total{tier="ram"|"prefetched"|"miss"}       scheduler, per admission
  vllm:pega_load_bytes_total, vllm:pega_save_bytes_total           bytes moved (all layers)
  vllm:pega_load_timeout_total, vllm:pega_query_error_total

Imported only inside vLLM's frontend (needs vLLM and prometheus_client).
"""

from __future__ import annotations

from typing import Any

from pegaflow.connector.stats import TIERS

DURATION_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0, 30.0, 60.0]
BLOCK_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]

# (data key, metric name, documentation)
COUNTERS = (
    ("load_success", "vllm:pega_load_success", "PegaFlow Load RPCs that completed"),
    ("load_failures", "vllm:pega_load_failure",
     "PegaFlow loads that failed or timed out (vLLM recomputes or fails the request per "
     "kv_load_failure_policy)"),
    ("load_timeouts", "vllm:pega_load_timeout",
     "PegaFlow loads not complete after PEGA_LOAD_TIMEOUT_SECONDS (also in load_failure)"),
    ("save_success", "vllm:pega_save_success", "PegaFlow Save RPCs that succeeded"),
    ("save_failures", "vllm:pega_save_failure", "PegaFlow Save RPCs that failed"),
    ("load_bytes", "vllm:pega_load_bytes", "Bytes loaded from PegaFlow into vLLM's KV cache"),
    ("save_bytes", "vllm:pega_save_bytes", "Bytes saved from vLLM's KV cache to PegaFlow"),
    ("query_errors", "vllm:pega_query_error",
     "PegaFlow QueryPrefetch calls that failed (treated as misses)"),
)
HISTOGRAMS = (
    ("load_duration_s", "vllm:pega_load_duration_seconds",
     "PegaFlow Load RPC: submission to completion seen", DURATION_BUCKETS),
    ("save_duration_s", "vllm:pega_save_duration_seconds",
     "PegaFlow Save RPC including the wait for its CUDA event", DURATION_BUCKETS),
    ("load_op_blocks", "vllm:pega_load_blocks", "Blocks per PegaFlow Load RPC", BLOCK_BUCKETS),
    ("save_op_blocks", "vllm:pega_save_blocks", "Blocks per PegaFlow Save RPC", BLOCK_BUCKETS),
)


def make_prom_metrics(vllm_config: Any, metric_types: dict, labelnames: list[str],
                      per_engine_labelvalues: dict[int, list[object]]):
    from prometheus_client import Counter, Histogram
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics

    class PegaPromMetrics(KVConnectorPromMetrics):
        def __init__(self):
            super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
            counter_cls = metric_types[Counter]
            hist_cls = metric_types[Histogram]
            self.counters = {}
            for key, name, doc in COUNTERS:
                self.counters[key] = self.make_per_engine(
                    counter_cls(name=name, documentation=doc, labelnames=labelnames))
            hits = counter_cls(name="vllm:pega_hit_tokens",
                               documentation="Prompt tokens PegaFlow was asked for, by "
                               "where they came from: ram (server memory), prefetched "
                               "(SSD or a peer over P2P, after Loading answers), miss",
                               labelnames=list(labelnames) + ["tier"])
            self.hits = {tier: {idx: hits.labels(*values, tier)
                                for idx, values in per_engine_labelvalues.items()}
                         for tier in TIERS}
            self.histograms = {}
            for key, name, doc, buckets in HISTOGRAMS:
                self.histograms[key] = self.make_per_engine(
                    hist_cls(name=name, documentation=doc, buckets=buckets,
                             labelnames=labelnames))

        def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
            d = transfer_stats_data or {}
            for key, per_engine in self.counters.items():
                v = d.get(key, 0)
                if v:
                    per_engine[engine_idx].inc(v)
            for tier in TIERS:
                v = d.get(f"hit_tokens_{tier}" if tier != "miss" else "miss_tokens", 0)
                if v:
                    self.hits[tier][engine_idx].inc(v)
            for key, per_engine in self.histograms.items():
                for v in d.get(key) or ():
                    per_engine[engine_idx].observe(v)

    return PegaPromMetrics()
