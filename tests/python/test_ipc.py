"""IpcTensor bytes: the C builders (pf_client_ipc_cuda / pf_client_ipc_sim /
pf_simkv_ipc) produce the message of proto/engine.proto, and the sim adapter exports
exactly what pf_client_ipc_sim builds for the same memory. An independent proto3 encoder
written here is the oracle. The CUDA adapter is checked against torch-format share tuples
(versions 2 and 3, types 'c' and 'e', the unversioned 64-byte form, wrong lengths and
unknown versions) and against tests/python/faketorch.py, a fake torch that follows
torch's byte layout."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from pegaflow.device import cuda


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(num: int, wire: int) -> bytes:
    return _varint(num << 3 | wire)


def encode_ipc_tensor(kind: int, device_uuid: bytes = b"", handle: bytes = b"",
                      shm_name: str = "", offset: int = 0, size: int = 0,
                      sim_device: int = 0) -> bytes:
    """proto3 IpcTensor, fields in number order, defaults omitted."""
    out = b""
    if kind:
        out += _field(1, 0) + _varint(kind)
    for num, val in ((2, device_uuid), (3, handle), (4, shm_name.encode())):
        if val:
            out += _field(num, 2) + _varint(len(val)) + val
    if offset:
        out += _field(5, 0) + _varint(offset)
    if size:
        out += _field(6, 0) + _varint(size)
    if sim_device:
        out += _field(7, 0) + _varint(sim_device & 0xFFFFFFFFFFFFFFFF)
    return out


def test_oracle_encoder_sanity():
    assert encode_ipc_tensor(2, shm_name="/x", offset=300, size=1) == \
        bytes([0x08, 2, 0x22, 2]) + b"/x" + bytes([0x28, 0xAC, 0x02, 0x30, 1])


def _need(lib, *fns):
    miss = [f for f in fns if not lib.has(f)]
    assert not miss, f"libpegaflow lacks {', '.join(miss)}"


def test_c_cuda_builder_matches_proto(lib):
    _need(lib, "pf_client_ipc_cuda")
    from pegaflow.client.engine import ipc_cuda

    u = uuid.UUID("12345678-9abc-def0-1234-56789abcdef0").bytes
    h = bytes(range(64))
    assert ipc_cuda(lib, u, h, 4096, 1 << 30) == encode_ipc_tensor(1, u, h, "", 4096, 1 << 30)


def test_c_sim_builders_match_proto_and_each_other(lib):
    _need(lib, "pf_client_ipc_sim", "pf_simkv_create", "pf_simkv_ipc", "pf_simkv_name")
    from pegaflow.client.engine import ipc_sim
    from pegaflow.device.sim import SimKV

    kv = SimKV(1 << 16, sim_device=3, lib=lib)
    try:
        assert kv.name.startswith("/")
        want = encode_ipc_tensor(2, shm_name=kv.name, offset=8192, size=4096, sim_device=3)
        assert ipc_sim(lib, kv.name, 3, 8192, 4096) == want
        assert kv.ipc(8192, 4096) == want
    finally:
        kv.close()


def test_sim_tensor_is_torch_shaped_and_exports_its_region(lib):
    _need(lib, "pf_simkv_create", "pf_simkv_ipc", "pf_simkv_ptr", "pf_simkv_size",
          "pf_simkv_name", "pf_simkv_destroy", "pf_client_ipc_sim")
    import numpy as np

    from pegaflow.client.engine import ipc_sim
    from pegaflow.device.base import describe
    from pegaflow.device.sim import SimDeviceAdapter, allocate_kv_caches

    kv, ts = allocate_kv_caches(["a", "b"], (2, 8, 16, 2, 8), np.uint16, sim_device=1, lib=lib)
    try:
        t = ts["b"]
        info = describe(t)
        assert info.shape == (2, 8, 16, 2, 8)
        assert info.stride == (8 * 16 * 16, 16 * 16, 16, 8, 1)
        assert info.element_size == 2 and info.storage_offset == 0
        assert info.storage_nbytes == 2 * 8 * 16 * 16 * 2
        assert t.offset > 0 and t.offset % 4096 == 0
        ad = SimDeviceAdapter(1)
        assert ad.export_ipc(t) == ipc_sim(lib, kv.name, 1, t.offset, t.nbytes)
        t.numpy()[1, 3] = 7  # writes land in the shared memory
        raw = np.frombuffer(kv.buffer(t.offset, t.nbytes), dtype=np.uint16).reshape(t.shape)
        assert (raw[1, 3] == 7).all() and raw[0].sum() == 0
        with pytest.raises(ValueError, match="sim device"):
            SimDeviceAdapter(0).export_ipc(t)
    finally:
        kv.close()


# ------------------------------------------------------------------ CUDA: torch's share tuples
#
# The tuples come from tests/python/faketorch.py, which follows torch's byte layout
# (THPStorage_shareCuda, DeviceCachingAllocator::shareIpcHandle: see its docstring).


def _seg(n: int = 64, fill: int = 7) -> bytes:
    return bytes((fill + i) % 256 for i in range(n))


def _share(handle, size=1 << 20, offset=4096, device=0):
    """A _share_cuda_() 8-tuple (torch/csrc/StorageSharing.cpp, THPStorage_shareCuda)."""
    return (device, handle, size, offset, b"/torch_1_2_0", 0, bytes(64), False)


@pytest.mark.parametrize("version", [2, 3])
def test_versioned_cudamalloc_handle_yields_the_ipc_handle_and_offset(version):
    h = _seg()
    s = cuda.parse_share_cuda(_share(bytes([version]) + b"c" + h))
    assert (s.device, s.version, s.handle, s.offset, s.size) == (0, version, h, 4096, 1 << 20)


def test_unversioned_64_byte_handle_is_read_as_cudamalloc_like_torch():
    # NativeCachingAllocator::getIpcDevPtr: a handle of exactly CUDA_IPC_HANDLE_SIZE bytes
    # comes from a torch before versioned handles and is a raw cudaIpcMemHandle_t
    s = cuda.parse_share_cuda(_share(_seg(), offset=0))
    assert (s.version, s.handle, s.offset) == (None, _seg(), 0)


@pytest.mark.parametrize("version", [2, 3])
def test_expandable_segment_handles_are_refused_with_what_to_change(version):
    # ExpandableSegment::share: ShareHeader{pid, segment_size, num_handles} + one fd each
    body = (1234).to_bytes(4, "little") + bytes(4) + (20 << 20).to_bytes(8, "little") + \
        (2).to_bytes(8, "little") + (41).to_bytes(4, "little") + (42).to_bytes(4, "little")
    with pytest.raises(cuda.UnsupportedAllocation,
                       match="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"):
        cuda.parse_share_cuda(_share(bytes([version]) + b"e" + body))


@pytest.mark.parametrize("version", [0, 1, 4, 255])
def test_unknown_versions_are_refused_naming_the_version(version):
    with pytest.raises(cuda.UnsupportedAllocation, match=f"version {version};.*knows "
                       "versions 2, 3"):
        cuda.parse_share_cuda(_share(bytes([version]) + b"c" + _seg()))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 63, 65, 67, 130])
def test_wrong_lengths_are_refused(n):
    # n bytes in all: a version-2 'c' header followed by n-2 payload bytes (n < 2: not
    # even a header); 64 would be the unversioned form, 66 the right one
    raw = (bytes([2]) + b"c" + _seg(128))[:n]
    with pytest.raises(cuda.UnsupportedAllocation, match=f"{n} bytes"):
        cuda.parse_share_cuda(_share(raw))


def test_unknown_type_byte_is_refused():
    with pytest.raises(cuda.UnsupportedAllocation, match="type byte 0x78"):
        cuda.parse_share_cuda(_share(bytes([2]) + b"x" + _seg()))


@pytest.mark.parametrize("share,match", [
    ((0, bytes([2]) + b"c" + bytes(64), 1, 0), "tuple of 4 fields"),
    ([0, bytes([2]) + b"c" + bytes(64), 1, 0, b"", 0, bytes(64), False], "list"),
    (_share(None), "NoneType"),
    (_share(bytes([2]) + b"c" + bytes(64), size=0), "0 bytes"),
    (_share(bytes([2]) + b"c" + bytes(64), offset=-512), "offset is -512"),
    (_share(bytes([2]) + b"c" + bytes(64), size="1"), "storage size"),
    (_share(bytes([2]) + b"c" + bytes(64), device=True), "device"),
])
def test_malformed_share_tuples_are_refused(share, match):
    with pytest.raises(cuda.UnsupportedAllocation, match=match):
        cuda.parse_share_cuda(share)


# -------------------------------------------- the adapter against the fake torch (faketorch)


def _adapter(lib, monkeypatch, **gpu_kw):
    import faketorch

    _need(lib, "pf_client_ipc_cuda")
    g = faketorch.FakeGPU(**gpu_kw)
    torch = faketorch.install(monkeypatch, [g])
    return faketorch, torch, g, cuda.CudaDeviceAdapter(lib, 0)


@pytest.mark.parametrize("version", [2, 3, None])
def test_adapter_exports_the_storage_region_of_its_segment(lib, monkeypatch, version):
    ft, torch, g, ad = _adapter(lib, monkeypatch, handle_version=version)
    torch.zeros((300,), "uint8")  # an earlier block: the KV storage starts at 512
    kv = torch.zeros((2, 8, 4, 2, 8), "uint16")
    st = kv.untyped_storage()
    assert st.offset == 512 and st.handle in g.segments
    raw = kv.untyped_storage()._share_cuda_()
    assert len(raw) == 8 and len(raw[1]) == (64 if version is None else 66)
    ipc = ad.export_ipc(kv)
    assert ipc == encode_ipc_tensor(1, g.uuid.bytes, st.handle, "", 512, st.nbytes())
    # the server's view of that IpcTensor is exactly the tensor's bytes
    data = np.random.default_rng(3).integers(0, 1 << 16, kv.shape, dtype=np.uint16)
    kv.numpy()[...] = data
    assert ft.server_open(ipc, [g]).tobytes() == data.tobytes()


def test_adapter_region_ignores_the_tensors_own_storage_offset(lib, monkeypatch):
    # torch applies a tensor's storage_offset() on top of the storage it rebuilt from
    # (basePtr + storage_offset_bytes, storage_size_bytes long): the IpcTensor is the
    # storage. A storage ending at its segment's end must not overrun it.
    ft, torch, g, ad = _adapter(lib, monkeypatch, handle_version=None)
    torch.zeros((512,), "uint8")
    n = (ft.K_SEGMENT - 512) // 2 - 256
    t = torch.zeros((n,), "uint16", storage_offset=256)
    st = t.untyped_storage()
    assert st.offset + st.nbytes() == len(g.segments[st.handle])  # fills the segment
    ipc = ad.export_ipc(t)
    f = ft.decode_ipc_tensor(ipc)
    assert (f[5], f[6]) == (512, st.nbytes())
    assert len(ft.server_open(ipc, [g])) == st.nbytes()


@pytest.mark.parametrize("version", [2, 3])
def test_adapter_refuses_expandable_segments(lib, monkeypatch, version):
    _, torch, _, ad = _adapter(lib, monkeypatch, handle_version=version, backend="expandable")
    kv = torch.zeros((2, 8, 4, 2, 8), "uint16")
    assert kv.untyped_storage()._share_cuda_()[1][:2] == bytes([version]) + b"e"
    with pytest.raises(cuda.UnsupportedAllocation, match="expandable_segments:False"):
        ad.export_ipc(kv)


@pytest.mark.parametrize("backend,match", [("cudaMallocAsync", "backend:cudaMallocAsync"),
                                           ("pluggable", "pluggable allocator")])
def test_adapter_refuses_allocators_without_ipc(lib, monkeypatch, backend, match):
    _, torch, _, ad = _adapter(lib, monkeypatch, backend=backend)
    kv = torch.zeros((2, 8, 4, 2, 8), "uint16")
    with pytest.raises(cuda.UnsupportedAllocation, match=match):
        ad.export_ipc(kv)


def test_adapter_refuses_a_tensor_on_another_device(lib, monkeypatch):
    import faketorch

    _need(lib, "pf_client_ipc_cuda")
    g0, g1 = faketorch.FakeGPU(0), faketorch.FakeGPU(1)
    torch = faketorch.install(monkeypatch, [g0, g1])
    ad = cuda.CudaDeviceAdapter(lib, 0)
    with pytest.raises(ValueError, match="cuda:1"):
        ad.export_ipc(torch.zeros((4, 4), "uint16", device="cuda:1"))


def test_uuid_forms():
    u = uuid.UUID("01234567-89ab-cdef-0123-456789abcdef")

    class CUuuid:
        bytes = u.bytes

        def __str__(self):
            return str(u)

    assert cuda.uuid_bytes(CUuuid()) == u.bytes
    assert cuda.uuid_bytes("GPU-" + str(u)) == u.bytes
    assert cuda.uuid_bytes(u.hex) == u.bytes
    assert cuda.uuid_bytes(u.bytes) == u.bytes


@pytest.mark.parametrize("local,visible,want", [(0, None, 0), (1, "", 1), (0, "3,7", 3),
                                                (1, "3,7", 7), (2, "3,7", 2),
                                                (0, "GPU-0123,GPU-4567", 0)])
def test_global_device_id(local, visible, want):
    assert cuda.global_device_id(local, visible) == want
