"""PegaKVConnector as vLLM creates and calls it (through the stub's KVConnectorFactory with
kv_connector_module_path = "pegaflow.connector")."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest

from conftest import REAL_VLLM
from fakes import FakeEngineClient, FakeServer, HostDeviceAdapter, HostTensor

pytestmark = pytest.mark.skipif(REAL_VLLM, reason="SKIP: these drive the vLLM stub "
                                "(rank setters); a real vLLM is installed")


@pytest.fixture
def env(monkeypatch):
    import pegaflow.connector._facade as facade

    monkeypatch.setenv("PYTHONHASHSEED", "0")
    srv = FakeServer()
    monkeypatch.setattr(facade, "_make_client", lambda ctx, ep: FakeEngineClient(srv))
    monkeypatch.setattr(facade, "_device_adapter_for",
                        lambda t, client: HostDeviceAdapter(getattr(t, "dev", 0)))
    return srv


class _Req:
    def __init__(self, rid):
        self.request_id = rid


def _spec(kind):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    bs = 16
    if isinstance(kind, tuple):
        kind, bs = kind
    if kind == "full":
        return FullAttentionSpec(block_size=bs, num_kv_heads=2, head_size=8, dtype="uint16")
    if kind == "mamba":
        return MambaSpec(block_size=bs, shapes=((4, 8), (2, 8, 8)), dtypes=("uint16",) * 2,
                         mamba_cache_mode="align")
    return kind


def make(role, extra=None, tp=1, rank=0, groups=1, kv_lora_rank=None, engine_id="eng",
         no_hma=True, dcp=1, pcp=1, policy="recompute", hash_algo="sha256", specs=None,
         num_blocks=8):
    from types import SimpleNamespace

    from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.distributed import parallel_state
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    cfg = VllmConfig(
        model_config=ModelConfig(hf_text_config=SimpleNamespace(kv_lora_rank=kv_lora_rank)),
        cache_config=CacheConfig(block_size=16, prefix_caching_hash_algo=hash_algo),
        parallel_config=ParallelConfig(tensor_parallel_size=tp,
                                       decode_context_parallel_size=dcp,
                                       prefill_context_parallel_size=pcp),
        scheduler_config=SchedulerConfig(disable_hybrid_kv_cache_manager=no_hma),
        kv_transfer_config=KVTransferConfig(kv_connector="PegaKVConnector", kv_role="kv_both",
                                            kv_connector_module_path="pegaflow.connector",
                                            engine_id=engine_id,
                                            kv_load_failure_policy=policy,
                                            kv_connector_extra_config=extra or {}))
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="uint16")
    if specs is not None:
        gspecs = [KVCacheGroupSpec([f"l{g}"], _spec(k)) for g, k in enumerate(specs)]
    else:
        gspecs = [KVCacheGroupSpec([f"l{g}"], spec) for g in range(groups)]
    kcc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=gspecs)
    parallel_state.set_ranks(rank, 0, 0)
    try:
        r = KVConnectorRole.SCHEDULER if role == "s" else KVConnectorRole.WORKER
        return KVConnectorFactory.create_connector(cfg, r, kcc)
    finally:
        parallel_state.set_ranks(0, 0, 0)


def test_both_roles_are_created_by_module_path(env):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    s = make("s")
    w = make("w")
    assert s.role == KVConnectorRole.SCHEDULER and w.role == KVConnectorRole.WORKER
    assert type(s).__module__ == "pegaflow.connector._facade"
    assert s._scheduler is not None and s._worker is None
    assert w._worker is not None and w._scheduler is None
    assert env.count("session_open") == 1  # the scheduler process holds the Session
    assert s._ctx.instance_id == w._ctx.instance_id == "eng"
    assert s._ctx.namespace == w._ctx.namespace
    s.shutdown()
    w.shutdown()


def test_properties_and_defaults(env, monkeypatch):
    s = make("s")
    assert s.prefer_cross_layer_blocks and not s.requires_kv_delivery
    assert s.get_finished_count() is None and tuple(s.take_events()) == ()
    assert type(s).get_required_kvcache_layout(None) is None
    assert not type(s).requires_piecewise_for_cudagraph({})
    assert s.get_finished(set()) == (None, None)  # worker hooks are inert on the scheduler
    assert s.get_block_ids_with_load_errors() == set()
    monkeypatch.setenv("PEGAFLOW_CROSS_LAYER_BLOCKS", "0")
    assert not make("s").prefer_cross_layer_blocks
    monkeypatch.delenv("PEGAFLOW_CROSS_LAYER_BLOCKS")
    assert not make("s", kv_lora_rank=512).prefer_cross_layer_blocks


def test_hybrid_groups_that_cannot_be_stored_are_refused(env):
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    sw = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="uint16",
                           sliding_window=64)
    with pytest.raises(ValueError, match="SlidingWindowSpec.*not supported"):
        make("s", no_hma=False, specs=["full", sw])
    with pytest.raises(ValueError, match="needs a full-attention"):
        make("s", no_hma=False, specs=["mamba", "mamba"])
    with pytest.raises(ValueError, match="different block sizes"):
        make("s", no_hma=False, specs=["full", ("mamba", 32)])
    from vllm.v1.kv_cache_interface import MambaSpec

    none = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=("uint16",))  # main's default
    with pytest.raises(ValueError, match="mamba_cache_mode='none'"):
        make("s", no_hma=False, specs=["full", none])
    every = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=("uint16",),
                      mamba_cache_mode="all")
    s = make("s", no_hma=False, specs=["full", every])
    assert [g.kind for g in s._ctx.groups] == ["full", "full"]  # every block needed
    s.shutdown()


def test_supports_hma_keeps_vllms_hybrid_manager(env):
    from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma

    s = make("s", no_hma=False, specs=["mamba", "full"])
    assert supports_hma(s)
    ctx = s._ctx
    assert ctx.hybrid and ctx.prefix_group_index == 1  # the attention group is storage 0
    assert [(g.vllm_index, g.storage_id, g.kind) for g in ctx.groups] == \
        [(0, 1, "state"), (1, 0, "full")]
    assert not s.prefer_cross_layer_blocks  # per-layer: layers carry their group
    s.bind_gpu_block_pool("pool")
    assert s._scheduler.block_pool == "pool"
    assert s.request_finished_all_groups(_Req("x"), ([1], [2])) == (False, None)
    s.shutdown()


def test_bad_option_fails_startup(env):
    with pytest.raises(ValueError, match="pegaflow.mode"):
        make("s", extra={"pegaflow.mode": "bogus"})


def test_metadata_roundtrip_and_preemption_shapes(env):
    from vllm.v1.core.sched.output import SchedulerOutput

    s = make("s")
    w = make("w")
    w.register_kv_caches({"l0": HostTensor(np.zeros((2, 8, 16, 2, 8), np.uint16))})
    so = SchedulerOutput.make_empty()
    so.preempted_req_ids = {"x"}
    meta = s.build_connector_meta(so)
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

    assert isinstance(meta, KVConnectorMetadata) and meta.preempted_req_ids == {"x"}
    meta2 = pickle.loads(pickle.dumps(meta))
    w.bind_connector_metadata(meta2)
    assert w.has_connector_metadata()
    w.handle_preemptions(meta2)      # newer vLLM: the metadata
    w.handle_preemptions({"x"})      # vLLM <= ~0.18: a set of ids
    w.start_load_kv(None)
    w.wait_for_layer_load("l0")
    w.save_kv_layer("l0", None, None)
    w.wait_for_save()
    assert w.get_finished(set()) == (None, None)
    w.clear_connector_metadata()
    with pytest.raises(AssertionError):
        w.start_load_kv(None)  # vLLM binds metadata before every forward
    w.shutdown()
    s.shutdown()


@pytest.mark.parametrize("algo,fixed_default,warns", [
    ("sha256", True, False),       # vLLM main: fixed default seed, reproducible
    ("sha256_cbor", True, False),
    ("xxhash", True, True),        # main keeps a random seed for non-cryptographic hashes
    ("sha256", False, True),       # releases before the fixed default: random per launch
])
def test_pythonhashseed_warning(env, monkeypatch, caplog, algo, fixed_default, warns):
    from vllm.v1.core import kv_cache_utils

    monkeypatch.delenv("PYTHONHASHSEED")
    if not fixed_default:
        monkeypatch.delattr(kv_cache_utils, "DEFAULT_NONE_HASH_SEED")
    with caplog.at_level(logging.WARNING, logger="pegaflow.connector"):
        make("s", hash_algo=algo).shutdown()
    assert ("PYTHONHASHSEED is not set" in caplog.text) == warns
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pegaflow.connector"):
        make("s", hash_algo=algo).shutdown()
    assert "PYTHONHASHSEED" not in caplog.text


def test_load_failure_policy_fail_warns_once(env, monkeypatch, caplog):
    """vLLM's default kv_load_failure_policy is "fail": every PegaFlow load failure
    would fail the user's request. The scheduler warns once, naming the setting."""
    import pegaflow.connector._facade as facade

    monkeypatch.setattr(facade, "_POLICY_WARNED", False)
    with caplog.at_level(logging.WARNING, logger="pegaflow.connector"):
        make("s", policy="recompute").shutdown()
        assert "kv_load_failure_policy" not in caplog.text
        make("w", policy="fail").shutdown()  # workers do not warn (one line, not TP+1)
        assert "kv_load_failure_policy" not in caplog.text
        make("s", policy="fail").shutdown()
        make("s", policy="fail").shutdown()
    assert caplog.text.count('kv_load_failure_policy is "fail"') == 1
    assert '"kv_load_failure_policy": "recompute"' in caplog.text


def test_module_path_is_loaded_before_the_registry(env):
    """vLLM main imports kv_connector_module_path first: a registered name of another
    connector does not shadow ours."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    KVConnectorFactory._registry.pop("PegaKVConnector", None)
    KVConnectorFactory.register_connector("PegaKVConnector", "collections", "OrderedDict")
    try:
        s = make("s")
        assert type(s).__module__ == "pegaflow.connector._facade"
        s.shutdown()
    finally:
        KVConnectorFactory._registry.pop("PegaKVConnector", None)


def test_main_refuses_two_argument_connectors_and_ours_has_three():
    """The stub's factory (like vLLM main) raises ValueError for an external class
    without kv_cache_config; PegaKVConnector passes it on to the base class."""
    import inspect
    import types

    from vllm.config import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

    from pegaflow.connector import PegaKVConnector

    mod = types.ModuleType("pf_two_arg_mod")

    class Old(KVConnectorBase_V1):
        def __init__(self, vllm_config, role):
            pass

    mod.Old = Old
    import sys

    sys.modules["pf_two_arg_mod"] = mod
    try:
        with pytest.raises(ValueError, match="2-argument constructor"):
            KVConnectorFactory.get_connector_class(KVTransferConfig(
                kv_connector="Old", kv_role="kv_both", kv_connector_module_path="pf_two_arg_mod"))
    finally:
        del sys.modules["pf_two_arg_mod"]
    assert "kv_cache_config" in inspect.signature(PegaKVConnector.__init__).parameters


@pytest.mark.parametrize("dcp,pcp", [(1, 2), (2, 2), (2, 1)])
def test_hash_block_size_comes_from_vllm(env, monkeypatch, dcp, pcp):
    """One cache group: vLLM main hashes every block_size * dcp tokens (PCP excluded,
    resolve_kv_cache_block_sizes); releases without that helper hashed block_size * dcp
    * pcp. The connector asks vLLM, and falls back only where it is absent."""
    from vllm.v1.core import kv_cache_utils

    s = make("s", dcp=dcp, pcp=pcp)
    assert s._ctx.virtual_block_size == 16 * dcp
    s.shutdown()
    monkeypatch.delattr(kv_cache_utils, "resolve_kv_cache_block_sizes")
    old = make("s", dcp=dcp, pcp=pcp)
    assert old._ctx.virtual_block_size == 16 * dcp * pcp
    old.shutdown()


def test_pcp_hits_are_counted_in_hash_blocks(env):
    """With PCP 2 on main, a 2-block hit is 2 x 16 tokens, not 2 x 32."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    req = Request("r", list(range(40)), SamplingParams(max_tokens=4), None,
                  block_hasher=get_request_block_hasher(16, sha256))
    assert len(req.block_hashes) == 2
    from pegaflow.client.engine import QueryResult

    asked = []

    def query(instance_id, req_id, hashes, wait_for_full_prefix=False, group_id=0):
        asked.append(list(hashes))
        return QueryResult(False, len(hashes), b"L" * 16)

    env.query = query  # every block asked for is a hit
    s = make("s", pcp=2)
    n, is_async = s.get_num_new_matched_tokens(req, 0)
    assert asked == [list(req.block_hashes)]
    assert (n, is_async) == (32, True)  # (64 clamped to 39 with 32-token blocks)
    s.shutdown()


def test_namespace_describes_the_registered_layout(env, monkeypatch):
    """The cross-layer namespace factor follows what was registered: per-layer tensors
    (vLLM fell back, or a base class without the cross-layer hooks) register under the
    per-layer namespace, cross-layer under the cross-layer one."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import base

    from pegaflow.connector import config as cfg

    s = make("s")
    ns_cross, ns_layers = s._ctx.namespace_cross_layer, s._ctx.namespace_per_layer
    assert ns_cross != ns_layers and s._ctx.namespace == ns_cross
    s.shutdown()
    tensor = HostTensor(np.zeros((2, 8, 16, 2, 8), np.uint16))
    w = make("w", engine_id="per-layer")  # prefers cross-layer, vLLM gives per-layer
    assert w.prefer_cross_layer_blocks
    w.register_kv_caches({"l0": tensor})
    assert env.instances["per-layer"].namespace == ns_layers == w._worker.namespace
    w.shutdown()
    w = make("w", engine_id="cross")
    w.register_cross_layers_kv_cache(HostTensor(np.zeros((8, 1, 2, 16, 2, 8), np.uint16)))
    assert env.instances["cross"].namespace == ns_cross
    w.shutdown()
    # A vLLM base without the hooks (seen on the restructuring branch): never cross-layer.
    monkeypatch.delattr(base.KVConnectorBase_V1, "register_cross_layers_kv_cache")
    s = make("s")
    assert not s.prefer_cross_layer_blocks and s._ctx.namespace == ns_layers
    s.shutdown()
    assert ns_layers == cfg.derive_namespace(cfg.namespace_factors(
        s._vllm_config, 1, 1, 1, False))


@pytest.mark.parametrize("key", ["pegaflow.pd_tail_save", "pegaflow.pd_tail_load"])
def test_pd_tail_options_are_refused_not_ignored(env, key):
    with pytest.raises(ValueError, match=f"{key}.*not implemented"):
        make("s", extra={key: True})
    make("s", extra={key: False}).shutdown()  # explicitly off is fine


def test_transfer_backend_is_per_instance(env):
    """Two connectors in one process (e.g. under MultiConnector, or two engines) keep
    their own transfer_backend: each registration carries its own mode."""
    t = lambda: HostTensor(np.zeros((2, 8, 16, 2, 8), np.uint16))
    a = make("w", engine_id="a", extra={"pegaflow.transfer_backend": "kernel"})
    b = make("w", engine_id="b", extra={"pegaflow.transfer_backend": "direct"})
    a.register_kv_caches({"l0": t()})
    b.register_kv_caches({"l0": t()})
    modes = {kw["args"].instance_id: kw["args"].transfer_mode
             for m, kw in env.calls if m == "register"}
    assert modes == {"a": 1, "b": 0}
    a.shutdown()
    b.shutdown()


def test_vllm_plugin_registers_by_name(env):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    import pegaflow.vllm_plugin as plugin

    KVConnectorFactory._registry.pop("PegaKVConnector", None)
    plugin.register()
    plugin.register()  # idempotent
    assert "PegaKVConnector" in KVConnectorFactory._registry
    assert KVConnectorFactory._registry["PegaKVConnector"]().__name__ == "PegaKVConnector"
    KVConnectorFactory._registry.pop("PegaKVConnector", None)


def test_stats_objects_follow_vllms_contract(env):
    """Idle sides report None (an empty object would make vLLM's KVConnectorOutput
    non-empty); the stats class subclasses vLLM's, pickles, aggregates and reduces;
    observation lists are capped."""
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

    from pegaflow.connector import PegaKVConnector
    from pegaflow.connector import stats as pstats

    s, w = make("s"), make("w")
    assert s.get_kv_connector_stats() is None and w.get_kv_connector_stats() is None
    s._scheduler.recorder.add("hit_tokens_ram", 32)
    got = s.get_kv_connector_stats()
    assert isinstance(got, KVConnectorStats) and got.data == {"hit_tokens_ram": 32}
    assert s.get_kv_connector_stats() is None  # taken: reported once
    other = PegaKVConnector.build_kv_connector_stats({"load_success": 1,
                                                      "load_duration_s": [0.5]})
    both = pickle.loads(pickle.dumps(got)).aggregate(other)
    assert both.data == {"hit_tokens_ram": 32, "load_success": 1, "load_duration_s": [0.5]}
    assert not both.is_empty() and PegaKVConnector.build_kv_connector_stats().is_empty()
    assert both.reduce()["pega_load_avg_ms"] == 500.0
    big = pstats.aggregate({"save_duration_s": [0.0] * pstats.MAX_OBSERVATIONS},
                           {"save_duration_s": [1.0] * 3})
    assert len(big["save_duration_s"]) == pstats.MAX_OBSERVATIONS
    assert big["dropped_observations"] == 3
    s.shutdown()
    w.shutdown()


def test_router_events_use_vllms_hash_form_and_fit_older_event_classes(monkeypatch):
    """Hashes converted as vLLM converts its own (int64 with
    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES); fields an older BlockStored lacks (medium,
    lora_name, ownership before ~0.11) are dropped rather than failing."""
    from vllm.distributed import kv_events

    import pegaflow.connector._facade as facade

    h, p = b"\x01" * 32, b"\x02" * 32
    rec = [("stored", h, p, [1, 2], 16, None, None), ("removed", h)]
    st, rm = facade._router_events(rec)
    assert st.block_hashes == [h] and st.parent_block_hash == p and st.medium == "CPU"
    assert st.ownership == "pegaflow" and rm.block_hashes == [h] and rm.medium == "CPU"
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    st, _ = facade._router_events(rec)
    assert st.block_hashes == [int.from_bytes(h, "big") & (2**64 - 1)]

    class OldBlockStored:  # msgspec-style: fields listed in __struct_fields__
        __struct_fields__ = ("block_hashes", "parent_block_hash", "token_ids",
                             "block_size", "lora_id")

        def __init__(self, **kw):
            assert set(kw) == set(self.__struct_fields__)
            self.__dict__.update(kw)

    monkeypatch.setattr(kv_events, "BlockStored", OldBlockStored)
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES")
    (old,) = facade._router_events(rec[:1])
    assert old.block_hashes == [h] and old.token_ids == [1, 2] and old.block_size == 16


def test_hybrid_worker_registers_each_layer_with_its_storage_group(env):
    from modelkit import ATT, MAM, FakeB, hybrid_caches

    from modelkit import N

    w = make("w", no_hma=False, specs=["mamba", "full"], num_blocks=N)
    kv, _, _ = hybrid_caches(FakeB())
    w.register_kv_caches({"l0": kv[MAM], "l1": kv[ATT]})  # vLLM: a list per state layer
    args = [c[1]["args"] for c in env.calls if c[0] == "register"][0]
    assert [(l.name, l.group_id, l.segments, l.bytes_per_block) for l in args.layers] == \
        [("l0", 1, 1, 1024), ("l1", 0, 1, 1024)]
    assert not args.page_first
    assert w._worker.group_layers == {1: ["l0"], 0: ["l1"]}
    w.shutdown()


def test_mla_worker_registers_page_first(env):
    w = make("w", kv_lora_rank=512, tp=2, rank=1)
    w.register_kv_caches({"l0": HostTensor(np.zeros((8, 16, 72), np.uint16), 1)})
    args = [c[1]["args"] for c in env.calls if c[0] == "register"][0]
    assert args.page_first and (args.tp_rank, args.tp_size, args.world_size) == (0, 1, 2)
    assert w._ctx.stripe_saves and w._ctx.transfer_mode == 1
    w.shutdown()


def test_tp_shard_workers_talk_to_their_shards_server(monkeypatch):
    import pegaflow.connector._facade as facade

    srvs = {"h0:1": FakeServer(), "h1:1": FakeServer()}
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    monkeypatch.setattr(facade, "_make_client", lambda ctx, ep: FakeEngineClient(srvs[ep]))
    monkeypatch.setattr(facade, "_device_adapter_for",
                        lambda t, client: HostDeviceAdapter(getattr(t, "dev", 0)))
    extra = {"pegaflow.tp_shard_endpoints": ["h0:1", "h1:1"]}
    s = make("s", extra=extra, tp=4)
    assert [x.count("session_open") for x in srvs.values()] == [1, 1]
    assert len(s._scheduler.clients) == 2
    w = make("w", extra=extra, tp=4, rank=3)
    w.register_kv_caches({"l0": HostTensor(np.zeros((2, 8, 16, 2, 8), np.uint16), 3)})
    assert not srvs["h0:1"].instances and srvs["h1:1"].instances["eng"].world_size == 2
    assert srvs["h1:1"].instances["eng"].namespace.endswith(":tp-shard-1-of-2")
    s.shutdown()
    w.shutdown()
