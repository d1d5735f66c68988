"""Saves are ordered after the forward pass by a CUDA event recorded where vLLM issues them
(wait_for_save, as the forward context exits), not by a device-wide synchronize: the save
waits for the kernels queued before it and for nothing queued after it.

Everything runs against tests/python/faketorch.py (streams and events with CUDA's
semantics; kernels run only when the test says so) and the FakeServer, which opens the
CUDA IpcTensor into the fake GPU's memory like the server's cuda backend and copies the
blocks when the Save arrives — so a save issued before the forward kernel ran would store
zeros, and a byte comparison catches it."""

from __future__ import annotations

import numpy as np
import pytest

import faketorch
from fakes import FakeClock, FakeEngineClient, FakeServer
from pegaflow.connector.config import ConnectorContext
from pegaflow.connector.plan import SaveIntent, StepPlan
from pegaflow.connector.worker import WorkerConnector
from pegaflow.device import cuda

BS, N, H, D = 4, 16, 2, 8
LAYERS = ["l0", "l1"]


def h(i: int) -> bytes:
    return bytes([i]) * 32


@pytest.fixture
def rig(lib, monkeypatch, request):
    """(fake GPU, fake torch, FakeServer, registered WorkerConnector with a save thread,
    KV caches); an indirect parameter (a dict) passes ConnectorContext options."""
    if not lib.has("pf_client_ipc_cuda"):
        pytest.fail("libpegaflow lacks pf_client_ipc_cuda")
    g = faketorch.FakeGPU(0, handle_version=3)
    torch = faketorch.install(monkeypatch, [g])
    clock = FakeClock()
    server = FakeServer(clock)
    server.ipc_open = lambda ipc: faketorch.server_open(ipc, [g])
    client = FakeEngineClient(server)
    dev = cuda.CudaDeviceAdapter(lib, 0)
    ctx = ConnectorContext("inst", "ns", BS, **getattr(request, "param", {}))
    w = WorkerConnector(ctx, client, dev, clock=clock, save_thread=True)
    torch.zeros((1000,), "uint8")  # the KV caches do not start their segment
    kv = {n: torch.zeros((2, N, BS, H, D), "uint16") for n in LAYERS}
    w.register_kv_caches(kv)
    yield g, torch, server, w, kv
    g.run_all()  # let anything a broken ordering still waits for finish
    w.shutdown(unregister=False)


def _stored(server, hashes):
    return {k: v for k, v in server.blocks.items() if k[1] in hashes}


def test_fence_is_complete_only_after_the_work_before_it(rig):
    g, torch, _, w, kv = rig
    torch.cuda.launch(lambda: None)  # the forward pass
    fence = w.device.save_fence()
    torch.cuda.launch(lambda: None)  # the next step
    assert not fence.wait(0)
    assert g.run(n=1) == 1
    assert fence.wait(0)  # the next step's kernel is still queued
    assert g.default_stream.pending == 1


def test_save_waits_for_the_forward_pass_and_not_for_later_work(rig):
    g, torch, server, w, kv = rig
    rng = np.random.default_rng(22)
    data = {n: rng.integers(0, 1 << 16, (2, 2, BS, H, D), dtype=np.uint16) for n in LAYERS}

    def forward():  # the attention kernels writing blocks 3 and 9
        for n in LAYERS:
            kv[n].numpy()[:, [3, 9]] = data[n]

    torch.cuda.launch(forward)
    w.wait_for_save(StepPlan(saves={"a": SaveIntent((3, 9), (h(1), h(2)))}))
    # the next step is already queued behind the forward pass, and does not finish
    torch.cuda.launch(lambda: None)
    # the save thread is waiting on the event (and has not sent the Save)
    g.wait(lambda: g.event_waits >= 1, "waiting for the save thread to wait on its event")
    assert not [c for c in server.calls if c[0] == "save"]
    assert g.run(n=1) == 1  # only the forward pass completes
    # a device-wide synchronize would wait for the next step's kernel: never here
    assert w.wait_saves_idle(10), "the save still waits for work queued after its fence"
    assert w.stats["saves"] == 1 and w.stats["save_failures"] == 0
    assert g.full_syncs == 0 and g.default_stream.pending == 1
    # the stored blocks are the forward pass's bytes, block by block
    stored = _stored(server, {h(1), h(2)})
    assert len(stored) == 2
    for b, hh in ((0, h(1)), (1, h(2))):
        (slots,) = [v for k, v in stored.items() if k[1] == hh]
        for n in LAYERS:
            want = b"".join(data[n][s, b].tobytes() for s in range(2))
            assert slots[(n, 0)] == want


@pytest.mark.parametrize("rig", [{"rpc_timeout_ms": 50}], indirect=True)
def test_save_times_out_when_the_forward_pass_never_finishes(rig):
    g, torch, server, w, kv = rig
    torch.cuda.launch(lambda: None)  # never run before the deadline
    w.wait_for_save(StepPlan(saves={"a": SaveIntent((3,), (h(5),))}))
    assert w.wait_saves_idle(10)
    assert w.stats["save_failures"] == 1 and w.stats["saves"] == 0
    assert not _stored(server, {h(5)})
    assert w.get_finished({"a"}) == ({"a"}, None)  # the request still completes


def test_facade_orders_the_save_after_vllms_forward_pass(lib, monkeypatch):
    """vLLM's path: the connector made by the stub's factory, its own device adapter for a
    (fake) torch CUDA tensor, wait_for_save called as the forward context exits."""
    from conftest import REAL_VLLM

    if REAL_VLLM:
        pytest.skip("SKIP: drives the vLLM stub; a real vLLM is installed")
    import pegaflow.connector._facade as facade
    from pegaflow.connector._facade import PegaConnectorMetadata
    from test_facade import make

    if not lib.has("pf_client_ipc_cuda"):
        pytest.fail("libpegaflow lacks pf_client_ipc_cuda")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    monkeypatch.setenv("PEGAFLOW_LIB", lib.path)  # the adapter loads it (no client.lib)
    g = faketorch.FakeGPU(0, handle_version=2)
    torch = faketorch.install(monkeypatch, [g])
    srv = FakeServer()
    srv.ipc_open = lambda ipc: faketorch.server_open(ipc, [g])
    monkeypatch.setattr(facade, "_make_client", lambda ctx, ep: FakeEngineClient(srv))
    w = make("w")
    try:
        kv = torch.zeros((2, 8, 16, 2, 8), "uint16")
        w.register_kv_caches({"l0": kv})
        assert w._worker.device.kind == "cuda"  # the facade chose CudaDeviceAdapter
        data = np.random.default_rng(7).integers(0, 1 << 16, (2, 16, 2, 8), dtype=np.uint16)
        torch.cuda.launch(lambda: kv.numpy().__setitem__((slice(None), 5), data))
        w.bind_connector_metadata(PegaConnectorMetadata(
            StepPlan(saves={"r": SaveIntent((5,), (h(8),))})))
        w.wait_for_save()
        w.clear_connector_metadata()
        torch.cuda.launch(lambda: None)  # the next step's forward pass
        g.wait(lambda: g.event_waits >= 1, "waiting for the save thread to wait on its event")
        assert not [c for c in srv.calls if c[0] == "save"]
        g.run(n=1)
        assert w._worker.wait_saves_idle(10)
        (slots,) = [v for k, v in srv.blocks.items() if k[1] == h(8)]
        assert slots[("l0", 0)] == data[0].tobytes() + data[1].tobytes()
        assert g.default_stream.pending == 1 and g.full_syncs == 0
    finally:
        g.run_all()
        w.shutdown()
