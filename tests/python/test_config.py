"""Options, instance id and namespace derivation (reference §1.3, §2.9)."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest

from pegaflow.connector import config as cfg


def vcfg(**kw):
    mc = SimpleNamespace(model=kw.get("model", "Qwen/Qwen3-8B"), dtype=kw.get("dtype", "torch.bfloat16"),
                         hf_text_config=SimpleNamespace(kv_lora_rank=kw.get("kv_lora_rank")),
                         get_total_num_kv_heads=lambda: kw.get("heads", 8),
                         get_head_size=lambda: kw.get("head_size", 128),
                         get_total_num_hidden_layers=lambda: kw.get("layers", 36))
    pc = SimpleNamespace(tensor_parallel_size=kw.get("tp", 2), pipeline_parallel_size=kw.get("pp", 1),
                         world_size=kw.get("tp", 2) * kw.get("pp", 1),
                         data_parallel_size=kw.get("dp", 1),
                         data_parallel_rank_local=kw.get("dp_rank"),
                         decode_context_parallel_size=kw.get("dcp", 1),
                         prefill_context_parallel_size=kw.get("pcp", 1))
    ktc = SimpleNamespace(engine_id=kw.get("engine_id", "eng-1"),
                          kv_connector_extra_config=kw.get("extra", {}))
    return SimpleNamespace(model_config=mc, parallel_config=pc,
                           cache_config=SimpleNamespace(block_size=kw.get("block_size", 16),
                                                        cache_dtype=kw.get("cache_dtype", "auto")),
                           scheduler_config=SimpleNamespace(
                               disable_hybrid_kv_cache_manager=kw.get("no_hma", True)),
                           kv_transfer_config=ktc, additional_config=kw.get("additional", {}),
                           instance_id=kw.get("instance_id", ""))


# ------------------------------------------------------------------ options


def test_defaults():
    o = cfg.parse_options({}, env={})
    assert o.endpoint == "http://127.0.0.1:50055"
    assert o.mode == "read_write" and o.read_enabled
    assert o.transfer_backend is None and not o.wait_for_full_prefix
    assert o.cross_layer_blocks and o.load_timeout_s == 120
    assert o.query_timeout_ms == 2000 and o.rpc_timeout_ms == 30000


def test_extra_config_and_env_precedence():
    ktc = SimpleNamespace(kv_connector_extra_config={
        "pegaflow.host": "10.0.0.5", "pegaflow.port": "6000", "pegaflow.mode": "SAVE_ONLY",
        "pegaflow.transfer_backend": "kernel", "pegaflow.wait_for_full_prefix": "true",
        "pegaflow.query_timeout_ms": 50, "pegaflow.rpc_timeout_ms": "9000"})
    o = cfg.parse_options(ktc, env={})
    assert o.endpoint == "10.0.0.5:6000" and o.mode == "save_only" and not o.read_enabled
    assert o.transfer_backend == "kernel" and o.wait_for_full_prefix
    assert (o.query_timeout_ms, o.rpc_timeout_ms) == (50, 9000)
    o = cfg.parse_options(ktc, env={"PEGAFLOW_HOST": "http://h", "PEGAFLOW_PORT": "7"})
    assert o.endpoint == "http://h:7"


@pytest.mark.parametrize("extra,match", [
    ({"pegaflow.mode": "read_only"}, "pegaflow.mode"),
    ({"pegaflow.transfer_backend": "dma"}, "transfer_backend"),
    ({"pegaflow.port": "x"}, "integer"),
    ({"pegaflow.port": 70000}, "TCP port"),
    ({"pegaflow.wait_for_full_prefix": "maybe"}, "boolean"),
    ({"pegaflow.tp_shard_endpoints": ["a:1", "a:1"]}, "distinct"),
    ({"pegaflow.tp_shard_endpoints": ["a:1", "b"]}, "no port"),
    ({"pegaflow.tp_shard_endpoints": 5}, "list of endpoints"),
    ({"pegaflow.query_timeout_ms": 0}, ">= 1"),
])
def test_bad_options_fail_at_startup(extra, match):
    with pytest.raises(ValueError, match=match):
        cfg.parse_options(SimpleNamespace(kv_connector_extra_config=extra), env={})


def test_single_shard_endpoint_is_the_endpoint():
    o = cfg.parse_options(SimpleNamespace(kv_connector_extra_config={
        "pegaflow.tp_shard_endpoints": ["http://x:1"]}), env={})
    assert o.endpoint == "http://x:1"


@pytest.mark.parametrize("v,want", [(None, 120.0), ("45", 45.0), ("5", 30.0), ("bad", 120.0)])
def test_load_timeout_env(v, want):
    env = {} if v is None else {"PEGA_LOAD_TIMEOUT_SECONDS": v}
    assert cfg.parse_options({}, env=env).load_timeout_s == want


def test_cross_layer_env():
    assert not cfg.parse_options({}, env={"PEGAFLOW_CROSS_LAYER_BLOCKS": "0"}).cross_layer_blocks


# ------------------------------------------------------------------ identity


def test_instance_id_is_engine_id():
    assert cfg.resolve_instance_id(vcfg(engine_id="abc_dp1"), env={}) == "abc_dp1"


def test_instance_id_fallbacks_and_dp_suffix():
    v = vcfg(engine_id=None, instance_id="vllm-iid", dp=2, dp_rank=1)
    assert cfg.resolve_instance_id(v, env={"PEGAFLOW_INSTANCE_ID": "envid"}) == "vllm-iid_dp1"
    v = vcfg(engine_id=None, dp=1)
    assert cfg.resolve_instance_id(v, env={"PEGAFLOW_INSTANCE_ID": "envid"}) == "envid"
    gen = cfg.resolve_instance_id(v, env={})
    assert len(gen) == 32 and gen != cfg.resolve_instance_id(v, env={})


def test_namespace_golden_value():
    """Regression guard of the exact string hashed: str(sorted(factors.items()))."""
    f = cfg.namespace_factors(vcfg(), tp_size=2, dcp_world_size=1, pcp_world_size=1,
                              cross_layer_blocks=True)
    assert str(sorted(f.items())) == (
        "[('cache_dtype', 'auto'), ('cross_layer_blocks', True), ('dcp_world_size', 1), "
        "('dtype', 'torch.bfloat16'), ('head_size', 128), ('is_hma_enabled', False), "
        "('mla_layer_split_kv_cache', False), ('model', 'Qwen/Qwen3-8B'), "
        "('num_hidden_layers', 36), ('num_kv_heads', 8), ('pcp_world_size', 1), "
        "('pp_size', 1), ('tp_size', 2)]")
    assert cfg.derive_namespace(f) == "07ec82d5"
    assert cfg.derive_namespace(f) == hashlib.sha256(str(sorted(f.items())).encode()).hexdigest()[:8]


@pytest.mark.parametrize("change", [
    dict(model="other"), dict(dtype="torch.float16"), dict(pp=2), dict(heads=4),
    dict(head_size=64), dict(layers=35), dict(cache_dtype="fp8"), dict(no_hma=False),
    dict(additional={"mla_layer_split_kv_cache": True}),
])
def test_each_factor_isolates(change):
    base = cfg.derive_namespace(cfg.namespace_factors(vcfg(), 2, 1, 1, True))
    other = cfg.derive_namespace(cfg.namespace_factors(vcfg(**change), 2, 1, 1, True))
    assert base != other


def test_parallel_factors_isolate_and_block_size_does_not():
    ns = lambda **k: cfg.derive_namespace(cfg.namespace_factors(
        vcfg(block_size=k.pop("bs", 16)), k.get("tp", 2), k.get("dcp", 1), k.get("pcp", 1),
        k.get("cross", True)))
    base = ns()
    assert ns(tp=4) != base and ns(dcp=2) != base and ns(pcp=2) != base
    assert ns(cross=False) != base
    assert ns(bs=32) == base  # different block sizes produce different keys anyway


def test_context_for_dense_and_mla():
    o = cfg.parse_options({}, env={})
    c = cfg.build_context(vcfg(tp=4), o, tp_rank=3, pp_rank=0, env={})
    assert (c.tp_rank, c.tp_size, c.world_size) == (3, 4, 4)
    assert not c.is_mla and c.transfer_mode == 0 and not c.skip_save
    assert c.virtual_block_size == 16 and c.instance_id == "eng-1"
    m = cfg.build_context(vcfg(tp=4, kv_lora_rank=512), o, tp_rank=3, env={})
    assert m.is_mla and m.collapse_mla_tp and (m.tp_rank, m.tp_size) == (0, 1)
    # page-first replicas (one group, no DCP, no PP): rank 3 of 4 stripes its saves
    assert m.world_size == 4 and m.transfer_mode == 1 and not m.skip_save
    assert m.page_first and m.stripe_saves and (m.local_rank, m.local_size) == (3, 4)
    pp = cfg.build_context(vcfg(tp=4, pp=2, kv_lora_rank=512), o, tp_rank=3, env={})
    assert not pp.page_first and pp.skip_save  # PP: not page-first, rank 0 copies
    assert m.namespace != c.namespace
    d = cfg.build_context(vcfg(tp=4, kv_lora_rank=512, dcp=2), o, tp_rank=3, dcp_rank=1, env={})
    assert (d.tp_rank, d.tp_size) == (1, 2) and not d.skip_save
    assert d.virtual_block_size == 32
    h = cfg.build_context(vcfg(tp=4, kv_lora_rank=512), o, num_cache_groups=2, tp_rank=3, env={})
    assert not h.collapse_mla_tp and (h.tp_rank, h.tp_size) == (3, 4)


def test_scheduler_and_workers_agree_on_identity():
    o = cfg.parse_options({}, env={})
    s = cfg.build_context(vcfg(tp=2), o, env={})
    w = cfg.build_context(vcfg(tp=2), o, tp_rank=1, env={})
    assert (s.instance_id, s.namespace, s.tp_size, s.world_size) == \
        (w.instance_id, w.namespace, w.tp_size, w.world_size)


def test_cross_layer_name_with_pp():
    c = cfg.ConnectorContext("i", "n", 16, pp_rank=1, pp_size=2)
    assert c.cross_layer_name == "ALL_LAYERS_pp1"
    assert cfg.ConnectorContext("i", "n", 16).cross_layer_name == "ALL_LAYERS"


def test_unix_socket_host_is_the_endpoint():
    o = cfg.parse_options({"pegaflow.host": "unix:/run/pegaflow.sock"}, env={})
    assert o.endpoint == "unix:/run/pegaflow.sock"
    o = cfg.parse_options({}, env={"PEGAFLOW_HOST": "unix:/tmp/p.sock", "PEGAFLOW_PORT": "1"})
    assert o.endpoint == "unix:/tmp/p.sock"
    with pytest.raises(ValueError, match="socket path"):
        cfg.parse_options({"pegaflow.host": "unix:"}, env={})


def test_tp_shards_split_ranks_into_local_topologies():
    o = cfg.parse_options({"pegaflow.tp_shard_endpoints": ["http://h0:1", "h1:2"]}, env={})
    assert o.endpoints == ("http://h0:1", "h1:2")
    base = cfg.build_context(vcfg(tp=4), cfg.parse_options({}, env={}), env={})
    ctxs = [cfg.build_context(vcfg(tp=4), o, tp_rank=r, env={}) for r in range(4)]
    assert [(c.shard_index, c.tp_rank, c.tp_size, c.world_size) for c in ctxs] == \
        [(0, 0, 2, 2), (0, 1, 2, 2), (1, 0, 2, 2), (1, 1, 2, 2)]
    # the factor tp_size is the shard-local size, then the shard suffix
    local = cfg.derive_namespace(cfg.namespace_factors(vcfg(tp=4), 2, 1, 1, True))
    assert ctxs[0].namespace == f"{local}:tp-shard-0-of-2"
    assert ctxs[3].namespace == f"{local}:tp-shard-1-of-2" != base.namespace
    assert ctxs[0].namespace_of_shard(1) == ctxs[3].namespace
    assert ctxs[3].namespace_for(False).endswith(":tp-shard-1-of-2")
    # one endpoint in the list is just the endpoint
    one = cfg.parse_options({"pegaflow.tp_shard_endpoints": ["h:7"]}, env={})
    assert one.endpoints == ("h:7",) and not one.shard_endpoints


@pytest.mark.parametrize("kw,match", [
    (dict(tp=4, pp=2), "TP-only"),
    (dict(tp=3), "divisible"),
    (dict(tp=4, dcp=2), "TP-only"),
])
def test_tp_shards_need_tp_only_parallelism(kw, match):
    o = cfg.parse_options({"pegaflow.tp_shard_endpoints": ["a:1", "b:1"]}, env={})
    with pytest.raises(ValueError, match=match):
        cfg.build_context(vcfg(**kw), o, env={})


def test_mla_layer_split_needs_page_first():
    o = cfg.parse_options({}, env={})
    v = vcfg(tp=2, kv_lora_rank=512)
    v.additional_config = {"mla_layer_split_kv_cache": True}
    c = cfg.build_context(v, o, tp_rank=1, env={})
    assert c.page_first and c.mla_layer_split and not c.stripe_saves and not c.skip_save
    v2 = vcfg(tp=2, pp=2, kv_lora_rank=512)
    v2.additional_config = {"mla_layer_split_kv_cache": True}
    with pytest.raises(ValueError, match="page-first"):
        cfg.build_context(v2, o, env={})
