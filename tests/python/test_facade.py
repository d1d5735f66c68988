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


def make(role, extra=None, tp=1, rank=0, groups=1, kv_lora_rank=None, engine_id="eng",
         no_hma=True):
    from types import SimpleNamespace

    from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                             SchedulerConfig, VllmConfig)
    from vllm.distributed import parallel_state
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    cfg = VllmConfig(
        model_config=ModelConfig(hf_text_config=SimpleNamespace(kv_lora_rank=kv_lora_rank)),
        cache_config=CacheConfig(block_size=16),
        parallel_config=ParallelConfig(tensor_parallel_size=tp),
        scheduler_config=SchedulerConfig(disable_hybrid_kv_cache_manager=no_hma),
        kv_transfer_config=KVTransferConfig(kv_connector="PegaKVConnector", kv_role="kv_both",
                                            kv_connector_module_path="pegaflow.connector",
                                            engine_id=engine_id,
                                            kv_connector_extra_config=extra or {}))
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=8, dtype="uint16")
    kcc = KVCacheConfig(num_blocks=8, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{g}"], spec) for g in range(groups)])
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


def test_hybrid_models_are_refused(env):
    with pytest.raises(ValueError, match="one KV cache group"):
        make("s", groups=2)


def test_hma_must_be_off_because_supports_hma_is_not_declared(env):
    with pytest.raises(ValueError, match="does not support HMA"):
        make("s", no_hma=False)


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


def test_pythonhashseed_warning(env, monkeypatch, caplog):
    monkeypatch.delenv("PYTHONHASHSEED")
    with caplog.at_level(logging.WARNING, logger="pegaflow.connector"):
        make("s")
    assert "PYTHONHASHSEED is not set" in caplog.text


def test_vllm_plugin_registers_by_name(env):
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    import pegaflow.vllm_plugin as plugin

    KVConnectorFactory._registry.pop("PegaKVConnector", None)
    plugin.register()
    plugin.register()  # idempotent
    assert "PegaKVConnector" in KVConnectorFactory._registry
    assert KVConnectorFactory._registry["PegaKVConnector"]().__name__ == "PegaKVConnector"
    KVConnectorFactory._registry.pop("PegaKVConnector", None)
