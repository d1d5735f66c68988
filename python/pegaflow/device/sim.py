"""Sim device adapter: KV caches as numpy arrays over the sim GPU's shared memory.

The "device memory" is a POSIX shm object made by libpegaflow's pf_simkv_create and
mapped into this process; the server's sim GPU maps the same object from the IpcTensor
(kind SIM_SHM) that pf_simkv_ipc builds, so the bytes a test writes through numpy are the
bytes the server copies on Save, and the server's Load writes land in the arrays.

SimTensor is torch-shaped (shape, stride(), element_size(), storage_offset(), data_ptr(),
untyped_storage().nbytes()) so the worker's layout inference treats it exactly like a
CUDA tensor; its storage is the region [offset, offset + nbytes) of the shm object.
numpy is imported lazily, only by the functions that build arrays.
"""

from __future__ import annotations

import ctypes
from ctypes import byref, c_void_p
from typing import Any, Sequence

from pegaflow.client import _lib as libmod
from pegaflow.client.errors import error_for
from pegaflow.device.base import ReadyFence, TensorInfo, describe


class SimKV:
    """One sim "GPU allocation" (pf_simkv). Keep it alive while the server may use it."""

    def __init__(self, nbytes: int, sim_device: int = 0, lib: "libmod.Lib | None" = None):
        self.lib = lib if lib is not None else libmod.load_library()
        h = c_void_p()
        rc = self.lib.fn("pf_simkv_create")(int(nbytes), int(sim_device), byref(h))
        if rc:
            code, msg = self.lib.last_error()
            raise error_for("pf_simkv_create", rc, code, msg or "cannot create sim KV memory")
        self._h = h
        self.sim_device = int(sim_device)
        self.size = int(self.lib.fn("pf_simkv_size")(h))
        self.ptr = int(self.lib.fn("pf_simkv_ptr")(h))
        self.name = self.lib.fn("pf_simkv_name")(h).decode()

    def ipc(self, offset: int, size: int) -> bytes:
        """Serialized IpcTensor for [offset, offset+size) of this object (pf_simkv_ipc)."""
        if not self._h:
            raise ValueError("SimKV destroyed")
        f = self.lib.fn("pf_simkv_ipc")
        cap = 256
        buf = (ctypes.c_uint8 * cap)()
        n = ctypes.c_size_t()
        rc = f(self._h, int(offset), int(size), ctypes.cast(buf, ctypes.POINTER(ctypes.c_uint8)),
               cap, byref(n))
        if rc:
            code, msg = self.lib.last_error()
            raise error_for("pf_simkv_ipc", rc, code, msg or "cannot build IpcTensor")
        return bytes(buf[: n.value])

    def buffer(self, offset: int, nbytes: int):
        """A ctypes byte array over [offset, offset+nbytes) (no copy)."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise ValueError(f"range [{offset}, +{nbytes}) outside sim KV of {self.size} bytes")
        return (ctypes.c_uint8 * nbytes).from_address(self.ptr + offset)

    def tensor(self, offset: int, shape: Sequence[int], dtype: Any = "uint8") -> "SimTensor":
        return SimTensor(self, offset, tuple(shape), dtype)

    def close(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            self.lib.fn("pf_simkv_destroy")(h)

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


class _Storage:
    def __init__(self, nbytes: int):
        self._n = nbytes

    def nbytes(self) -> int:
        return self._n


class SimTensor:
    """A dense C-order tensor living in a SimKV at ``offset`` (its storage start)."""

    def __init__(self, kv: SimKV, offset: int, shape: tuple[int, ...], dtype: Any = "uint8"):
        import numpy as np

        self.kv = kv
        self.offset = int(offset)
        self.dtype = np.dtype(dtype)
        self.shape = tuple(int(s) for s in shape)
        n = 1
        for s in self.shape:
            n *= s
        self.nbytes = n * self.dtype.itemsize
        raw = kv.buffer(self.offset, self.nbytes)
        self._array = np.frombuffer(raw, dtype=self.dtype).reshape(self.shape)
        self._raw = raw

    # torch-like surface used by layout inference
    def stride(self) -> tuple[int, ...]:
        return tuple(s // self.dtype.itemsize for s in self._array.strides)

    def element_size(self) -> int:
        return self.dtype.itemsize

    def storage_offset(self) -> int:
        return 0

    def data_ptr(self) -> int:
        return self.kv.ptr + self.offset

    def untyped_storage(self) -> _Storage:
        return _Storage(self.nbytes)

    @property
    def sim_device(self) -> int:
        return self.kv.sim_device

    def numpy(self):
        """The live array (writes go to sim device memory)."""
        return self._array

    def ipc_bytes(self) -> bytes:
        return self.kv.ipc(self.offset, self.nbytes)


class SimDeviceAdapter:
    """DeviceAdapter for SimTensors of one sim device."""

    kind = "sim"

    def __init__(self, sim_device: int = 0):
        self._dev = int(sim_device)

    def device_id(self) -> int:
        return self._dev

    def tensor_info(self, t: Any) -> TensorInfo:
        return describe(t)

    def export_ipc(self, t: Any) -> bytes:
        if not isinstance(t, SimTensor):
            raise TypeError(f"sim adapter cannot export {type(t).__name__}")
        if t.sim_device != self._dev:
            raise ValueError(f"tensor is on sim device {t.sim_device}, worker uses {self._dev}")
        return t.ipc_bytes()

    def save_fence(self) -> ReadyFence:
        # Sim "kernels" are synchronous numpy writes: nothing is queued.
        return ReadyFence()

    def synchronize(self) -> None:
        return None


def allocate_kv_caches(layer_names: Sequence[str], shape: Sequence[int], dtype: Any = "uint16",
                       sim_device: int = 0, lib: "libmod.Lib | None" = None,
                       align: int = 4096) -> tuple[SimKV, dict[str, SimTensor]]:
    """One SimKV holding one tensor of ``shape`` per layer, each at an aligned offset
    (so the IpcTensor offsets are non-zero for every layer but the first)."""
    import numpy as np

    itemsize = np.dtype(dtype).itemsize
    n = 1
    for s in shape:
        n *= int(s)
    per = n * itemsize
    stride = (per + align - 1) // align * align
    kv = SimKV(max(1, stride * len(layer_names)), sim_device, lib)
    tensors = {name: kv.tensor(i * stride, shape, dtype) for i, name in enumerate(layer_names)}
    return kv, tensors
