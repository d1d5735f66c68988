"""The load_state_shm completion record of a Load RPC.

Layout (DESIGN.md §4, reference §3.6), a POSIX shm object "/pega_load_<32 hex>" created
by the client:

    bytes 0..8     native-endian u64: byte offset of the record (8-aligned; 8 here)
    record+0       u32 magic 0x50464C44 ('PFLD')
    record+4       u32 version 1
    record+8       i64 state: 0 pending, 1 success, -1 error, 2 cancel asked (client),
                   -2 cancelled (the server stopped before a copy chunk)

The server attaches by name and writes the state once, with a release store, after all
copies of the batch finished. Readers treat only exactly 1 as success: any other non-zero
value (including a value torn by a non-atomic read) is a failure, never a false success.

Cancellation (src/engine/loadstate.h): a client that gives up stores 2 over 0
(compare-and-swap, ``cancel()``); the server reads the state before each chunk of copies
and, seeing 2, submits nothing more and confirms with -2 once the copies already
submitted completed. Only a final value (1, -1, -2: ``state_is_final``) proves that no
byte of the load will reach the GPU any more.

Two implementations with one surface (``name``, ``get()``, ``close()``):
  * CLoadState: libpegaflow's pf_loadstate_* (used when the library has them);
  * ShmLoadState: this module's own, reading with one aligned 8-byte load through ctypes
    (also ``attach``/``set`` for in-process test servers).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import uuid
from ctypes import byref, c_void_p

MAGIC = 0x50464C44
VERSION = 1
PENDING, SUCCESS, ERROR = 0, 1, -1
CANCEL_REQ, CANCELLED = 2, -2
RECORD_OFFSET = 8
SHM_SIZE = 8 + 16 + 8  # prefix + record + alignment slack, as the reference sizes it
SHM_DIR = "/dev/shm"


def state_is_done(state: int) -> bool:
    return state != PENDING


def state_is_final(state: int) -> bool:
    """The server wrote its last word: nothing of this load is copied after it."""
    return state not in (PENDING, CANCEL_REQ)


def state_is_success(state: int) -> bool:
    return state == SUCCESS


_CAS8: list = []


def _cas8():
    """bool __atomic_compare_exchange_8(void *p, void *expected, u64 desired, int success,
    int failure) from libatomic (GCC's runtime), or None where it is missing."""
    if not _CAS8:
        f = None
        try:
            f = ctypes.CDLL("libatomic.so.1").__atomic_compare_exchange_8
            f.restype = ctypes.c_bool
            f.argtypes = [c_void_p, c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):
            f = None
        _CAS8.append(f)
    return _CAS8[0]


class ShmLoadState:
    """Pure-Python load state (creator owns and unlinks the object)."""

    def __init__(self, name: str, fd: int, owner: bool):
        self.name = name
        self._owner = owner
        try:
            self._mm = mmap.mmap(fd, SHM_SIZE, mmap.MAP_SHARED,
                                 mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        off = struct.unpack_from("=Q", self._mm, 0)[0]
        if off % 8 or off + 16 > SHM_SIZE:
            self._mm.close()
            raise ValueError(f"load state {name}: bad record offset {off}")
        magic, version = struct.unpack_from("=II", self._mm, off)
        if magic != MAGIC or version != VERSION:
            self._mm.close()
            raise ValueError(f"load state {name}: bad magic/version {magic:#x}/{version}")
        self._state = ctypes.c_int64.from_buffer(self._mm, off + 8)

    @classmethod
    def create(cls) -> "ShmLoadState":
        name = f"pega_load_{uuid.uuid4().hex}"
        fd = os.open(os.path.join(SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, SHM_SIZE)
            hdr = struct.pack("=Q", RECORD_OFFSET) + struct.pack("=IIq", MAGIC, VERSION, PENDING)
            os.pwrite(fd, hdr, 0)
        except BaseException:
            os.close(fd)
            os.unlink(os.path.join(SHM_DIR, name))
            raise
        return cls(name, fd, owner=True)

    @classmethod
    def attach(cls, name: str) -> "ShmLoadState":
        """Open an existing record by name (with or without the leading '/')."""
        name = name.lstrip("/")
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
        st = os.fstat(fd)
        if st.st_size < SHM_SIZE:
            os.close(fd)
            raise ValueError(f"load state {name}: object is {st.st_size} bytes, "
                             f"need {SHM_SIZE}")
        return cls(name, fd, owner=False)

    def get(self) -> int:
        if self._state is None:
            raise ValueError("load state closed")
        return int(self._state.value)

    def cancel(self) -> int:
        """Ask the server to stop: 0 -> 2, with an atomic compare-and-swap on the mapping
        (libatomic's __atomic_compare_exchange_8, what C11 atomic_compare_exchange_strong
        compiles to). Returns 2 (asked now or before) or the final value found."""
        if self._state is None:
            raise ValueError("load state closed")
        cas = _cas8()
        if cas is None:  # no libatomic: cannot ask safely; wait for the server's own end
            return int(self._state.value)
        expect = ctypes.c_int64(PENDING)
        if cas(ctypes.addressof(self._state), ctypes.addressof(expect), CANCEL_REQ, 4, 2):
            return CANCEL_REQ
        return int(expect.value)

    def set(self, state: int) -> None:
        """Writer side (the server's role; used by in-process fakes)."""
        self._state.value = int(state)

    def close(self) -> None:
        st, self._state = getattr(self, "_state", None), None
        if st is None:
            return
        del st
        self._mm.close()
        if self._owner:
            try:
                os.unlink(os.path.join(SHM_DIR, self.name))
            except FileNotFoundError:
                pass

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


class CLoadState:
    """libpegaflow's pf_loadstate_* record."""

    def __init__(self, lib):
        self._lib = lib
        h = c_void_p()
        rc = lib.fn("pf_loadstate_create")(byref(h))
        if rc:
            from pegaflow.client.errors import error_for

            code, msg = lib.last_error()
            raise error_for("pf_loadstate_create", rc, code, msg or os.strerror(-rc))
        self._h = h
        self.name = lib.fn("pf_loadstate_name")(h).decode()

    def get(self) -> int:
        if not self._h:
            raise ValueError("load state closed")
        return int(self._lib.fn("pf_loadstate_get")(self._h))

    def cancel(self) -> int:
        if not self._h:
            raise ValueError("load state closed")
        if not self._lib.has("pf_loadstate_cancel"):
            return int(self.get())  # an older library: cannot ask, wait for the server
        return int(self._lib.fn("pf_loadstate_cancel")(self._h))

    def close(self) -> None:
        h, self._h = self._h, None
        if h:
            self._lib.fn("pf_loadstate_destroy")(h)

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


def create_load_state(lib=None):
    """A fresh load state: the library's when it has pf_loadstate_*, else ours."""
    if lib is not None and lib.has("pf_loadstate_create", "pf_loadstate_name",
                                   "pf_loadstate_get", "pf_loadstate_destroy"):
        return CLoadState(lib)
    return ShmLoadState.create()
