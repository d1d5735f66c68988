"""Stub of kv_connector/v1/metrics.py (vLLM main @578b601 and later): KVConnectorStats,
the frontend's KVConnectorLogging (build_kv_connector_stats -> aggregate -> reduce) and
KVConnectorPrometheus (build_prom_metrics once, observe(data, engine_idx) per update).

The real module imports prometheus_client unconditionally; here it is optional (Debian
python3-prometheus-client) so the rest of the stub works without it."""

import logging
from dataclasses import dataclass, field
from typing import Any, TypeVar

try:
    from prometheus_client import Counter, Gauge, Histogram
    HAVE_PROMETHEUS = True
except ImportError:  # the connector's Prometheus tests skip, naming the package
    HAVE_PROMETHEUS = False

    class _Absent:
        def __init__(self, *a, **k):
            raise RuntimeError("prometheus_client is not installed")

    Counter = Gauge = Histogram = _Absent

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

PromMetric = Any  # Gauge | Counter | Histogram
PromMetricT = TypeVar("PromMetricT")

logger = logging.getLogger(__name__)


@dataclass
class KVConnectorStats:
    data: dict[str, Any] = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other: "KVConnectorStats") -> "KVConnectorStats":
        raise NotImplementedError

    def reduce(self) -> dict[str, int | float]:
        raise NotImplementedError

    def is_empty(self) -> bool:
        raise NotImplementedError


class KVConnectorLogging:
    def __init__(self, kv_transfer_config):
        if kv_transfer_config and kv_transfer_config.kv_connector:
            self.connector_cls = KVConnectorFactory.get_connector_class(kv_transfer_config)
        self.reset()

    def reset(self):
        self.transfer_stats_accumulator: KVConnectorStats | None = None

    def observe(self, transfer_stats_data: dict[str, Any]):
        assert self.connector_cls is not None
        transfer_stats = self.connector_cls.build_kv_connector_stats(transfer_stats_data)
        if transfer_stats is None:
            logger.warning("The connector %s is collecting stats but does not implement "
                           "build_kv_connector_stats. Stats will not be logged.",
                           self.connector_cls)
            return
        if self.transfer_stats_accumulator is None:
            self.transfer_stats_accumulator = transfer_stats
        else:
            self.transfer_stats_accumulator = self.transfer_stats_accumulator.aggregate(
                transfer_stats)

    def log(self, log_fn=logger.info):
        acc = self.transfer_stats_accumulator
        if acc and not acc.is_empty():
            xfer = acc.reduce()
            log_fn("KV Transfer metrics: %s", ", ".join(f"{k}={v}" for k, v in xfer.items()))
            self.reset()


class KVConnectorPromMetrics:
    def __init__(self, vllm_config, metric_types: dict, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]):
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._gauge_cls = metric_types[Gauge]
        self._counter_cls = metric_types[Counter]
        self._histogram_cls = metric_types[Histogram]
        self._labelnames = labelnames
        self.per_engine_labelvalues = per_engine_labelvalues

    def make_per_engine(self, metric: PromMetric) -> dict[int, PromMetric]:
        return {idx: metric.labels(*labelvalues)
                for idx, labelvalues in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        raise NotImplementedError


class KVConnectorPrometheus:
    _gauge_cls = Gauge
    _counter_cls = Counter
    _histogram_cls = Histogram

    def __init__(self, vllm_config, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]):
        self.prom_metrics: KVConnectorPromMetrics | None = None
        kv_transfer_config = vllm_config.kv_transfer_config
        if kv_transfer_config and kv_transfer_config.kv_connector:
            connector_cls = KVConnectorFactory.get_connector_class(kv_transfer_config)
            metric_types = {Gauge: self._gauge_cls, Counter: self._counter_cls,
                            Histogram: self._histogram_cls}
            self.prom_metrics = connector_cls.build_prom_metrics(
                vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        if self.prom_metrics is None:
            return
        self.prom_metrics.observe(transfer_stats_data, engine_idx)
