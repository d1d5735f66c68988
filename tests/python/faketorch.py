"""A fake ``torch`` (the parts the CUDA device adapter touches), as strict as the real one
where the connector depends on it. Installed with ``install(monkeypatch, ...)`` as
``sys.modules["torch"]``; device memory is host numpy memory.

Sources followed (pytorch/pytorch, read through the code index):

* ``UntypedStorage._share_cuda_()`` returns THPStorage_shareCuda's 8-tuple
  (torch/csrc/StorageSharing.cpp): ``(device, storage_handle, storage_size_bytes,
  storage_offset_bytes, ref_counter_handle, ref_counter_offset, event_handle,
  event_sync_required)``; ``storage_handle`` as ``DeviceCachingAllocator::shareIpcHandle``
  writes it (c10/cuda/CUDACachingAllocator.cpp): one version byte
  (``SHAREABLE_HANDLE_VERSION``), one type byte, then for ``'c'`` the 64-byte
  ``cudaIpcMemHandle_t`` of the segment's *base* block and ``offset = block->ptr -
  base_block->ptr``; for ``'e'`` ``ExpandableSegment::share``'s ShareHeader ``{pid_t pid;
  size_t segment_size; size_t num_handles}`` (24 bytes, pid padded with zeroed bytes)
  and one ``int`` fd per segment page. ``version=None`` models a torch before versioned
  handles (a bare 64-byte handle). Version 3 (torch 2.13) changed only the ``'e'``
  payload (its ShareHeader layout, pytorch PR #179618 / issue #198305; NVIDIA-NeMo/RL
  nemo_rl/utils/cuda_ipc.py); this fake writes the version-2 header for ``'e'``
  under either version (nothing here reads it: ``'e'`` is refused by its type byte).
  ``event_handle`` is a 64-byte ``cudaIpcEventHandle_t``; ``ref_counter_handle`` a
  ``/torch_<pid>_<n>_<k>`` shm name (``CudaIPCRefCountersFile``).
* allocator back-ends (``PYTORCH_CUDA_ALLOC_CONF``): ``backend:cudaMallocAsync`` and
  pluggable allocators (vLLM's sleep-mode CuMemAllocator) raise RuntimeError from
  ``_share_cuda_`` ("cudaMallocAsync does not yet support shareIpcHandle",
  "CUDAPluggableAllocator does not yet support shareIPcHandle").
* the caching allocator carves storages out of cudaMalloc segments: sizes rounded to
  512 bytes (kMinBlockSize), segments of at least 2 MiB (kSmallBuffer / kRoundLarge), so a
  storage can start at a non-zero offset inside its segment.
* streams and events (CUDA runtime semantics, cudaEventRecord / cudaEventQuery /
  cudaEventSynchronize / cudaDeviceSynchronize): work queued on a stream runs in order;
  an event recorded on a stream is complete once every piece of work queued on that stream
  before the record has finished, regardless of work queued after it; an event never
  recorded counts as complete; ``torch.cuda.synchronize()`` waits for every stream of the
  device. Kernels here are Python callables queued with ``launch`` (not a torch API); they
  run only when the test calls ``FakeGPU.run`` — the GPU's progress is the test's to decide,
  so no ordering depends on timing.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import types
import uuid as _uuid
from typing import Any, Callable

import numpy as np

CUDA_IPC_HANDLE_SIZE = 64
K_MIN_BLOCK = 512  # kMinBlockSize
K_SEGMENT = 2 << 20  # kSmallBuffer / kRoundLarge
BLOCK_FOREVER_S = 60.0  # a fake wait that real CUDA would never end fails the test instead


class FakeGPU:
    """One fake CUDA device: its segments (by IPC handle), streams, and the condition its
    waiters sleep on."""

    def __init__(self, index: int = 0, handle_version: int | None = 2,
                 backend: str = "native", seed: int = 1):
        self.index = index
        self.uuid = _uuid.UUID(int=(0x5EED << 64) | (index + 1))
        self.handle_version = handle_version
        #: "native" (cudaMalloc segments), "expandable" (expandable_segments:True),
        #: "cudaMallocAsync", "pluggable"
        self.backend = backend
        self.rng = np.random.default_rng(seed)
        self.cv = threading.Condition()
        self.segments: dict[bytes, np.ndarray] = {}  # cudaIpcMemHandle_t -> memory
        self._open: tuple[bytes, int] | None = None  # (handle, next free offset)
        self.default_stream = Stream(self, "default")
        self.streams = [self.default_stream]
        self.current = self.default_stream
        self.full_syncs = 0
        self.event_waits = 0  # Event.query() answering False + Event.synchronize() calls

    # allocation ---------------------------------------------------------------
    def malloc(self, nbytes: int) -> tuple[bytes, int]:
        """(segment handle, offset) of a new block: carved from the open segment when it
        fits (the caching allocator's split blocks), else a new cudaMalloc segment."""
        size = max(K_MIN_BLOCK, -(-nbytes // K_MIN_BLOCK) * K_MIN_BLOCK)
        if self._open is not None:
            h, off = self._open
            if off + size <= len(self.segments[h]):
                self._open = (h, off + size)
                return h, off
        seg = max(K_SEGMENT, -(-size // K_SEGMENT) * K_SEGMENT)
        h = bytes(self.rng.integers(0, 256, CUDA_IPC_HANDLE_SIZE, dtype=np.uint8))
        self.segments[h] = np.zeros(seg, np.uint8)
        self._open = (h, size)
        return h, 0

    def open_ipc(self, handle: bytes, offset: int, size: int) -> np.ndarray:
        """cudaIpcOpenMemHandle + offset: the bytes [offset, offset + size) of the segment,
        checked against the allocation like the server's cuda_ipc_open."""
        seg = self.segments.get(bytes(handle))
        if seg is None:
            raise KeyError("cudaErrorInvalidResourceHandle: no allocation for that handle")
        if offset < 0 or size <= 0 or offset + size > len(seg):
            raise ValueError(f"range [{offset}, +{size}) exceeds the {len(seg)}-byte "
                             "allocation")
        return seg[offset:offset + size]

    # execution ----------------------------------------------------------------
    def run(self, stream: "Stream | None" = None, n: int | None = None) -> int:
        """Execute the next ``n`` queued kernels of ``stream`` (default: all); returns how
        many ran."""
        s = stream or self.default_stream
        ran = 0
        while n is None or ran < n:
            with self.cv:
                if s.done >= len(s.work):
                    break
                fn = s.work[s.done]
            fn()
            with self.cv:
                s.done += 1
                self.cv.notify_all()
            ran += 1
        return ran

    def run_all(self) -> None:
        for s in list(self.streams):
            self.run(s)

    def wait(self, pred: Callable[[], bool], what: str) -> None:
        with self.cv:
            if not self.cv.wait_for(pred, BLOCK_FOREVER_S):
                raise AssertionError(f"{what} would block forever: the fake GPU has work "
                                     "queued that the test never ran")


class Stream:
    """cudaStream_t: kernels in order; ``done`` counts the finished ones."""

    def __init__(self, gpu: FakeGPU, name: str = ""):
        self.gpu = gpu
        self.name = name
        self.work: list[Callable[[], None]] = []
        self.done = 0

    @property
    def pending(self) -> int:
        with self.gpu.cv:
            return len(self.work) - self.done

    def synchronize(self) -> None:
        mark = len(self.work)
        self.gpu.wait(lambda: self.done >= mark, "Stream.synchronize")

    def wait_event(self, ev: "Event") -> None:  # pragma: no cover - not used by the adapter
        raise NotImplementedError("cross-stream waits are not modelled")


class Event:
    """torch.cuda.Event over cudaEvent_t semantics (see the module docstring)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False):
        self._stream: Stream | None = None
        self._mark = 0
        self.records = 0

    def record(self, stream: Stream | None = None) -> None:
        s = stream if stream is not None else _current().current
        with s.gpu.cv:
            self._stream, self._mark = s, len(s.work)
        self.records += 1

    def query(self) -> bool:
        s = self._stream
        if s is None:
            return True  # cudaEventQuery on an event never recorded: cudaSuccess
        with s.gpu.cv:
            if s.done >= self._mark:
                return True
            s.gpu.event_waits += 1
            s.gpu.cv.notify_all()
            return False

    def synchronize(self) -> None:
        s = self._stream
        if s is not None:
            with s.gpu.cv:
                s.gpu.event_waits += 1
                s.gpu.cv.notify_all()
            s.gpu.wait(lambda: s.done >= self._mark, "Event.synchronize")


# ------------------------------------------------------------------ tensors and storages

_refs = itertools.count()


class UntypedStorage:
    def __init__(self, gpu: FakeGPU, handle: bytes, offset: int, nbytes: int):
        self.gpu, self.handle, self.offset, self._nbytes = gpu, handle, offset, nbytes

    def nbytes(self) -> int:
        return self._nbytes

    def data(self) -> np.ndarray:
        return self.gpu.segments[self.handle][self.offset:self.offset + self._nbytes]

    def _share_cuda_(self) -> tuple:
        g = self.gpu
        if g.backend == "cudaMallocAsync":
            raise RuntimeError("cudaMallocAsync does not yet support shareIpcHandle. If you "
                               "need it, please file an issue describing your use case.")
        if g.backend == "pluggable":
            raise RuntimeError("CUDAPluggableAllocator does not yet support shareIPcHandle. "
                               "If you need it, please file an issue describing your use "
                               "case.")
        if g.backend == "expandable":
            # ShareHeader{pid, segment_size, num_handles} + one int fd per 20 MiB page
            pages = max(1, -(-(self.offset + self._nbytes) // (20 << 20)))
            body = (os.getpid().to_bytes(4, "little") + bytes(4) + (20 << 20).to_bytes(8, "little")
                    + pages.to_bytes(8, "little")
                    + b"".join((40 + i).to_bytes(4, "little") for i in range(pages)))
            v = 2 if g.handle_version is None else g.handle_version
            handle = bytes([v]) + b"e" + body
        elif g.handle_version is None:
            handle = self.handle
        else:
            handle = bytes([g.handle_version]) + b"c" + self.handle
        ref = f"/torch_{os.getpid()}_{next(_refs)}_0".encode()
        return (g.index, handle, self._nbytes, self.offset, ref, 0,
                bytes(CUDA_IPC_HANDLE_SIZE), False)


class Device:
    def __init__(self, index: int):
        self.type, self.index = "cuda", index

    def __str__(self) -> str:
        return f"cuda:{self.index}"


class Tensor:
    """A dense CUDA tensor (C-contiguous) viewing its storage from ``storage_offset``."""

    def __init__(self, storage: UntypedStorage, shape: tuple[int, ...], dtype: Any,
                 storage_offset: int = 0):
        self._s = storage
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self._off = storage_offset
        self.is_cuda = True
        self.device = Device(storage.gpu.index)

    def untyped_storage(self) -> UntypedStorage:
        return self._s

    def element_size(self) -> int:
        return self.dtype.itemsize

    def storage_offset(self) -> int:
        return self._off

    def stride(self) -> tuple[int, ...]:
        st, acc = [], 1
        for n in reversed(self.shape):
            st.append(acc)
            acc *= n
        return tuple(reversed(st))

    def numpy(self) -> np.ndarray:
        """The live device memory (a test's stand-in for a kernel's view)."""
        n = int(np.prod(self.shape))
        raw = self._s.data()[self._off * self.dtype.itemsize:]
        return raw[:n * self.dtype.itemsize].view(self.dtype).reshape(self.shape)


# ------------------------------------------------------------------ the torch.cuda module

_state: dict[str, Any] = {}


def _current() -> FakeGPU:
    return _state["gpus"][_state["device"]]


def _gpu(device: Any) -> FakeGPU:
    if device is None:
        return _current()
    if isinstance(device, Device):
        return _state["gpus"][device.index]
    if isinstance(device, str):
        return _state["gpus"][int(device.split(":")[1]) if ":" in device else _state["device"]]
    return _state["gpus"][int(device)]


def _make_cuda_module() -> types.ModuleType:
    cuda = types.ModuleType("torch.cuda")

    cuda.Event = Event
    cuda.is_available = lambda: True
    cuda.device_count = lambda: len(_state["gpus"])
    cuda.current_device = lambda: _state["device"]

    def set_device(d):
        _state["device"] = _gpu(d).index

    def get_device_properties(d=None):
        g = _gpu(d)

        class _CUuuid:  # torch._C._CUuuid: .bytes (16 raw bytes), str() the dashed text
            bytes = g.uuid.bytes

            def __str__(self):
                return str(g.uuid)

        return types.SimpleNamespace(name="Fake GPU", uuid=_CUuuid(), total_memory=1 << 30)

    def current_stream(device=None):
        return _gpu(device).current

    def synchronize(device=None):
        g = _gpu(device)
        g.full_syncs += 1
        marks = [(s, len(s.work)) for s in g.streams]
        g.wait(lambda: all(s.done >= m for s, m in marks), "torch.cuda.synchronize")

    @contextlib.contextmanager
    def stream(s):
        g = s.gpu
        prev, g.current = g.current, s
        try:
            yield
        finally:
            g.current = prev

    def Stream_(device=None, priority=0):  # noqa: N802 - torch.cuda.Stream
        g = _gpu(device)
        s = Stream(g, f"s{len(g.streams)}")
        g.streams.append(s)
        return s

    def launch(fn: Callable[[], None], stream_: Stream | None = None) -> None:
        """Queue a kernel (a callable) on ``stream_`` or the current stream (fake only)."""
        s = stream_ or _current().current
        with s.gpu.cv:
            s.work.append(fn)

    cuda.set_device = set_device
    cuda.get_device_properties = get_device_properties
    cuda.current_stream = current_stream
    cuda.synchronize = synchronize
    cuda.stream = stream
    cuda.Stream = Stream_
    cuda.launch = launch
    return cuda


def zeros(shape, dtype="uint16", device="cuda:0", storage_offset: int = 0) -> Tensor:
    """A CUDA tensor in a fresh caching-allocator block (``storage_offset`` elements of
    the storage precede the tensor)."""
    g = _gpu(device)
    dt = np.dtype(dtype)
    nbytes = (int(np.prod(shape)) + storage_offset) * dt.itemsize
    h, off = g.malloc(nbytes)
    g.segments[h][off:off + nbytes] = 0
    return Tensor(UntypedStorage(g, h, off, nbytes), tuple(shape), dt, storage_offset)


def install(monkeypatch, gpus: list[FakeGPU]) -> types.ModuleType:
    """Make ``import torch`` return this fake for the test (monkeypatch undoes it)."""
    import sys

    _state.clear()
    _state.update(gpus={g.index: g for g in gpus}, device=gpus[0].index)
    mod = types.ModuleType("torch")
    mod.cuda = _make_cuda_module()
    mod.zeros = zeros
    mod.Tensor = Tensor
    mod.UntypedStorage = UntypedStorage
    mod.__faketorch__ = True
    monkeypatch.setitem(sys.modules, "torch", mod)
    monkeypatch.setitem(sys.modules, "torch.cuda", mod.cuda)
    return mod


# ------------------------------------------------------------------ the server's side


def _varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def decode_ipc_tensor(b: bytes) -> dict[int, Any]:
    """proto3 IpcTensor (proto/engine.proto) -> {field number: value}."""
    out: dict[int, Any] = {}
    i = 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            out[num], i = _varint(b, i)
        elif wire == 2:
            n, i = _varint(b, i)
            out[num] = bytes(b[i:i + n])
            i += n
        else:
            raise ValueError(f"unexpected wire type {wire}")
    return out


def server_open(ipc: bytes, gpus: list[FakeGPU]) -> np.ndarray:
    """What pegaflow-server's cuda backend does with a CUDA_IPC IpcTensor: find the GPU by
    UUID, require a 64-byte handle (src/rpc/engine_service.c), open it, add the offset."""
    f = decode_ipc_tensor(ipc)
    if f.get(1) != 1:
        raise ValueError(f"IpcTensor kind {f.get(1)} is not CUDA_IPC")
    handle = f.get(3, b"")
    if len(handle) != CUDA_IPC_HANDLE_SIZE:
        raise ValueError(f"cuda_ipc_handle has {len(handle)} bytes, expected 64")
    g = next((g for g in gpus if g.uuid.bytes == f.get(2)), None)
    if g is None:
        raise ValueError("no GPU with that UUID")
    return g.open_ipc(handle, f.get(5, 0), f.get(6, 0))
