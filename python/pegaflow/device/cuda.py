"""CUDA device adapter: exports a torch KV tensor's memory as an IpcTensor (CUDA_IPC), and
orders saves after the forward pass with a CUDA event.

Export. ``tensor.untyped_storage()._share_cuda_()`` is PyTorch's own IPC export (the one
torch.multiprocessing's ``reduce_tensor`` uses). Its 8-tuple, as built by
``THPStorage_shareCuda`` (torch/csrc/StorageSharing.cpp) and read back by
``THPStorage_newSharedCuda`` / ``rebuild_cuda_tensor`` (torch/multiprocessing/
reductions.py), is::

    (device, storage_handle, storage_size_bytes, storage_offset_bytes,
     ref_counter_handle, ref_counter_offset, event_handle, event_sync_required)

``storage_handle`` is the string ``CUDACachingAllocator::shareIpcHandle``
(c10/cuda/CUDACachingAllocator.cpp, ``DeviceCachingAllocator::shareIpcHandle``) writes::

    [SHAREABLE_HANDLE_VERSION : 1 byte][type : 1 byte][payload]

type ``'c'`` (SHAREABLE_CUDA_MALLOC): the payload is the 64-byte ``cudaIpcMemHandle_t`` of
the *base* block of the cudaMalloc segment the storage lives in (66 bytes in all);
type ``'e'`` (SHAREABLE_CUDA_EXPANDABLE_SEGMENT): the payload is an
``ExpandableSegment::ShareHeader`` (pid, segment size, handle count) followed by one
POSIX fd (or fabric handle) per segment page, exported with cuMemExportToShareableHandle:
nothing cudaIpcOpenMemHandle can open. Versions: 2 in the torch sources read (the
constant ``SHAREABLE_HANDLE_VERSION = 2``); torch 2.13 writes 3 and its ``'c'`` payload is
byte-for-byte that of version 2 — only the ``'e'`` payload changed (NVIDIA-NeMo/RL
nemo_rl/utils/cuda_ipc.py, PR #4080, rewrites 3 to 2 in 'c' handles for that reason; the
``'e'`` change is the ShareHeader layout of pytorch PR #179618, pytorch issue #198305).
The torch 2.13 source itself was not in the code index. A handle of exactly 64 bytes is
an unversioned ``cudaIpcMemHandle_t`` from a torch before versioning: torch's own
consumer (``MemHandleCacheEntry`` in ``NativeCachingAllocator::getIpcDevPtr``) reads it
as ``'c'``, and so do we.

``storage_offset_bytes`` is the storage's start inside that segment (``block->ptr -
base_block->ptr``); torch's consumer maps the segment and adds it (``devPtr = basePtr +
storage_offset`` in THPStorage_newSharedCuda), the storage being ``storage_size_bytes``
long from there. The IpcTensor sent to the server is exactly that region: the 64-byte
handle, offset = storage_offset_bytes, size = storage_size_bytes. A tensor's own
``storage_offset()`` is not part of it (torch applies it when it rebuilds the tensor on
top of the storage; the connector's layout code handles it, see layout.py). The wire to
the server is unchanged: the server opens the 64-byte handle with cudaIpcOpenMemHandle on
the GPU whose UUID we send (robust to CUDA_VISIBLE_DEVICES differing between vLLM and the
server) and checks offset + size against the allocation.

Refused, with what to change: ``'e'`` handles (PYTORCH_CUDA_ALLOC_CONF
``expandable_segments:True``), versions other than 2 and 3, a length that is not 66 (or
64), ``_share_cuda_()`` failing (``backend:cudaMallocAsync`` and pluggable allocators
such as vLLM's ``--enable-sleep-mode`` CuMemAllocator raise "does not yet support
shareIpcHandle").

Save ordering. vLLM calls ``wait_for_save`` as the forward context exits (vLLM
kv_connector/v1/base.py: "called as the forward context exits"), on the thread that
queued the forward pass, with that pass's kernels still running on the current stream.
``save_fence()`` records a ``torch.cuda.Event`` on ``torch.cuda.current_stream()`` there;
the save thread waits for that event only (cudaEventQuery/cudaEventSynchronize semantics:
complete once the work captured before it on that stream is done), so the server's copy
never reads KV the forward pass is still writing, and work queued after the forward pass
(the next step) is not waited for — unlike ``torch.cuda.synchronize()``, which waits for
every stream of the device. LMCache's connectors order their saves the same way
(``wait_stream(torch.cuda.current_stream())`` + an event per save).

torch is imported only inside the adapter's methods; the helpers below are plain Python
so tests can check them without torch.
"""

from __future__ import annotations

import os
import time
import uuid as _uuid
from dataclasses import dataclass
from typing import Any

from pegaflow.client import _lib as libmod
from pegaflow.client.engine import ipc_cuda
from pegaflow.device.base import TensorInfo, describe

CUDA_IPC_HANDLE_LEN = 64  # sizeof(cudaIpcMemHandle_t), CUDA_IPC_HANDLE_SIZE in torch
SHAREABLE_CUDA_MALLOC = ord("c")
SHAREABLE_CUDA_EXPANDABLE_SEGMENT = ord("e")
#: shareIpcHandle versions whose 'c' payload is known (see the module docstring)
KNOWN_HANDLE_VERSIONS = (2, 3)

_NO_EXPANDABLE = (
    "Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False (or drop expandable_segments "
    "from it) for the vLLM processes using PegaKVConnector, and do not use "
    "--enable-sleep-mode")


class UnsupportedAllocation(RuntimeError):
    """The KV cache memory cannot be shared through a legacy CUDA IPC handle."""


@dataclass(frozen=True)
class CudaShare:
    """What the IpcTensor needs from one ``_share_cuda_()`` tuple."""

    device: int  # torch's (process-local) device index
    version: int | None  # SHAREABLE_HANDLE_VERSION; None: an unversioned 64-byte handle
    handle: bytes  # the 64-byte cudaIpcMemHandle_t of the cudaMalloc segment
    offset: int  # the storage's first byte inside the segment
    size: int  # the storage's bytes


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


def cuda_ipc_handle(storage_handle: Any) -> tuple[int | None, bytes]:
    """(version, 64-byte cudaIpcMemHandle_t) of a ``shareIpcHandle`` string (field 1 of
    ``_share_cuda_()``); raises UnsupportedAllocation saying what to change."""
    if not isinstance(storage_handle, (bytes, bytearray)):
        raise UnsupportedAllocation(
            f"_share_cuda_() gave a storage handle of type {type(storage_handle).__name__}, "
            "not bytes: the KV cache storage has no memory (0 bytes?)")
    h = bytes(storage_handle)
    if len(h) == CUDA_IPC_HANDLE_LEN:
        # torch before versioned handles: a bare cudaIpcMemHandle_t (torch's consumer
        # takes exactly this length as SHAREABLE_CUDA_MALLOC)
        return None, h
    if len(h) < 2:
        raise UnsupportedAllocation(
            f"torch's CUDA IPC storage handle is {len(h)} bytes: too short for a "
            "version and a type byte")
    version, kind = h[0], h[1]
    if kind == SHAREABLE_CUDA_EXPANDABLE_SEGMENT:
        raise UnsupportedAllocation(
            f"the KV cache lives in a PyTorch expandable segment (IPC handle version "
            f"{version}, type 'e': cuMem file descriptors, not a cudaIpcMemHandle), which "
            f"pegaflow-server cannot open. {_NO_EXPANDABLE}.")
    if kind != SHAREABLE_CUDA_MALLOC:
        raise UnsupportedAllocation(
            f"torch's CUDA IPC storage handle has type byte 0x{kind:02x} (version "
            f"{version}); known types are 'c' (cudaMalloc) and 'e' (expandable segment): "
            "a torch release this connector does not know; report it with the torch "
            "version")
    if version not in KNOWN_HANDLE_VERSIONS:
        raise UnsupportedAllocation(
            f"torch's CUDA IPC storage handle has version {version}; this connector knows "
            f"versions {', '.join(map(str, KNOWN_HANDLE_VERSIONS))} (torch <= 2.13). Use a "
            "torch release this pegaflow knows, or update pegaflow")
    want = 2 + CUDA_IPC_HANDLE_LEN
    if len(h) != want:
        raise UnsupportedAllocation(
            f"torch's CUDA IPC storage handle (version {version}, type 'c') is {len(h)} "
            f"bytes, expected {want} (version, type, 64-byte cudaIpcMemHandle_t)")
    return version, h[2:]


def parse_share_cuda(share: Any) -> CudaShare:
    """The CudaShare of a ``UntypedStorage._share_cuda_()`` tuple (layout: module
    docstring); raises UnsupportedAllocation naming the problem."""
    if not isinstance(share, tuple) or len(share) != 8:
        got = (f"a tuple of {len(share)} fields" if isinstance(share, tuple)
               else f"a {type(share).__name__}")
        raise UnsupportedAllocation(
            f"_share_cuda_() returned {got}, expected torch's 8-tuple (device, handle, "
            "size, offset, ref counter, ref counter offset, event handle, event sync)")
    device, handle, size, offset = share[0], share[1], share[2], share[3]
    version, raw = cuda_ipc_handle(handle)
    for name, v in (("device", device), ("storage size", size), ("storage offset", offset)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise UnsupportedAllocation(f"_share_cuda_() {name} is {v!r}, not an int")
    if size <= 0:
        raise UnsupportedAllocation(f"the KV cache storage is {size} bytes")
    if offset < 0:
        raise UnsupportedAllocation(f"_share_cuda_() storage offset is {offset}")
    return CudaShare(int(device), version, raw, int(offset), int(size))


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


class CudaSaveFence:
    """A ``torch.cuda.Event`` recorded on the forward pass's stream."""

    def __init__(self, event: Any):
        self._event = event

    def wait(self, timeout_s: float) -> bool:
        """True once every kernel queued on the stream before the event has finished;
        False after ``timeout_s``. Polls cudaEventQuery (a blocking
        cudaEventSynchronize cannot time out), backing off from 50 us to 1 ms."""
        ev = self._event
        if ev.query():
            return True
        deadline = time.monotonic() + timeout_s
        pause = 50e-6
        while True:
            if ev.query():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)


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

    def share(self, t: Any) -> CudaShare:
        """torch's IPC export of ``t``'s storage, checked (see the module docstring)."""
        if not t.is_cuda:
            raise TypeError(f"KV cache tensor is on {t.device}, not a CUDA device")
        if t.device.index != self._index:
            raise ValueError(f"KV cache tensor is on cuda:{t.device.index}, worker uses "
                             f"cuda:{self._index}")
        try:
            raw = t.untyped_storage()._share_cuda_()
        except RuntimeError as e:
            raise UnsupportedAllocation(
                f"torch cannot export the KV cache for CUDA IPC ({e}). The allocator must be "
                "PyTorch's native caching allocator with cudaMalloc segments: do not set "
                "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync or a pluggable allocator. "
                f"{_NO_EXPANDABLE}.") from e
        s = parse_share_cuda(raw)
        if s.device != self._index:
            raise UnsupportedAllocation(f"_share_cuda_() names device {s.device}, the tensor "
                                        f"is on cuda:{self._index}")
        return s

    def export_ipc(self, t: Any) -> bytes:
        s = self.share(t)
        return ipc_cuda(self._lib, self._uuid, s.handle, s.offset, s.size)

    def save_fence(self) -> CudaSaveFence:
        """An event on this device's current stream: call where the save is issued (the
        thread that queued the forward pass)."""
        torch = self._torch
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream(self._index))
        return CudaSaveFence(ev)

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self._index)
