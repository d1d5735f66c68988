"""CUDA device adapter: exports a torch KV tensor's memory as an IpcTensor (CUDA_IPC).

From ``tensor.untyped_storage()._share_cuda_()`` (PyTorch's own IPC export, the one
torch.multiprocessing uses) we take fields 0-3: device index, the 64-byte
cudaIpcMemHandle of the caching-allocator segment the storage lives in, the storage size
in bytes and the storage's byte offset inside that segment. The server opens the handle
with cuIpcOpenMemHandle on the GPU whose UUID we send (robust to CUDA_VISIBLE_DEVICES
differing between vLLM and the server) and adds the offset.

With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or vLLM's sleep-mode cuMem
allocator) the handle is not a legacy 64-byte cudaIpcMemHandle but a VMM share handle;
those are refused with a message saying what to change.

torch is imported only inside the adapter's methods; the helpers below are plain Python
so tests can check them without torch.
"""

from __future__ import annotations

import os
import uuid as _uuid
from typing import Any

from pegaflow.client import _lib as libmod
from pegaflow.client.engine import ipc_cuda
from pegaflow.device.base import TensorInfo, describe

CUDA_IPC_HANDLE_LEN = 64


class UnsupportedAllocation(RuntimeError):
    """The KV cache memory cannot be shared through a legacy CUDA IPC handle."""


def uuid_bytes(u: Any) -> bytes:
    """16 raw bytes of a CUDA device UUID given as torch's _CUuuid, bytes, or a string
    ("GPU-xxxxxxxx-xxxx-...", or plain hex with or without dashes)."""
    raw = getattr(u, "bytes", None)
    if raw is not None and not isinstance(u, (str, bytes, bytearray)):
        raw = bytes(raw)
        if len(raw) == 16:
            return raw
    if isinstance(u, (bytes, bytearray)):
        if len(u) == 16:
            return bytes(u)
        u = bytes(u).decode()
    s = str(u).strip()
    for prefix in ("GPU-", "MIG-"):
        if s.startswith(prefix):
            s = s[len(prefix):]
    return _uuid.UUID(s).bytes


def ipc_fields_from_share(share: tuple, storage_offset_bytes: int = 0) -> tuple[bytes, int, int]:
    """(handle, offset, size) for the IpcTensor from a ``_share_cuda_()`` tuple.

    offset = the storage's offset inside its allocation + the tensor's own storage
    offset; size = the storage's bytes."""
    if len(share) < 4:
        raise UnsupportedAllocation(f"unexpected _share_cuda_() result of {len(share)} fields")
    handle, size, offset = share[1], share[2], share[3]
    if not isinstance(handle, (bytes, bytearray)) or len(handle) != CUDA_IPC_HANDLE_LEN:
        n = len(handle) if isinstance(handle, (bytes, bytearray)) else type(handle).__name__
        raise UnsupportedAllocation(
            f"the KV cache's CUDA IPC handle is {n} bytes, not a {CUDA_IPC_HANDLE_LEN}-byte "
            "cudaIpcMemHandle: PyTorch allocated it with expandable segments (or vLLM's "
            "cuMem/sleep-mode allocator), which pegaflow-server cannot open. Unset "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (and don't use "
            "--enable-sleep-mode) for vLLM processes using PegaKVConnector."
        )
    return bytes(handle), int(offset) + int(storage_offset_bytes), int(size)


def global_device_id(local_index: int, cuda_visible_devices: str | None) -> int:
    """Global CUDA ordinal of a process-local device index: maps through
    CUDA_VISIBLE_DEVICES when it lists integers; otherwise the local index."""
    if cuda_visible_devices:
        parts = [p.strip() for p in cuda_visible_devices.split(",") if p.strip()]
        if 0 <= local_index < len(parts):
            try:
                return int(parts[local_index])
            except ValueError:
                pass  # UUIDs or MIG names: the server identifies memory by UUID anyway
    return int(local_index)


class CudaDeviceAdapter:
    """DeviceAdapter for torch CUDA tensors on the current (or given) device."""

    kind = "cuda"

    def __init__(self, lib: "libmod.Lib | None" = None, device_index: int | None = None):
        import torch

        self._torch = torch
        self._lib = lib if lib is not None else libmod.load_library()
        self._index = torch.cuda.current_device() if device_index is None else int(device_index)
        self._uuid = uuid_bytes(torch.cuda.get_device_properties(self._index).uuid)

    def device_id(self) -> int:
        return global_device_id(self._index, os.environ.get("CUDA_VISIBLE_DEVICES"))

    def tensor_info(self, t: Any) -> TensorInfo:
        return describe(t)

    def export_ipc(self, t: Any) -> bytes:
        if not t.is_cuda:
            raise TypeError(f"KV cache tensor is on {t.device}, not a CUDA device")
        if t.device.index != self._index:
            raise ValueError(f"KV cache tensor is on cuda:{t.device.index}, worker uses "
                             f"cuda:{self._index}")
        share = t.untyped_storage()._share_cuda_()
        handle, offset, size = ipc_fields_from_share(share, t.storage_offset() * t.element_size())
        return ipc_cuda(self._lib, self._uuid, handle, offset, size)

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self._index)
