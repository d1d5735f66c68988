"""The vLLM stub against real vLLM: vLLM source files, or an installed vLLM.

The stub (tests/python/vllm_stub, following vLLM main; pins in docs/connector.md) is read
from its source (AST). For every entry of SPEC the real object must exist and:
  sig     - have the same parameter names, kinds and default-ness as the stub's
  fields  - have (at least) every dataclass field / attribute the stub declares; with a
            source tree also the same default-ness (required in vLLM = required here)
  enum    - have the stub's members with the same values (a source tree: exactly them)
  exists  - exist (class, function, property, class attribute or ``self.x`` of __init__)

Two ways to compare:
* ``PEGAFLOW_VLLM_SRC=DIR`` (a vLLM checkout, or any tree holding some of its files under
  ``DIR/vllm/``): AST against AST, no import, no torch. A name a file only imports (the
  shims the connector restructuring, vLLM PR #54654, leaves at the old paths;
  ``vllm/config/__init__.py``) is followed to the file defining it. SPEC modules absent
  from DIR are listed as not compared; at least one must be present.
* an importable vLLM: the same checks against the live objects.
Without either the comparisons skip, saying so; the extractor and SPEC are still checked
against the stub itself, and a synthetic tree proves that drifts are detected.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import inspect
import os

import pytest

from conftest import REAL_VLLM, STUB_DIR

V1 = "vllm.distributed.kv_transfer.kv_connector.v1"
BASE_METHODS = [
    "__init__", "bind_connector_metadata", "clear_connector_metadata",
    "_get_connector_metadata", "has_connector_metadata", "register_kv_caches",
    "register_cross_layers_kv_cache", "set_host_xfer_buffer_ops", "handle_preemptions",
    "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_finished",
    "get_block_ids_with_load_errors", "shutdown", "get_kv_connector_stats",
    "get_handshake_metadata", "build_connector_worker_meta", "bind_gpu_block_pool",
    "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
    "on_new_request", "update_connector_output", "request_finished", "take_events",
    "has_pending_push_work", "get_required_kvcache_layout",
    "requires_piecewise_for_cudagraph", "get_finished_count", "build_kv_connector_stats",
    "reset_cache", "set_xfer_handshake_metadata", "set_xfer_handshake_metadata_pp_aware",
    "build_prom_metrics", "get_kv_connector_kv_cache_events", "set_eagle_prefix_cache_hashing",
]
SPEC: list[tuple[str, str, str]] = (
    [(f"{V1}.base", "KVConnectorRole", "enum"),
     (f"{V1}.base", "KVConnectorMetadata", "exists"),
     (f"{V1}.base", "SupportsHMA.request_finished_all_groups", "sig"),
     (f"{V1}.base", "supports_hma", "sig"),
     (f"{V1}.base", "KVConnectorBase_V1.prefer_cross_layer_blocks", "exists"),
     (f"{V1}.base", "KVConnectorBase_V1.requires_kv_delivery", "exists"),
     (f"{V1}.base", "KVConnectorBase_V1.role", "exists")]
    + [(f"{V1}.base", f"KVConnectorBase_V1.{m}", "sig") for m in BASE_METHODS]
    + [("vllm.distributed.kv_transfer.kv_connector.factory",
        f"KVConnectorFactory.{m}", "sig")
       for m in ("register_connector", "create_connector", "get_connector_class",
                 "get_connector_class_by_name")]
    + [("vllm.distributed.parallel_state", f, "exists")
       for f in ("get_tensor_model_parallel_rank", "get_pp_group",
                 "get_decode_context_model_parallel_rank")]
    + [("vllm.utils.hashing", f, "sig")
       for f in ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "get_hash_fn_by_name")]
    + [("vllm.v1.core.kv_cache_utils", f, "sig")
       for f in ("hash_block_tokens", "init_none_hash", "get_request_block_hasher",
                 "make_block_hash_with_group_id")]
    + [("vllm.v1.core.kv_cache_utils", "KVCacheBlock", "fields"),
       ("vllm.v1.core.kv_cache_utils", "KVCacheBlock.set_block_hash", "sig"),
       ("vllm.v1.core.kv_cache_utils", "KVCacheBlock.reset_hash", "sig"),
       ("vllm.v1.core.kv_cache_utils", "KVCacheBlock.block_hash", "exists"),
       ("vllm.v1.core.kv_cache_utils", "resolve_kv_cache_block_sizes", "sig"),
       ("vllm.v1.core.kv_cache_utils", "maybe_convert_block_hash", "sig"),
       ("vllm.v1.request", "Request.__init__", "sig"),
       ("vllm.v1.request", "Request.update_block_hashes", "sig"),
       ("vllm.v1.request", "Request.block_hashes", "exists"),
       ("vllm.v1.request", "Request.num_publishable_block_hashes", "exists"),
       ("vllm.v1.request", "Request.status", "exists"),
       ("vllm.v1.request", "Request.num_preemptions", "exists"),
       ("vllm.v1.core.kv_cache_manager", "KVCacheBlocks", "fields"),
       ("vllm.v1.core.kv_cache_manager", "KVCacheBlocks.get_block_ids", "sig"),
       ("vllm.v1.core.sched.output", "NewRequestData", "fields"),
       ("vllm.v1.core.sched.output", "CachedRequestData", "fields"),
       ("vllm.v1.core.sched.output", "SchedulerOutput", "fields"),
       ("vllm.v1.outputs", "KVConnectorOutput", "fields"),
       ("vllm.v1.kv_cache_interface", "KVCacheConfig", "fields"),
       ("vllm.v1.kv_cache_interface", "KVCacheTensor", "fields"),
       ("vllm.v1.kv_cache_interface", "KVCacheGroupSpec", "fields"),
       ("vllm.v1.kv_cache_interface", "FullAttentionSpec", "exists"),
       ("vllm.v1.kv_cache_interface", "MLAAttentionSpec", "exists"),
       ("vllm.v1.kv_cache_interface", "MambaSpec", "exists"),
       ("vllm.v1.kv_cache_interface", "SlidingWindowSpec", "exists"),
       ("vllm.v1.request", "RequestStatus", "enum"),
       ("vllm.v1.request", "Request.append_output_token_ids", "sig"),
       ("vllm.v1.request", "Request.num_tokens", "exists"),
       ("vllm.config.kv_transfer", "KVTransferConfig", "fields"),
       ("vllm.config.kv_transfer", "KVTransferConfig.get_from_extra_config", "sig"),
       ("vllm.config", "VllmConfig", "fields"),
       ("vllm.config.kv_events", "KVEventsConfig", "fields"),
       ("vllm.config", "CacheConfig", "fields"),
       ("vllm.config", "SchedulerConfig", "fields")]
    + [("vllm.distributed.kv_events", c, "fields") for c in ("BlockStored", "BlockRemoved")]
    + [("vllm.distributed.kv_events", f"KVConnectorKVEvents.{m}", "sig")
       for m in ("add_events", "aggregate", "increment_workers", "get_all_events",
                 "get_number_of_workers", "clear_events", "merge")]
    + [("vllm.distributed.kv_events", "MEDIUM_CPU", "exists"),
       (f"{V1}.metrics", "KVConnectorStats", "fields"),
       (f"{V1}.metrics", "KVConnectorPromMetrics.__init__", "sig"),
       (f"{V1}.metrics", "KVConnectorPromMetrics.make_per_engine", "sig"),
       (f"{V1}.metrics", "KVConnectorPromMetrics.observe", "sig"),
       (f"{V1}.metrics", "KVConnectorLogging.observe", "sig"),
       (f"{V1}.metrics", "KVConnectorPrometheus.__init__", "sig"),
       (f"{V1}.metrics", "KVConnectorPrometheus.observe", "sig")]
    + [("vllm.config", f"ModelConfig.{m}", "sig")
       for m in ("get_total_num_kv_heads", "get_head_size", "get_total_num_hidden_layers")]

)
# Attributes the stub adds for its own convenience (not part of the contract).
STUB_ONLY_FIELDS = {"ModelConfig": {"num_kv_heads", "head_size", "num_hidden_layers"}}
PARALLEL_FIELDS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                   "data_parallel_rank_local", "decode_context_parallel_size",
                   "prefill_context_parallel_size", "world_size")


# ------------------------------------------------------------------ source trees (AST)


def _module_file(root: str, module: str) -> str | None:
    """The file of ``module`` under ``root`` (a directory holding ``vllm/``)."""
    rel = module.replace(".", os.sep)
    for cand in (os.path.join(root, rel + ".py"), os.path.join(root, rel, "__init__.py")):
        if os.path.exists(cand):
            return cand
    return None


def _parse(path: str) -> ast.Module:
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def _stub_tree(module: str) -> ast.Module:
    path = _module_file(STUB_DIR, module)
    if path is None:
        raise FileNotFoundError(module)
    return _parse(path)


def _defs(body) -> dict[str, ast.AST]:
    """Top-level names defined in a body (the last definition wins, as at run time;
    ``if TYPE_CHECKING:`` / ``try:`` blocks are looked into)."""
    out: dict[str, ast.AST] = {}
    for n in body:
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            out[n.name] = n
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out[n.target.id] = n
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = n
        elif isinstance(n, (ast.If, ast.Try)):
            for sub in [n.body, getattr(n, "orelse", []), getattr(n, "finalbody", [])]:
                for k, v in _defs(sub).items():
                    out.setdefault(k, v)
    return out


def _init_attrs(cls: ast.ClassDef) -> dict[str, ast.AST]:
    """``self.x = ...`` / ``self.x: T = ...`` in __init__."""
    init = _defs(cls.body).get("__init__")
    out: dict[str, ast.AST] = {}
    if not isinstance(init, ast.FunctionDef):
        return out
    for n in ast.walk(init):
        targets = n.targets if isinstance(n, ast.Assign) else (
            [n.target] if isinstance(n, ast.AnnAssign) else [])
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                    and t.value.id == "self":
                out.setdefault(t.attr, n)
    return out


def _find(tree: ast.AST, qual: str):
    node = tree
    for i, part in enumerate(qual.split(".")):
        hit = _defs(getattr(node, "body", [])).get(part)
        if hit is None and i > 0 and isinstance(node, ast.ClassDef):
            hit = _init_attrs(node).get(part)
        if hit is None:
            return None
        node = hit
    return node


def _reexport(tree: ast.Module, name: str, module: str) -> str | None:
    """The module ``name`` is imported from at the top level of ``module``'s file."""
    pkg = module.split(".")
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and any(a.name in (name, "*") and
                                                 (a.asname or a.name) in (name, "*")
                                                 for a in n.names):
            if n.level:
                base = pkg[:len(pkg) - n.level + (1 if _is_pkg_module(module) else 0)]
                return ".".join(base + ([n.module] if n.module else []))
            return n.module
    return None


_PKG_MODULES: set[str] = set()


def _is_pkg_module(module: str) -> bool:
    return module in _PKG_MODULES


def find_in_tree(root: str, module: str, qual: str, depth: int = 4):
    """(node, file) of ``module.qual`` in a source tree, following re-exports; (None,
    None) when the module's file is absent, (None, file) when the name is not there."""
    path = _module_file(root, module)
    if path is None:
        return None, None
    if path.endswith("__init__.py"):
        _PKG_MODULES.add(module)
    tree = _parse(path)
    node = _find(tree, qual)
    if node is not None or depth == 0:
        return node, path
    head = qual.split(".")[0]
    src = _reexport(tree, head, module)
    if src and src != module:
        node2, path2 = find_in_tree(root, src, qual, depth - 1)
        if node2 is not None:
            return node2, path2
    return None, path


def _ast_params(fn) -> list[tuple[str, str, bool]]:
    a = fn.args
    out = []
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    for i, (arg, d) in enumerate(zip(pos, defaults)):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append((arg.arg, kind, d is not None))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", False))
    for arg, d in zip(a.kwonlyargs, a.kw_defaults):
        out.append((arg.arg, "KEYWORD_ONLY", d is not None))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", False))
    return [p for p in out if p[0] not in ("self", "cls")]


def _ast_field_defaults(cls: ast.ClassDef) -> dict[str, bool]:
    """Class-body annotated fields -> has a default (``x: T = ...``)."""
    return {n.target.id: n.value is not None for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def _ast_fields(cls: ast.ClassDef) -> set[str]:
    return set(_ast_field_defaults(cls))


def _ast_names(cls: ast.ClassDef) -> set[str]:
    """Everything an instance of a class defined in source is known to have."""
    return set(_defs(cls.body)) | set(_init_attrs(cls))


def _ast_enum(cls: ast.ClassDef) -> dict[str, object]:
    """Members -> values; ``enum.auto()`` counts on from the previous int (from 1)."""
    out: dict[str, object] = {}
    last = 0
    for n in cls.body:
        if not (isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)):
            continue
        name, v = n.targets[0].id, n.value
        if isinstance(v, ast.Constant):
            out[name] = v.value
            if isinstance(v.value, int):
                last = v.value
        elif isinstance(v, ast.Call) and getattr(v.func, "attr", getattr(v.func, "id", None)) \
                == "auto":
            last += 1
            out[name] = last
        else:
            out[name] = None
    return out


def compare_tree(root: str, spec=None) -> tuple[list[str], list[str], int]:
    """(problems, modules not in the tree, entries compared) of the stub against the
    source tree at ``root``."""
    problems: list[str] = []
    absent: set[str] = set()
    compared = 0
    for module, qual, mode in (SPEC if spec is None else spec):
        mine = _find(_stub_tree(module), qual)
        assert mine is not None, f"SPEC names {module}.{qual}, which the stub lacks"
        theirs, path = find_in_tree(root, module, qual)
        where = f"{module}.{qual} [{mode}]"
        if path is None:
            absent.add(module)
            continue
        compared += 1
        if theirs is None:
            problems.append(f"{where}: not in vLLM ({os.path.relpath(path, root)})")
            continue
        if mode == "sig":
            if not isinstance(theirs, (ast.FunctionDef, ast.AsyncFunctionDef)):
                problems.append(f"{where}: not a function in vLLM")
            elif _ast_params(theirs) != _ast_params(mine):
                problems.append(f"{where}: signature drift: stub {_ast_params(mine)} vs "
                                f"vLLM {_ast_params(theirs)}")
        elif mode == "fields":
            if not isinstance(theirs, ast.ClassDef):
                problems.append(f"{where}: not a class in vLLM")
                continue
            want = _ast_field_defaults(mine)
            for k in STUB_ONLY_FIELDS.get(qual, ()):
                want.pop(k, None)
            have = _ast_field_defaults(theirs)
            names = _ast_names(theirs) | _inherited_fields(root, module, theirs)
            missing = sorted(k for k in want if k not in names)
            if missing:
                problems.append(f"{where}: vLLM lacks {missing}")
            for k, d in sorted(want.items()):
                if k in have and have[k] != d:
                    problems.append(f"{where}: field {k} has "
                                    f"{'a' if have[k] else 'no'} default in vLLM, "
                                    f"{'a' if d else 'no'} default in the stub")
        elif mode == "enum":
            m, t = _ast_enum(mine), _ast_enum(theirs)
            if m != t:
                problems.append(f"{where}: members drift: stub {m} vs vLLM {t}")
    return problems, sorted(absent), compared


def _inherited_fields(root: str, module: str, cls: ast.ClassDef) -> set[str]:
    """Fields of base classes defined in the same tree (one level of modules)."""
    out: set[str] = set()
    for b in cls.bases:
        name = b.id if isinstance(b, ast.Name) else getattr(b, "attr", None)
        if not name:
            continue
        node, _ = find_in_tree(root, module, name)
        if isinstance(node, ast.ClassDef) and node is not cls:
            out |= _ast_names(node) | _inherited_fields(root, module, node)
    return out


# ------------------------------------------------------------------ the live objects


def _live(module: str, qual: str):
    obj = importlib.import_module(module)
    for part in qual.split("."):
        if inspect.isclass(obj):
            try:
                obj = inspect.getattr_static(obj, part)
            except AttributeError:
                # an instance attribute: assigned as self.<part> in __init__
                src = inspect.getsource(obj.__init__)
                if f"self.{part}" not in src:
                    raise
                return INSTANCE_ATTR
        else:
            obj = getattr(obj, part)
    if isinstance(obj, (classmethod, staticmethod)):
        obj = obj.__func__
    return obj


INSTANCE_ATTR = object()


def _live_params(obj) -> list[tuple[str, str, bool]]:
    sig = inspect.signature(obj)
    return [(p.name, p.kind.name, p.default is not inspect.Parameter.empty)
            for p in sig.parameters.values() if p.name not in ("self", "cls")]


def _live_fields(obj) -> set[str]:
    if dataclasses.is_dataclass(obj):
        return {f.name for f in dataclasses.fields(obj)}
    names = set(dir(obj))
    try:
        names |= set(inspect.signature(obj.__init__).parameters)
    except (TypeError, ValueError):
        pass
    return names


def check(module: str, qual: str, mode: str) -> None:
    tree = _stub_tree(module)
    node = _find(tree, qual)
    assert node is not None, f"SPEC names {module}.{qual}, which the stub lacks"
    live = _live(module, qual)
    where = f"{module}.{qual}"
    if mode == "sig":
        assert _live_params(live) == _ast_params(node), f"{where}: signature drift"
    elif mode == "fields":
        want = _ast_fields(node) - STUB_ONLY_FIELDS.get(qual, set())
        missing = want - _live_fields(live)
        assert not missing, f"{where}: real object lacks {sorted(missing)}"
    elif mode == "enum":
        assert issubclass(live, enum.Enum)
        for name, value in _ast_enum(node).items():
            assert name in live.__members__, f"{where}.{name} missing"
            if value is not None:
                assert live[name].value == value, f"{where}.{name} value drift"


# ------------------------------------------------------------------ tests


def test_spec_entries_exist_in_the_stub_and_match_the_extractor():
    """Runs everywhere: SPEC is valid and AST extraction agrees with the imported stub."""
    if REAL_VLLM:
        pytest.skip("SKIP: real vLLM shadows the stub in this process")
    for module, qual, mode in SPEC:
        node = _find(_stub_tree(module), qual)
        assert node is not None, f"{module}.{qual}"
        live = _live(module, qual)
        if mode == "sig":
            assert _live_params(live) == _ast_params(node), f"{module}.{qual}"
        elif mode == "fields":
            assert _ast_fields(node) <= _live_fields(live), f"{module}.{qual}"
    from vllm.config import ParallelConfig

    assert set(PARALLEL_FIELDS) <= {f.name for f in dataclasses.fields(ParallelConfig)}


def _src_root() -> str | None:
    d = os.environ.get("PEGAFLOW_VLLM_SRC")
    if not d:
        return None
    d = os.path.abspath(d)
    if os.path.basename(d) == "vllm" and os.path.exists(os.path.join(d, "__init__.py")):
        d = os.path.dirname(d)  # pointed at the package itself
    return d


def test_stub_against_vllm_sources():
    """PEGAFLOW_VLLM_SRC=DIR: every SPEC entry against vLLM's own source files."""
    root = _src_root()
    if root is None:
        pytest.skip("SKIP: PEGAFLOW_VLLM_SRC is unset; point it at a vLLM checkout (or a "
                    "tree of vLLM files under DIR/vllm/) to compare the stub by AST")
    if not os.path.isdir(os.path.join(root, "vllm")):
        pytest.fail(f"PEGAFLOW_VLLM_SRC={root} holds no vllm/ directory")
    problems, absent, compared = compare_tree(root)
    if absent:
        print(f"not compared (absent from {root}): {', '.join(absent)}")
    print(f"{compared} SPEC entries compared against {root}")
    assert compared > 0, f"no SPEC module found under {root}/vllm"
    assert not problems, (f"stub vs vLLM sources at {root} ({len(problems)} drifts):\n"
                          + "\n".join(problems))


def test_source_comparison_of_the_stub_with_itself():
    """The AST extractor handles every SPEC entry: the stub compared with its own tree
    finds every module and no drift."""
    problems, absent, compared = compare_tree(STUB_DIR)
    assert (problems, absent, compared) == ([], [], len(SPEC))


_SYNTHETIC = {
    # an older KVCacheBlock: property setter, no set_block_hash / _block_hash_num_tokens
    "vllm/v1/core/kv_cache_utils.py": """
from dataclasses import dataclass
@dataclass
class KVCacheBlock:
    block_id: int
    ref_cnt: int = 0
    _block_hash: bytes | None = None
    @property
    def block_hash(self):
        return self._block_hash
    @block_hash.setter
    def block_hash(self, h):
        self._block_hash = h
    def reset_hash(self):
        self._block_hash = None
def get_request_block_hasher(block_size, caching_hash_fn):
    pass
""",
    # eos_token_id argument and the old enum (values shift by one from RUNNING on)
    "vllm/v1/request.py": """
import enum
class Request:
    def __init__(self, request_id, prompt_token_ids, sampling_params, pooling_params,
                 eos_token_id, client_index=0):
        self.block_hashes = []
class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    WAITING_FOR_FSM = enum.auto()
    WAITING_FOR_REMOTE_KVS = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
""",
    "vllm/v1/kv_cache_interface.py": """
from dataclasses import dataclass, field
@dataclass
class KVCacheConfig:
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list = field(default_factory=list)
""",
    # the restructuring branch: a shim at the old path, the class under vllm/backends
    "vllm/distributed/kv_transfer/kv_connector/factory.py": """
from vllm.backends.kv_connector.factory import KVConnectorFactory  # noqa: F401
""",
    "vllm/backends/kv_connector/factory.py": """
class KVConnectorFactory:
    @classmethod
    def create_connector(cls, config, role, kv_cache_config=None):
        pass
""",
}


def test_source_comparison_detects_drift(tmp_path):
    """A small synthetic tree with the divergences issue 15 lists: each is reported,
    a shim is followed to the file defining the class, absent modules are listed."""
    for rel, text in _SYNTHETIC.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    problems, absent, compared = compare_tree(str(tmp_path))
    text = "\n".join(problems)
    assert "KVCacheBlock.set_block_hash [sig]: not in vLLM" in text
    assert "KVCacheBlock [fields]: vLLM lacks ['_block_hash_num_tokens', 'is_null'" in text
    assert "get_request_block_hasher [sig]: signature drift" in text
    assert "resolve_kv_cache_block_sizes [sig]: not in vLLM" in text
    assert "Request.__init__ [sig]: signature drift" in text and "eos_token_id" in text
    assert "Request.num_publishable_block_hashes [exists]: not in vLLM" in text
    assert "Request.update_block_hashes [sig]: not in vLLM" in text
    assert "RequestStatus [enum]: members drift" in text
    assert "KVCacheConfig [fields]: field kv_cache_groups has a default in vLLM, no " \
           "default in the stub" in text
    assert "KVConnectorFactory.create_connector [sig]: signature drift" in text
    assert "KVConnectorFactory.get_connector_class [sig]: not in vLLM" in text
    # found through the shim, so only the drift is reported, not "not in vLLM"
    assert "create_connector [sig]: not in vLLM" not in text
    assert "Request.block_hashes [exists]" not in text  # self.block_hashes in __init__
    assert "vllm.config" in absent and compared > 0


def test_source_comparison_follows_relative_reexports(tmp_path):
    (tmp_path / "vllm" / "config").mkdir(parents=True)
    (tmp_path / "vllm" / "config" / "__init__.py").write_text(
        "from .cache import CacheConfig\n")
    (tmp_path / "vllm" / "config" / "cache.py").write_text(
        "class CacheConfig:\n    block_size: int = 16\n")
    spec = [("vllm.config", "CacheConfig", "fields")]
    problems, absent, compared = compare_tree(str(tmp_path), spec)
    assert compared == 1 and absent == []
    assert len(problems) == 1 and "vLLM lacks ['cache_dtype'" in problems[0]


def test_stub_never_shadows_a_real_vllm():
    import vllm

    if REAL_VLLM:
        assert not getattr(vllm, "STUB", False)
        assert not os.path.abspath(vllm.__file__).startswith(os.path.abspath(STUB_DIR))
    else:
        assert vllm.STUB and vllm.PINNED_VLLM["commit"].startswith("003df29")
        assert os.path.abspath(vllm.__file__).startswith(os.path.abspath(STUB_DIR))


@pytest.mark.skipif(not REAL_VLLM, reason="SKIP: vLLM is not installed here (no GPU stack, "
                    "no network installs); run on a machine with vLLM to compare the stub")
def test_stub_matches_real_vllm():  # pragma: no cover - needs vLLM
    """Every SPEC entry; all drifts are reported together."""
    import vllm

    problems = []
    for module, qual, mode in SPEC:
        try:
            check(module, qual, mode)
        except Exception as e:  # AssertionError, ImportError, AttributeError
            problems.append(f"{module}.{qual} [{mode}]: {type(e).__name__}: {e}")
    assert not problems, (f"stub (vLLM @003df29) vs installed vLLM "
                          f"{getattr(vllm, '__version__', '?')}:\n" + "\n".join(problems))


@pytest.mark.skipif(not REAL_VLLM, reason="SKIP: vLLM is not installed here")
def test_real_parallel_config_fields():  # pragma: no cover - needs vLLM
    from vllm.config import ParallelConfig

    names = {f.name for f in dataclasses.fields(ParallelConfig)} | set(dir(ParallelConfig))
    assert set(PARALLEL_FIELDS) <= names
