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

Reference options this connector does not implement: ``pegaflow.tp_shard_endpoints``
with more than one endpoint raises at start-up; ``pegaflow.pd_tail_save`` /
``pegaflow.pd_tail_load`` set to true raise at start-up (false is accepted).
"""

from __future__ import annotations

import hashlib
import logging
import os
import uuid
from dataclasses import dataclass
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

    @property
    def read_enabled(self) -> bool:
        return self.mode == READ_WRITE


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

    shards = extra.get("pegaflow.tp_shard_endpoints")
    if shards is not None and not (isinstance(shards, (list, tuple)) and len(shards) <= 1):
        raise ValueError("pegaflow.tp_shard_endpoints (one server per host for cross-host TP) "
                         "is not supported by this connector; use one endpoint")
    if shards:
        host_port = str(shards[0])
        endpoint = host_port
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
    )


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


# ------------------------------------------------------------------ context


@dataclass(frozen=True)
class ConnectorContext:
    """Per-process identity and topology, shared by scheduler and worker logic.

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

    @property
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

    @property
    def read_enabled(self) -> bool:
        return self.mode == READ_WRITE

    @property
    def skip_save(self) -> bool:
        """Collapsed MLA: every TP rank holds the same KV; only TP rank 0 copies it."""
        return self.collapse_mla_tp and self.dcp_world_size <= 1 and self.physical_tp_rank != 0

    @property
    def cross_layer_name(self) -> str:
        return f"{CROSS_LAYER_NAME}_pp{self.pp_rank}" if self.pp_size > 1 else CROSS_LAYER_NAME


def build_context(vllm_config: Any, options: ConnectorOptions, *, num_cache_groups: int = 1,
                  tp_rank: int = 0, pp_rank: int = 0, dcp_rank: int = 0,
                  env: Mapping[str, str] | None = None, cross_layer_supported: bool = True,
                  hash_block_size: int | None = None) -> ConnectorContext:
    """Context of one connector process. Scheduler processes pass ranks 0.

    ``cross_layer_supported``: vLLM's base class has the cross-layer hooks (a base
    without them only ever calls register_kv_caches). ``hash_block_size``: tokens per
    block hash as vLLM resolved them (None: vLLM predates resolve_kv_cache_block_sizes).
    """
    pc = vllm_config.parallel_config
    tp_size = int(pc.tensor_parallel_size)
    world_size = int(getattr(pc, "world_size", None) or tp_size * pc.pipeline_parallel_size)
    dcp = int(getattr(pc, "decode_context_parallel_size", 1) or 1)
    pcp = int(getattr(pc, "prefill_context_parallel_size", 1) or 1)
    is_mla = detect_mla(vllm_config)
    collapse = is_mla and num_cache_groups <= 1
    eff_tp_size = max(1, dcp) if collapse else tp_size
    eff_tp_rank = dcp_rank if collapse else tp_rank
    if dcp > 1 and not is_mla:
        log.warning("DCP with a non-MLA model (dcp=%d): ranks are keyed by TP rank only", dcp)
    backend = options.transfer_backend or ("kernel" if is_mla else "direct")
    # Cross-layer registration is expected only where vLLM can do it and the connector
    # asks for it (never for MLA); the factor must describe the layout registered.
    cross = bool(options.cross_layer_blocks and not is_mla and cross_layer_supported)
    ns_cross = derive_namespace(namespace_factors(vllm_config, eff_tp_size, dcp, pcp, True))
    ns_layers = derive_namespace(namespace_factors(vllm_config, eff_tp_size, dcp, pcp, False))
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
    )
