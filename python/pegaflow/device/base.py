"""What the worker needs from "a GPU": tensor geometry, an IpcTensor export, the device id
the server knows the memory by, and a save fence: a way to wait until the kernels queued
before a save (the forward pass) wrote the KV, and no longer.

Adapters: pegaflow.device.cuda (torch CUDA tensors, real GPUs) and pegaflow.device.sim
(numpy arrays over the sim GPU's POSIX shared memory). The worker logic never imports
torch: it sees tensors only through an adapter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class TensorInfo:
    """Geometry of one KV-cache tensor, torch conventions (strides in elements)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    element_size: int
    storage_offset: int  # elements from the start of the storage
    storage_nbytes: int  # bytes of the storage the tensor lives in

    @property
    def ndim(self) -> int:
        return len(self.shape)


def describe(t: Any) -> TensorInfo:
    """TensorInfo of any torch-like object (torch.Tensor, SimTensor, test fakes)."""
    shape = tuple(int(x) for x in t.shape)
    stride = tuple(int(x) for x in t.stride())
    elt = int(t.element_size())
    off = int(t.storage_offset())
    if hasattr(t, "untyped_storage"):
        nbytes = int(t.untyped_storage().nbytes())
    elif hasattr(t, "storage_nbytes"):
        nbytes = int(t.storage_nbytes())
    else:  # dense tensor: its own extent
        nbytes = (off + 1 + sum((s - 1) * st for s, st in zip(shape, stride))) * elt
    return TensorInfo(shape, stride, elt, off, nbytes)


class SaveFence(Protocol):
    """Marks the point in the device's work where a save was issued."""

    def wait(self, timeout_s: float) -> bool:
        """True once the work queued before the fence has finished; False after
        ``timeout_s`` seconds."""


class ReadyFence:
    """The fence of a device whose writes are synchronous (sim, host memory)."""

    def wait(self, timeout_s: float) -> bool:
        return True


class DeviceAdapter(Protocol):
    """Device-specific operations of a worker."""

    #: short name for logs ("cuda", "sim", ...)
    kind: str

    def device_id(self) -> int:
        """The device_id sent in Register/Save/Load (global ordinal / sim device)."""

    def tensor_info(self, t: Any) -> TensorInfo:
        ...

    def export_ipc(self, t: Any) -> bytes:
        """Serialized IpcTensor covering ``t``'s whole storage."""

    def save_fence(self) -> SaveFence:
        """A fence after the work queued so far on the current stream; called on the thread
        that queued the forward pass, where vLLM issues the save (wait_for_save)."""

    def synchronize(self) -> None:
        """Block until every kernel queued on the device so far has finished (not used
        for saves: they wait for their fence only)."""
