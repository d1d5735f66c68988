"""IpcTensor bytes: the C builders (pf_client_ipc_cuda / pf_client_ipc_sim /
pf_simkv_ipc) produce the message of proto/engine.proto, and the sim adapter exports
exactly what pf_client_ipc_sim builds for the same memory. An independent proto3 encoder
written here is the oracle. CUDA helpers are checked without torch."""

from __future__ import annotations

import uuid

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


# ------------------------------------------------------------------ CUDA helpers (no torch)


def test_share_cuda_fields():
    share = (0, bytes(range(64)), 1 << 20, 4096, b"ref", 0, b"ev", True)
    assert cuda.ipc_fields_from_share(share, 0) == (bytes(range(64)), 4096, 1 << 20)
    assert cuda.ipc_fields_from_share(share, 512)[1] == 4608


def test_expandable_segment_handles_are_refused_with_advice():
    share = (0, b"\x01" * 120, 1 << 20, 0, b"", 0, b"", False)
    with pytest.raises(cuda.UnsupportedAllocation, match="expandable_segments"):
        cuda.ipc_fields_from_share(share)
    with pytest.raises(cuda.UnsupportedAllocation):
        cuda.ipc_fields_from_share((0, None, 1, 0))


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
