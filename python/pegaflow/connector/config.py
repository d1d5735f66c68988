"""Connector options, identity (instance id, namespace) and the per-process context.

Everything here reads vLLM objects by attribute only (duck typing) and imports nothing
from vLLM, so it is testable with plain namespaces.

Options (``kv_connector_extra_config`` keys; environment variables win where listed):

  pegaflow.host                 server host, default "http://127.0.0.1"   env PEGAFLOW_HOST
                                ("unix:/PATH" names the server's --local-addr socket; the
                                port is then not used)
  pegaflow.port                 server gRPC port, default 50055           env PEGAFLOW_PORT
  pegaflow.mode                 "read_write" (default) | "save_only"
  pegaflow.transfer_backend     "direct" | "kernel" (default: kernel for MLA, else direct)
  pegaflow.wait_for_full_prefix bool, default false (passed on every QueryPrefetch)
  pegaflow.query_timeout_ms     QueryPrefetch/Release deadline, default 2000
  pegaflow.rpc_timeout_ms       Register/Save/Load/Unregister deadline, default 30000
  env PEGAFLOW_INSTANCE_ID      instance id when vLLM provides no engine_id
  env PEGA_LOAD_TIMEOUT_SECONDS a Load not complete after this is a failure
                                (default 120, floored at 30)
  env PEGAFLOW_CROSS_LAYER_BLOCKS "1" (default) asks vLLM for one cross-layer KV tensor
                                (non-MLA, single cache group, a vLLM base class with the
                                cross-layer hooks); "0" registers per layer. The
                                namespace's cross-layer factor is the layout registered.

Security (docs/security.md) is read by libpegaflow itself from the environment:
  env PEGAFLOW_TLS_CA           TLS, verifying the server with this CA file
  env PEGAFLOW_TLS_CERT/_KEY    client certificate for a server with --tls-ca (mutual TLS)
  env PEGAFLOW_TOKEN_FILE       the cluster token, for a worker not on the server's host

  pegaflow.tp_shard_endpoints   list of n server endpoints ("host:port", "http://host:port"
                                or "unix:PATH"), one per host when one TP group spans n
                                hosts: global TP ranks are split into n contiguous groups,
                                group i registers with endpoint i as a local TP topology
                                under namespace "{base}:tp-shard-{i}-of-{n}" (TP-only
                                parallelism; one endpoint = pegaflow.host/port)
  vLLM additional_config mla_layer_split_kv_cache  MLA: each TP rank holds a disjoint
                                subset of the layers (page-first layer-split shards)

Reference options this connector does not implement: ``pegaflow.pd_tail_save`` /
``pegaflow.pd_tail_load`` set to true raise at start-up (false is accepted).
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

log = logging.getLogger("pegaflow.connector")

READ_WRITE = "read_write"
SAVE_ONLY = "save_only"
MODES = (READ_WRITE, SAVE_ONLY)
TRANSFER_BACKENDS = {"direct": 0, "kernel": 1}
DEFAULT_HOST = "http://127.0.0.1"
DEFAULT_PORT = 50055
LOAD_TIMEOUT_DEFAULT_S = 120.0
LOAD_TIMEOUT_FLOOR_S = 30.0
DEFAULT_QUERY_TIMEOUT_MS = 2000
DEFAULT_RPC_TIMEOUT_MS = 30000
CROSS_LAYER_NAME = "ALL_LAYERS"

KNOWN_KEYS = {
    "pegaflow.host", "pegaflow.port", "pegaflow.mode", "pegaflow.transfer_backend",
    "pegaflow.wait_for_full_prefix", "pegaflow.query_timeout_ms", "pegaflow.rpc_timeout_ms",
    "pegaflow.tp_shard_endpoints", "pegaflow.pd_tail_save", "pegaflow.pd_tail_load",
}


def parse_bool(v: Any, key: str) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, int) and v in (0, 1):
        return bool(v)
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("1", "true", "yes", "on"):
            return True
        if s in ("0", "false", "no", "off", ""):
            return False
    raise ValueError(f"{key}: expected a boolean, got {v!r}")


def parse_int(v: Any, key: str, minimum: int = 1) -> int:
    try:
        n = int(v)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: expected an integer, got {v!r}") from None
    if n < minimum:
        raise ValueError(f"{key}: must be >= {minimum}, got {n}")
    return n


def load_timeout_from_env(env: Mapping[str, str]) -> float:
    v = env.get("PEGA_LOAD_TIMEOUT_SECONDS")
    if v is None or v == "":
        return LOAD_TIMEOUT_DEFAULT_S
    try:
        t = float(v)
    except ValueError:
        log.warning("invalid PEGA_LOAD_TIMEOUT_SECONDS=%r; using %.0f s", v,
                    LOAD_TIMEOUT_DEFAULT_S)
        return LOAD_TIMEOUT_DEFAULT_S
    if t < LOAD_TIMEOUT_FLOOR_S:
        log.warning("PEGA_LOAD_TIMEOUT_SECONDS=%s raised to the floor of %.0f s", v,
                    LOAD_TIMEOUT_FLOOR_S)
        t = LOAD_TIMEOUT_FLOOR_S
    return t


@dataclass(frozen=True)
class ConnectorOptions:
    endpoint: str = f"{DEFAULT_HOST}:{DEFAULT_PORT}"
    mode: str = READ_WRITE
    transfer_backend: str | None = None
    wait_for_full_prefix: bool = False
    cross_layer_blocks: bool = True
    load_timeout_s: float = LOAD_TIMEOUT_DEFAULT_S
    query_timeout_ms: int = DEFAULT_QUERY_TIMEOUT_MS
    rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS
    # pegaflow.tp_shard_endpoints with more than one entry (else empty: ``endpoint``)
    shard_endpoints: tuple[str, ...] = ()

    @property
    def read_enabled(self) -> bool:
        return self.mode == READ_WRITE

    @property
    def endpoints(self) -> tuple[str, ...]:
        """Every server this connector talks to: one per TP shard (one without shards)."""
        return self.shard_endpoints or (self.endpoint,)


def _extra_dict(kv_transfer_config: Any) -> dict:
    if kv_transfer_config is None:
        return {}
    if isinstance(kv_transfer_config, Mapping):
        return dict(kv_transfer_config)
    return dict(getattr(kv_transfer_config, "kv_connector_extra_config", None) or {})


def parse_options(kv_transfer_config: Any, env: Mapping[str, str] | None = None) -> ConnectorOptions:
    """Options from ``kv_transfer_config.kv_connector_extra_config`` and the environment."""
    env = os.environ if env is None else env
    extra = _extra_dict(kv_transfer_config)
    for k in extra:
        if k.startswith("pegaflow.") and k not in KNOWN_KEYS:
            log.warning("unknown connector option %s ignored", k)

    host = env.get("PEGAFLOW_HOST") or extra.get("pegaflow.host", DEFAULT_HOST)
    port = env.get("PEGAFLOW_PORT") or extra.get("pegaflow.port", DEFAULT_PORT)
    port = parse_int(port, "pegaflow.port")
    if port > 65535:
        raise ValueError(f"pegaflow.port: {port} is not a TCP port")
    host = str(host).rstrip("/")
    if not host:
        raise ValueError("pegaflow.host must not be empty")

    mode = str(extra.get("pegaflow.mode", READ_WRITE)).strip().lower()
    if mode not in MODES:
        raise ValueError(f"unsupported pegaflow.mode {mode!r}; expected one of: "
                         f"{', '.join(MODES)}")

    backend = extra.get("pegaflow.transfer_backend")
    if backend is not None and backend != "":
        backend = str(backend).strip().lower()
        if backend not in TRANSFER_BACKENDS:
            raise ValueError(f"unsupported pegaflow.transfer_backend {backend!r}; expected "
                             f"one of: {', '.join(TRANSFER_BACKENDS)}")
    else:
        backend = None

    shards = _parse_shard_endpoints(extra.get("pegaflow.tp_shard_endpoints"))
    if shards:
        endpoint = shards[0]
    elif host.startswith("unix:"):
        if len(host) == len("unix:"):
            raise ValueError("pegaflow.host: unix: needs a socket path (unix:/run/pegaflow.sock)")
        endpoint = host  # the server's --local-addr; no port
    else:
        endpoint = f"{host}:{port}"
    for k in ("pegaflow.pd_tail_save", "pegaflow.pd_tail_load"):
        if k in extra and parse_bool(extra[k], k):
            # Refused, not ignored: a P/D pair relying on tail keys would silently
            # recompute (or miss) every partial last block.
            raise ValueError(f"{k} (P/D partial tail-block keys) is not implemented by this "
                             "connector; remove it (or set it to false): full blocks are "
                             "still saved and loaded, the partial last prompt block is "
                             "recomputed")

    return ConnectorOptions(
        endpoint=endpoint,
        mode=mode,
        transfer_backend=backend,
        wait_for_full_prefix=parse_bool(extra.get("pegaflow.wait_for_full_prefix", False),
                                        "pegaflow.wait_for_full_prefix"),
        cross_layer_blocks=env.get("PEGAFLOW_CROSS_LAYER_BLOCKS", "1") == "1",
        load_timeout_s=load_timeout_from_env(env),
        query_timeout_ms=parse_int(extra.get("pegaflow.query_timeout_ms",
                                             DEFAULT_QUERY_TIMEOUT_MS),
                                   "pegaflow.query_timeout_ms"),
        rpc_timeout_ms=parse_int(extra.get("pegaflow.rpc_timeout_ms", DEFAULT_RPC_TIMEOUT_MS),
                                 "pegaflow.rpc_timeout_ms"),
        shard_endpoints=tuple(shards) if len(shards) > 1 else (),
    )


def _parse_shard_endpoints(v: Any) -> list[str]:
    """``pegaflow.tp_shard_endpoints``: a list (or a comma-separated string) of distinct
    endpoints; None/empty = not set."""
    key = "pegaflow.tp_shard_endpoints"
    if v is None or v == "" or v == []:
        return []
    if isinstance(v, str):
        v = [p for p in (x.strip() for x in v.split(",")) if p]
    if not isinstance(v, (list, tuple)):
        raise ValueError(f"{key}: expected a list of endpoints, got {v!r}")
    out = []
    for e in v:
        e = str(e).strip().rstrip("/")
        if not e:
            raise ValueError(f"{key}: empty endpoint in {v!r}")
        if not e.startswith("unix:") and ":" not in e.split("//")[-1]:
            raise ValueError(f"{key}: endpoint {e!r} has no port (expected host:port)")
        out.append(e)
    if len(set(out)) != len(out):
        raise ValueError(f"{key}: endpoints must be distinct, got {out}")
    return out


# ------------------------------------------------------------------ identity


def resolve_instance_id(vllm_config: Any, env: Mapping[str, str] | None = None) -> str:
    """Instance id as the reference derives it (§1.3): ``kv_transfer_config.engine_id``
    when set (vLLM sets it, unique per launch, with ``_dp{rank}`` per DP engine);
    else ``vllm_config.instance_id``, env PEGAFLOW_INSTANCE_ID, or a random hex, plus
    ``_dp{local_dp_rank}`` when data_parallel_size > 1."""
    env = os.environ if env is None else env
    ktc = getattr(vllm_config, "kv_transfer_config", None)
    engine_id = getattr(ktc, "engine_id", None)
    if engine_id:
        return str(engine_id)
    iid = getattr(vllm_config, "instance_id", None) or env.get("PEGAFLOW_INSTANCE_ID", "")
    if not iid:
        iid = uuid.uuid4().hex
        log.warning("no engine_id, instance_id or PEGAFLOW_INSTANCE_ID: generated %s; the "
                    "scheduler and workers of one engine must agree on it, so set "
                    "PEGAFLOW_INSTANCE_ID when vLLM provides no engine_id", iid)
    pc = getattr(vllm_config, "parallel_config", None)
    if pc is not None and (getattr(pc, "data_parallel_size", 1) or 1) > 1:
        dp_rank = getattr(pc, "data_parallel_rank_local", None)
        if dp_rank is not None:
            iid = f"{iid}_dp{dp_rank}"
    return iid


def detect_mla(vllm_config: Any) -> bool:
    """MLA (DeepSeek-style latent attention): the HF text config has ``kv_lora_rank``."""
    mc = getattr(vllm_config, "model_config", None)
    hf = getattr(mc, "hf_text_config", None)
    return getattr(hf, "kv_lora_rank", None) is not None


def namespace_factors(vllm_config: Any, tp_size: int, dcp_world_size: int,
                      pcp_world_size: int, cross_layer_blocks: bool) -> dict[str, Any]:
    """The reference's 13 namespace factors (§2.9). ``tp_size`` is the *effective* TP
    size (1 for MLA without DCP). Block size and hash algorithm are deliberately absent:
    they change the keys themselves, so they can never collide."""
    mc = vllm_config.model_config
    cc = vllm_config.cache_config
    sc = getattr(vllm_config, "scheduler_config", None)
    additional = getattr(vllm_config, "additional_config", None) or {}
    return {
        "model": mc.model,
        "dtype": str(mc.dtype),
        "tp_size": tp_size,
        "pp_size": vllm_config.parallel_config.pipeline_parallel_size,
        "num_kv_heads": mc.get_total_num_kv_heads(),
        "head_size": mc.get_head_size(),
        "num_hidden_layers": mc.get_total_num_hidden_layers(),
        "cache_dtype": str(cc.cache_dtype),
        "is_hma_enabled": not getattr(sc, "disable_hybrid_kv_cache_manager", False),
        "dcp_world_size": dcp_world_size,
        "pcp_world_size": pcp_world_size,
        "cross_layer_blocks": cross_layer_blocks,
        "mla_layer_split_kv_cache": bool(additional.get("mla_layer_split_kv_cache", False)),
    }


def derive_namespace(factors: Mapping[str, Any]) -> str:
    """First 8 hex chars of SHA-256 over ``str(sorted(factors.items()))`` (reference
    ``derive_namespace``): equal factors, equal namespace, across implementations."""
    return hashlib.sha256(str(sorted(factors.items())).encode()).hexdigest()[:8]


# ------------------------------------------------------------------ cache groups

FULL = "full"  # attention over every earlier token: every block of the prefix is needed
STATE = "state"  # recurrent state (Mamba / linear attention): the block at the resume point


@dataclass(frozen=True)
class CacheGroup:
    """One vLLM KV cache group as the connector stores it.

    ``storage_id`` is the server's storage group (``layer_group_ids``): 0 for the first
    full-attention group (queried as a prefix), then 1.. for the others in vLLM's order
    (membership queries). ``kind`` says which of a group's blocks a resume point needs."""

    vllm_index: int
    storage_id: int
    kind: str
    layer_names: tuple[str, ...]
    block_size: int


def _spec_kind(spec: Any) -> str | None:
    names = [c.__name__ for c in type(spec).__mro__]
    if "UniformTypeKVCacheSpecs" in names:
        inner = list(getattr(spec, "kv_cache_specs", {}).values())
        kinds = {_spec_kind(x) for x in inner}
        return kinds.pop() if len(kinds) == 1 else None
    if "SlidingWindowSpec" in names or "ChunkedLocalAttentionSpec" in names:
        return None  # only the window is kept: not a prefix, not a single state
    if "MambaSpec" in names:
        mode = str(getattr(spec, "mamba_cache_mode", "align") or "none")
        if mode == "all":
            return FULL  # a state at every block boundary: every block is kept and needed
        if mode == "align":
            return STATE
        raise ValueError(f"PegaKVConnector: a MambaSpec group with mamba_cache_mode={mode!r} "
                         "keeps no per-block states to store; run vLLM with prefix caching "
                         "of Mamba states (mamba_cache_mode 'align' or 'all')")
    if "FullAttentionSpec" in names or "MLAAttentionSpec" in names:
        if getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None):
            return None
        return FULL
    return None


def describe_cache_groups(kv_cache_config: Any) -> tuple[CacheGroup, ...]:
    """vLLM's ``kv_cache_config.kv_cache_groups`` as CacheGroups (empty when vLLM gave
    none). Raises ValueError for a hybrid model this connector cannot store: a group that
    is neither full attention nor a recurrent state (sliding window, chunked local), no
    full-attention group, or groups whose block sizes differ."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or ())
    if len(groups) <= 1:
        return tuple(CacheGroup(0, 0, FULL, tuple(getattr(g, "layer_names", ()) or ()),
                                int(getattr(g.kv_cache_spec, "block_size", 0) or 0))
                     for g in groups)
    kinds = []
    for i, g in enumerate(groups):
        k = _spec_kind(g.kv_cache_spec)
        if k is None:
            raise ValueError(f"PegaKVConnector: KV cache group {i} "
                             f"({type(g.kv_cache_spec).__name__}) is not supported in a hybrid "
                             "model; supported: full attention / MLA groups and Mamba-style "
                             "recurrent-state groups")
        kinds.append(k)
    if FULL not in kinds:
        raise ValueError("PegaKVConnector: a hybrid model needs a full-attention KV cache "
                         "group (its blocks are the prefix the server matches)")
    sizes = {int(g.kv_cache_spec.block_size) for g in groups}
    if len(sizes) != 1:
        raise ValueError(f"PegaKVConnector: hybrid KV cache groups with different block sizes "
                         f"({sorted(sizes)}) are not supported; one block hash must cover one "
                         "block of every group")
    first = kinds.index(FULL)
    order = [first] + [i for i in range(len(groups)) if i != first]
    sid = {vi: n for n, vi in enumerate(order)}
    return tuple(CacheGroup(i, sid[i], kinds[i], tuple(g.layer_names),
                            int(g.kv_cache_spec.block_size)) for i, g in enumerate(groups))


# ------------------------------------------------------------------ context


@dataclass(frozen=True)
class ConnectorContext:
    """Per-process identity and topology, shared by scheduler and worker logic.

    Frozen: the derived values the hooks read every step (virtual_block_size, hybrid,
    prefix_group_index, ...) are computed once per context (cached_property).

    ``tp_rank``/``tp_size`` are the *effective* values sent to the server: MLA with one
    cache group collapses TP (KV identical on every TP rank) to the DCP rank / size."""

    instance_id: str
    namespace: str
    block_size: int
    tp_rank: int = 0
    tp_size: int = 1
    world_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    dcp_world_size: int = 1
    pcp_world_size: int = 1
    physical_tp_rank: int = 0
    is_mla: bool = False
    collapse_mla_tp: bool = False
    mode: str = READ_WRITE
    transfer_mode: int = 0
    wait_for_full_prefix: bool = False
    cross_layer_blocks: bool = True
    query_timeout_ms: int = DEFAULT_QUERY_TIMEOUT_MS
    rpc_timeout_ms: int = DEFAULT_RPC_TIMEOUT_MS
    load_timeout_s: float = LOAD_TIMEOUT_DEFAULT_S
    client_version: str | None = None  # None: the library's version
    # Tokens per entry of request.block_hashes as vLLM resolved them
    # (resolve_kv_cache_block_sizes); None: vLLM predates it (block_size * dcp * pcp).
    hash_block_size: int | None = None
    # Namespaces of the two registration layouts ("" = ``namespace``); ``namespace``
    # itself is the one of the layout expected (``cross_layer_blocks``).
    namespace_cross_layer: str = ""
    namespace_per_layer: str = ""
    # TP across hosts: this process's shard (workers) and the number of shards
    num_shards: int = 1
    shard_index: int = 0
    # physical TP rank / size within the shard (the server's local TP topology);
    # None: physical_tp_rank / tp_size
    local_tp_rank: int | None = None
    local_tp_size: int | None = None
    # MLA page-first registration (one cache group, no DCP, no PP) and its layer split
    page_first: bool = False
    mla_layer_split: bool = False
    # vLLM's KV cache groups (empty: one group, all layers, storage group 0)
    groups: tuple[CacheGroup, ...] = ()
    # KV cache events for routers (events.py): build_context sets it from vLLM's
    # kv_events_config (kv_events_enabled); without them the connector does no event work
    kv_events: bool = True

    @cached_property
    def local_rank(self) -> int:
        return self.physical_tp_rank if self.local_tp_rank is None else self.local_tp_rank

    @cached_property
    def local_size(self) -> int:
        return self.tp_size if self.local_tp_size is None else self.local_tp_size

    def namespace_of_shard(self, i: int) -> str:
        """The namespace shard i registers under (this one without shards)."""
        if self.num_shards <= 1:
            return self.namespace
        return shard_namespace(self.namespace.rsplit(":tp-shard-", 1)[0], i, self.num_shards)

    @cached_property
    def hybrid(self) -> bool:
        return len(self.groups) > 1

    @cached_property
    def storage_groups(self) -> tuple[CacheGroup, ...]:
        """The groups ordered by storage id (storage group 0 first)."""
        return tuple(sorted(self.groups, key=lambda g: g.storage_id))

    @cached_property
    def prefix_group_index(self) -> int:
        """vLLM index of the group whose blocks are queried as a prefix (storage 0)."""
        for g in self.groups:
            if g.storage_id == 0:
                return g.vllm_index
        return 0

    def layer_group(self, name: str) -> int:
        """Storage group of a registered layer (0 when vLLM named no groups)."""
        for g in self.groups:
            if name in g.layer_names:
                return g.storage_id
        return 0

    @cached_property
    def stripe_saves(self) -> bool:
        """Page-first MLA replicas: rank r of the shard saves the blocks with
        ``block_id % local_tp_size == r`` (all layers of those pages); together the
        ranks store every block once."""
        return self.page_first and not self.mla_layer_split and self.local_size > 1

    @cached_property
    def virtual_block_size(self) -> int:
        """Tokens per scheduler block = per entry of request.block_hashes."""
        if self.hash_block_size:
            return self.hash_block_size
        return self.block_size * self.dcp_world_size * self.pcp_world_size

    def namespace_for(self, cross_layer: bool) -> str:
        """Namespace of the layout actually registered: its cross-layer factor must
        describe that layout, or two vLLM versions registering differently would share
        keys across incompatible block layouts."""
        ns = self.namespace_cross_layer if cross_layer else self.namespace_per_layer
        return ns or self.namespace

    @cached_property
    def read_enabled(self) -> bool:
        return self.mode == READ_WRITE

    @cached_property
    def skip_save(self) -> bool:
        """Collapsed MLA not registered page-first (PP > 1): every TP rank holds the same
        KV; only TP rank 0 copies it. (Page-first replicas stripe instead; layer-split
        ranks each hold their own layers.)"""
        return (self.collapse_mla_tp and self.dcp_world_size <= 1 and not self.page_first
                and not self.mla_layer_split and self.local_rank != 0)

    @property
    def cross_layer_name(self) -> str:
        return f"{CROSS_LAYER_NAME}_pp{self.pp_rank}" if self.pp_size > 1 else CROSS_LAYER_NAME


def kv_events_enabled(vllm_config: Any) -> bool:
    """Whether vLLM publishes KV cache events, the connector's ``take_events`` included.
    vLLM's scheduler hands every step's events to ``EventPublisherFactory.create
    (kv_events_config)`` (vllm/distributed/kv_events.py), which is a NullEventPublisher
    (drops them) unless ``kv_events_config`` is set with ``enable_kv_cache_events`` and a
    publisher other than "null" (KVEventsConfig, vllm/config/kv_events.py: publisher
    None means "zmq" when enabled). vLLM's own CPU offload connector gates its events the
    same way. A vLLM without kv_events_config publishes nothing."""
    c = getattr(vllm_config, "kv_events_config", None)
    if c is None or not getattr(c, "enable_kv_cache_events", False):
        return False
    return getattr(c, "publisher", None) != "null"


def build_context(vllm_config: Any, options: ConnectorOptions, *, num_cache_groups: int = 1,
                  tp_rank: int = 0, pp_rank: int = 0, dcp_rank: int = 0,
                  env: Mapping[str, str] | None = None, cross_layer_supported: bool = True,
                  hash_block_size: int | None = None,
                  groups: tuple[CacheGroup, ...] = ()) -> ConnectorContext:
    """Context of one connector process. Scheduler processes pass ranks 0.

    ``cross_layer_supported``: vLLM's base class has the cross-layer hooks (a base
    without them only ever calls register_kv_caches). ``hash_block_size``: tokens per
    block hash as vLLM resolved them (None: vLLM predates resolve_kv_cache_block_sizes).
    ``groups``: describe_cache_groups(kv_cache_config).
    """
    pc = vllm_config.parallel_config
    tp_size = int(pc.tensor_parallel_size)
    pp_size = int(pc.pipeline_parallel_size)
    world_size = int(getattr(pc, "world_size", None) or tp_size * pp_size)
    dcp = int(getattr(pc, "decode_context_parallel_size", 1) or 1)
    pcp = int(getattr(pc, "prefill_context_parallel_size", 1) or 1)
    num_cache_groups = max(num_cache_groups, len(groups))
    if len(groups) > 1 and (dcp > 1 or pcp > 1):
        raise ValueError("PegaKVConnector: hybrid KV cache groups with decode/prefill context "
                         "parallelism are not supported")
    # TP shards across hosts: ranks [i*local, (i+1)*local) register with endpoint i.
    n = len(options.shard_endpoints) or 1
    local_tp = tp_size
    shard = 0
    if n > 1:
        if pp_size != 1 or dcp != 1 or pcp != 1 or world_size != tp_size:
            raise ValueError(
                f"pegaflow.tp_shard_endpoints ({n} endpoints) needs TP-only parallelism; this "
                f"vLLM has tp={tp_size} pp={pp_size} dcp={dcp} pcp={pcp} world={world_size}")
        if tp_size % n:
            raise ValueError(f"pegaflow.tp_shard_endpoints: tensor_parallel_size {tp_size} "
                             f"is not divisible into {n} equal shards")
        local_tp = tp_size // n
        shard = int(tp_rank) // local_tp
        world_size = local_tp
    local_rank = int(tp_rank) % local_tp
    is_mla = detect_mla(vllm_config)
    collapse = is_mla and num_cache_groups <= 1
    eff_tp_size = max(1, dcp) if collapse else local_tp
    eff_tp_rank = dcp_rank if collapse else local_rank
    additional = getattr(vllm_config, "additional_config", None) or {}
    layer_split = bool(is_mla and additional.get("mla_layer_split_kv_cache", False))
    # Page-first (reference §3.2): set only for MLA, a single cache group, no DCP, no PP.
    page_first = bool(collapse and dcp <= 1 and pp_size == 1)
    if layer_split and not page_first:
        raise ValueError("mla_layer_split_kv_cache needs page-first MLA registration (one KV "
                         "cache group, no decode context parallelism, no pipeline "
                         "parallelism)")
    if dcp > 1 and not is_mla:
        log.warning("DCP with a non-MLA model (dcp=%d): ranks are keyed by TP rank only", dcp)
    backend = options.transfer_backend or ("kernel" if is_mla else "direct")
    # Cross-layer registration is expected only where vLLM can do it and the connector
    # asks for it (never for MLA); the factor must describe the layout registered.
    cross = bool(options.cross_layer_blocks and not is_mla and cross_layer_supported
                 and num_cache_groups <= 1)
    ns_cross = derive_namespace(namespace_factors(vllm_config, eff_tp_size, dcp, pcp, True))
    ns_layers = derive_namespace(namespace_factors(vllm_config, eff_tp_size, dcp, pcp, False))
    if n > 1:
        ns_cross = shard_namespace(ns_cross, shard, n)
        ns_layers = shard_namespace(ns_layers, shard, n)
    return ConnectorContext(
        instance_id=resolve_instance_id(vllm_config, env),
        namespace=ns_cross if cross else ns_layers,
        namespace_cross_layer=ns_cross,
        namespace_per_layer=ns_layers,
        hash_block_size=int(hash_block_size) if hash_block_size else None,
        block_size=int(vllm_config.cache_config.block_size),
        tp_rank=eff_tp_rank,
        tp_size=eff_tp_size,
        world_size=world_size,
        pp_rank=int(pp_rank),
        pp_size=int(pc.pipeline_parallel_size),
        dcp_world_size=dcp,
        pcp_world_size=pcp,
        physical_tp_rank=int(tp_rank),
        is_mla=is_mla,
        collapse_mla_tp=collapse,
        mode=options.mode,
        transfer_mode=TRANSFER_BACKENDS[backend],
        wait_for_full_prefix=options.wait_for_full_prefix,
        cross_layer_blocks=cross,
        query_timeout_ms=options.query_timeout_ms,
        rpc_timeout_ms=options.rpc_timeout_ms,
        load_timeout_s=options.load_timeout_s,
        num_shards=n,
        shard_index=shard,
        local_tp_rank=local_rank,
        local_tp_size=local_tp,
        page_first=page_first,
        mla_layer_split=layer_split,
        groups=tuple(groups) if len(groups) > 1 else (),
        kv_events=kv_events_enabled(vllm_config),
    )


def shard_namespace(base: str, i: int, n: int) -> str:
    """Namespace of TP shard i of n (reference §2.9)."""
    return f"{base}:tp-shard-{i}-of-{n}"
