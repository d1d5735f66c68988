"""PegaKVConnector: the vLLM-facing class (the only module of the connector that imports
vLLM). It builds the per-process context and forwards every vLLM hook to
SchedulerConnector (EngineCore process) or WorkerConnector (each GPU worker).

Channels, shared memory and threads are created here, in __init__, i.e. after vLLM
forked or spawned the process; importing the module creates nothing.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

try:  # every vLLM with connectors v1 since ~0.10; absent: the connector is not HMA
    from vllm.distributed.kv_transfer.kv_connector.v1.base import SupportsHMA
except ImportError:  # pragma: no cover - old vLLM
    SupportsHMA = None

from pegaflow.connector import stats as pstats
from pegaflow.connector.config import (
    ConnectorContext,
    build_context,
    describe_cache_groups,
    parse_options,
)
from pegaflow.connector.plan import StepPlan, plan_of
from pegaflow.connector.scheduler import SchedulerConnector
from pegaflow.connector.worker import WorkerConnector

log = logging.getLogger("pegaflow.connector")

try:  # vLLM >= ~0.11; older releases have no connector stats
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
except Exception:  # pragma: no cover - old vLLM (or its optional deps missing)
    KVConnectorStats = None


try:
    from vllm.distributed.kv_events import KVConnectorKVEvents
except Exception:  # pragma: no cover - old vLLM (or its optional deps missing)
    KVConnectorKVEvents = None


class _EventsBase:
    pass


class PegaKVEvents(KVConnectorKVEvents if KVConnectorKVEvents is not None else _EventsBase):
    """Worker -> scheduler container of (worker key, saved hash) records. vLLM's
    KVOutputAggregator adds every worker's records to the first one's; the scheduler
    connector counts distinct workers per hash itself (it knows the world size), so a
    worker that saved nothing in a step (and returned None) cannot skew the count."""

    pegaflow = True

    def __init__(self, records=None):
        self._records = list(records or ())
        self._workers = 1

    def add_events(self, events) -> None:
        self._records.extend(events)

    def aggregate(self):
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._workers += count

    def get_all_events(self):
        return list(self._records)

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self) -> None:
        self._records = []

    def merge(self, other):
        self.add_events(other.get_all_events())
        return self

    def __repr__(self) -> str:
        return f"PegaKVEvents({len(self._records)} saved-block reports)"


def _event_fields(cls) -> frozenset | None:
    """The keyword fields an event class takes (msgspec ``__struct_fields__`` or dataclass
    fields; None: unknown, pass everything), computed once per class: take_events runs
    every scheduler step and must not introspect a class per block."""
    got = _FIELDS.get(cls, _MISSING)
    if got is _MISSING:
        fields = getattr(cls, "__struct_fields__", None)
        if fields is None:
            import dataclasses

            fields = ([f.name for f in dataclasses.fields(cls)]
                      if dataclasses.is_dataclass(cls) else None)
        got = _FIELDS[cls] = frozenset(fields) if fields is not None else None
    return got


_FIELDS: dict = {}
_MISSING = object()
_STORED_KEYS = frozenset(("block_hashes", "parent_block_hash", "token_ids", "block_size",
                          "lora_id", "medium", "lora_name", "ownership"))
_REMOVED_KEYS = frozenset(("block_hashes", "medium", "ownership"))


def _router_events(records) -> list:
    """Plain records (events.py) -> vLLM's BlockStored / BlockRemoved, medium CPU, the
    hashes converted as vLLM converts its own (bytes, or int64 with
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES). Fields this vLLM's events lack are dropped."""
    try:
        from vllm.distributed import kv_events as ke
    except Exception:  # pragma: no cover - old vLLM
        return []
    try:
        from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash as conv
    except ImportError:
        conv = lambda h: h  # noqa: E731
    medium = getattr(ke, "MEDIUM_CPU", "CPU")
    # vLLM decides the hash form once per call of its own (an environment setting read on
    # every call): ask once per batch; bytes returned unchanged -> no per-hash call at all
    probe = b"\x00" * 32
    if conv(probe) is probe:
        conv = None
    stored_cls, removed_cls = ke.BlockStored, ke.BlockRemoved
    sf, rf = _event_fields(stored_cls), _event_fields(removed_cls)

    # a class that takes every field needs no filtering per event
    if sf is not None and sf >= _STORED_KEYS:
        sf = None
    if rf is not None and rf >= _REMOVED_KEYS:
        rf = None

    def keep(kw: dict, fields) -> dict:
        return kw if fields is None else {k: v for k, v in kw.items() if k in fields}

    out = []
    for r in records:
        if r[0] == "stored":
            _, h, parent, tokens, bs, lora_id, lora_name = r
            out.append(stored_cls(**keep(dict(
                block_hashes=[conv(h) if conv else h],
                parent_block_hash=(conv(parent) if conv else parent) if parent is not None
                else None,
                token_ids=list(tokens), block_size=bs, lora_id=lora_id, medium=medium,
                lora_name=lora_name, ownership="pegaflow"), sf)))
        elif r[0] == "removed":
            out.append(removed_cls(**keep(dict(block_hashes=[conv(r[1]) if conv else r[1]],
                                               medium=medium,
                                               ownership="pegaflow"), rf)))
    return out


class _StatsBase:
    data: dict

    def __init__(self, data: dict | None = None):
        self.data = dict(data or {})


class PegaKVConnectorStats(KVConnectorStats if KVConnectorStats is not None else _StatsBase):
    """vLLM's KVConnectorStats for PegaFlow: ``data`` as pegaflow.connector.stats
    describes it (counters and per-RPC observations; picklable, msgpack friendly)."""

    def __init__(self, data: dict | None = None):
        super().__init__(data=dict(data or {}))

    def reset(self):
        self.data = {}

    def aggregate(self, other):
        if other is not None and getattr(other, "data", None):
            self.data = pstats.aggregate(self.data, other.data)
        return self

    def reduce(self) -> dict[str, int | float]:
        return pstats.reduce(self.data)

    def is_empty(self) -> bool:
        return pstats.is_empty(self.data)

    def __repr__(self) -> str:
        return f"PegaKVConnectorStats({pstats.reduce(self.data)})"


class PegaConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> worker payload of one step: a StepPlan (plain data)."""

    def __init__(self, plan: StepPlan | None = None):
        super().__init__()
        self.plan = plan if plan is not None else StepPlan()

    @property
    def preempted_req_ids(self) -> frozenset[str]:
        return self.plan.preempted

    def __repr__(self) -> str:
        p = self.plan
        return (f"PegaConnectorMetadata(loads={len(p.loads)}, saves={len(p.saves)}, "
                f"preempted={len(p.preempted)})")


def _make_client(ctx: ConnectorContext, endpoint: str):
    """EngineClient factory (tests replace it)."""
    from pegaflow.client.engine import EngineClient

    return EngineClient(endpoint, timeout_ms=ctx.rpc_timeout_ms,
                        query_timeout_ms=ctx.query_timeout_ms)


def _worker_ranks(vllm_config: Any) -> tuple[int, int, int]:
    from vllm.distributed.parallel_state import get_pp_group, get_tensor_model_parallel_rank

    tp_rank = get_tensor_model_parallel_rank()
    pp_rank = get_pp_group().rank_in_group
    dcp_rank = 0
    pc = vllm_config.parallel_config
    if (getattr(pc, "decode_context_parallel_size", 1) or 1) > 1:
        from vllm.distributed.parallel_state import get_decode_context_model_parallel_rank

        dcp_rank = get_decode_context_model_parallel_rank()
    return tp_rank, pp_rank, dcp_rank


def _device_adapter_for(tensor: Any, client: Any):
    """Sim tensors get the sim adapter; anything else is a torch CUDA tensor."""
    from pegaflow.device.sim import SimDeviceAdapter, SimTensor

    if isinstance(tensor, SimTensor):
        return SimDeviceAdapter(tensor.sim_device)
    from pegaflow.device.cuda import CudaDeviceAdapter

    return CudaDeviceAdapter(getattr(client, "lib", None), tensor.device.index)


def _base_has_cross_layer_hooks() -> bool:
    """vLLM's base class offers cross-layer registration (some trees, e.g. the connector
    restructuring branch, lack it and only ever call register_kv_caches)."""
    return (hasattr(KVConnectorBase_V1, "prefer_cross_layer_blocks")
            and hasattr(KVConnectorBase_V1, "register_cross_layers_kv_cache"))


def _hash_block_size(vllm_config: Any, kv_cache_config: Any) -> int | None:
    """Tokens per entry of request.block_hashes, asked of vLLM itself
    (``resolve_kv_cache_block_sizes``: one group hashes every block_size * dcp tokens
    on main, PCP not included). None where vLLM predates it: those releases hash every
    block_size * dcp * pcp tokens (the context's fallback)."""
    try:
        from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    except ImportError:
        return None
    if kv_cache_config is None or not getattr(kv_cache_config, "kv_cache_groups", None):
        return None
    try:
        _, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
        return int(hash_block_size)
    except Exception as e:  # a vLLM whose helper needs more than we can give
        log.warning("resolve_kv_cache_block_sizes failed (%s); assuming block_size x dcp "
                    "x pcp tokens per block hash", e)
        return None


def _hash_seed_warning(vllm_config: Any) -> str | None:
    """Why blocks saved by this vLLM could not be hit by another launch, if they could
    not. vLLM main seeds NONE_HASH with a fixed default for sha256/sha256_cbor when
    PYTHONHASHSEED is unset (reproducible); older releases, and xxhash on main, use a
    random seed per launch."""
    if os.environ.get("PYTHONHASHSEED"):
        return None
    algo = str(getattr(getattr(vllm_config, "cache_config", None), "prefix_caching_hash_algo",
                       "sha256") or "sha256")
    try:
        from vllm.v1.core import kv_cache_utils
        fixed_default = hasattr(kv_cache_utils, "DEFAULT_NONE_HASH_SEED")
    except ImportError:
        fixed_default = False
    if fixed_default and algo in ("sha256", "sha256_cbor"):
        return None
    why = (f"the {algo} prefix-caching hash" if fixed_default
           else "this vLLM release")
    return ("PYTHONHASHSEED is not set: with %s vLLM seeds its block hashes randomly per "
            "launch, so nothing saved by this vLLM can be hit by another launch. Set "
            "PYTHONHASHSEED (same value everywhere) to share KV through PegaFlow." % why)


_POLICY_WARNED = False


def _warn_load_failure_policy(kv_transfer_config: Any) -> bool:
    """Warns once per process when vLLM fails requests on load failures (its default
    ``kv_load_failure_policy`` is "fail"): PegaFlow is a best-effort cache, and a server
    restart, an expired lease or a load timeout would then fail the user's request
    instead of recomputing it. Returns True when it warned."""
    global _POLICY_WARNED
    policy = getattr(kv_transfer_config, "kv_load_failure_policy", None)
    if policy != "fail" or _POLICY_WARNED:
        return False
    _POLICY_WARNED = True
    log.warning("kv_load_failure_policy is \"fail\" (vLLM's default): every failed PegaFlow "
                "load (server restart, lease expiry, load timeout) will FAIL the user's "
                "request instead of recomputing it. Add \"kv_load_failure_policy\": "
                "\"recompute\" to --kv-transfer-config.")
    return True


class _LazyDevice:
    """Chooses the device adapter from the first registered tensor."""

    def __init__(self, client: Any):
        self._client = client
        self._dev = None
        self.kind = "unbound"

    def bind(self, tensor: Any) -> None:
        if self._dev is None:
            self._dev = _device_adapter_for(tensor, self._client)
            self.kind = self._dev.kind

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        dev = self.__dict__.get("_dev")
        if dev is None:
            raise RuntimeError("no KV cache registered yet: the device is unknown")
        return getattr(dev, name)


_HMA_BASES = (SupportsHMA,) if SupportsHMA is not None else ()


class PegaKVConnector(KVConnectorBase_V1, *_HMA_BASES):
    """vLLM v1 KV connector for pegaflow-server (module path ``pegaflow.connector``).

    SupportsHMA: hybrid models (full-attention + Mamba-style recurrent-state groups) keep
    vLLM's hybrid KV cache manager; vLLM then calls request_finished_all_groups (for
    every model, one group included) instead of request_finished.
    """

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        options = parse_options(vllm_config.kv_transfer_config)
        groups = describe_cache_groups(kv_cache_config)
        seed_warning = _hash_seed_warning(vllm_config)
        if seed_warning:
            log.warning(seed_warning)
        if role == KVConnectorRole.SCHEDULER:
            _warn_load_failure_policy(vllm_config.kv_transfer_config)
        if role == KVConnectorRole.WORKER:
            tp_rank, pp_rank, dcp_rank = _worker_ranks(vllm_config)
        else:
            tp_rank = pp_rank = dcp_rank = 0
        ctx = build_context(vllm_config, options, num_cache_groups=max(1, len(groups)),
                            tp_rank=tp_rank, pp_rank=pp_rank, dcp_rank=dcp_rank,
                            cross_layer_supported=_base_has_cross_layer_hooks(),
                            hash_block_size=_hash_block_size(vllm_config, kv_cache_config),
                            groups=groups)
        if ctx.hybrid and ctx.virtual_block_size != groups[0].block_size:
            raise ValueError(f"PegaKVConnector: vLLM hashes every {ctx.virtual_block_size} "
                             f"tokens but the hybrid KV cache groups have blocks of "
                             f"{groups[0].block_size}; one block hash must cover one block")
        self._ctx = ctx
        self._prefer_cross_layer = ctx.cross_layer_blocks
        self._scheduler: SchedulerConnector | None = None
        self._worker: WorkerConnector | None = None
        if role == KVConnectorRole.SCHEDULER:
            # one client (and Session) per TP shard server
            self._clients = [_make_client(ctx, e) for e in options.endpoints]
            self._client = self._clients[0]
            self._scheduler = SchedulerConnector(
                ctx, self._clients if len(self._clients) > 1 else self._client)
        else:
            endpoint = options.endpoints[ctx.shard_index]
            self._client = _make_client(ctx, endpoint)
            self._clients = [self._client]
            self._device = _LazyDevice(self._client)
            self._worker = WorkerConnector(
                ctx, self._client, self._device,
                expected_num_blocks=getattr(kv_cache_config, "num_blocks", None))
        log.info("PegaKVConnector %s: server %s, instance %s, namespace %s, mode %s%s%s",
                 role.name, ", ".join(options.endpoints) if role == KVConnectorRole.SCHEDULER
                 else options.endpoints[ctx.shard_index], ctx.instance_id, ctx.namespace,
                 ctx.mode, f", {len(groups)} KV cache groups" if ctx.hybrid else "",
                 ", MLA page-first" if ctx.page_first else "")

    # ---------------------------------------------------------------- properties

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return self._prefer_cross_layer

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # best-effort cache: a dropped save is a future miss

    # ---------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        if self._worker is None:
            return
        if kv_caches:
            self._device.bind(next(iter(kv_caches.values())))
        self._worker.register_kv_caches(kv_caches)

    def register_cross_layers_kv_cache(self, kv_cache: Any, attn_backend: Any = None) -> None:
        if self._worker is None:
            return
        self._device.bind(kv_cache)
        self._worker.register_cross_layers_kv_cache(kv_cache, attn_backend)

    def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
        return None

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        if self._worker is None or kv_connector_metadata is None:
            return
        # vLLM <= ~0.18 passes set[str]; later versions the step's metadata.
        if isinstance(kv_connector_metadata, (set, frozenset, list, tuple)):
            ids = set(kv_connector_metadata)
        else:
            ids = set(plan_of(kv_connector_metadata).preempted)
        self._worker.handle_preemptions(ids)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self._worker is None:
            return
        self._worker.start_load_kv(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        # Saves are planned by the scheduler and submitted from wait_for_save, so CUDA
        # graph replay (which skips layer hooks) cannot suppress them.
        return None

    def wait_for_save(self) -> None:
        if self._worker is None:
            return
        self._worker.wait_for_save(self._get_connector_metadata())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._worker is None:
            return None, None
        return self._worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        if self._worker is None:
            return set()
        return self._worker.get_block_ids_with_load_errors()

    # ---------------------------------------------------------------- scheduler side

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        if self._scheduler is None:
            return 0, False
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int):
        if self._scheduler is not None:
            self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        if self._scheduler is None:
            return PegaConnectorMetadata()
        return PegaConnectorMetadata(self._scheduler.build_connector_meta(scheduler_output))

    def update_connector_output(self, connector_output: Any) -> None:
        if self._scheduler is not None:
            self._scheduler.update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict | None]:
        if self._scheduler is None:
            return False, None
        return self._scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(self, request: Any, block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        """SupportsHMA: called instead of request_finished, once, with every group's
        blocks. True holds them until every worker reported the request's saves."""
        if self._scheduler is None:
            return False, None
        return self._scheduler.request_finished_all_groups(request, block_ids)

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        if self._scheduler is not None:
            self._scheduler.bind_gpu_block_pool(gpu_block_pool)

    def take_events(self) -> Iterable[Any]:
        """BlockStored / BlockRemoved for blocks in PegaFlow on this node (scheduler)."""
        if self._scheduler is None or not self._ctx.kv_events:
            return ()  # vLLM publishes no KV events: none are tracked
        records = self._scheduler.take_events()
        return _router_events(records) if records else ()

    def get_kv_connector_kv_cache_events(self) -> PegaKVEvents | None:
        """Worker: the hashes this worker's Saves stored since the last call."""
        if self._worker is None or not self._ctx.kv_events:
            return None
        records = self._worker.event_log.take()
        return PegaKVEvents(records) if records else None

    # ---------------------------------------------------------------- stats

    def get_kv_connector_stats(self) -> PegaKVConnectorStats | None:
        """What this side recorded since the last call (None when nothing happened, so
        an idle worker adds nothing to vLLM's KVConnectorOutput)."""
        part = self._scheduler if self._scheduler is not None else self._worker
        data = part.recorder.take() if part is not None else None
        return PegaKVConnectorStats(data) if data else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> PegaKVConnectorStats | None:
        return PegaKVConnectorStats(data)

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]):
        from pegaflow.connector.prom import make_prom_metrics

        return make_prom_metrics(vllm_config, metric_types, labelnames,
                                 per_engine_labelvalues)

    def has_pending_push_work(self) -> bool:
        return self._scheduler is not None and self._scheduler.has_pending_push_work()

    def get_finished_count(self) -> int | None:
        return None

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        return None

    # ---------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        if self._scheduler is not None:
            self._scheduler.shutdown()
        if self._worker is not None:
            self._worker.shutdown()
        clients, self._clients = getattr(self, "_clients", None) or [], []
        self._client = None
        for client in clients:
            if client is not None and hasattr(client, "close"):
                client.close()
