"""ctypes declarations of libpegaflow (src/client/pegaflow.h) and how the library is found.

The structures and prototypes below mirror pegaflow.h field by field; tests compile a C
program against the header and compare every offset and size with these classes, and
compare the list of functions declared in the header with PROTOTYPES.

The library is loaded with ctypes.CDLL, so every foreign call releases the GIL.

Search order (first hit wins):
  1. $PEGAFLOW_LIB: a path to the .so, or a directory containing libpegaflow.so
  2. next to the package: pegaflow/lib/libpegaflow.so, pegaflow/libpegaflow.so
  3. the system library path: ctypes.util.find_library("pegaflow"), then dlopen of
     "libpegaflow.so" (LD_LIBRARY_PATH, ld.so.cache, default directories)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from ctypes import (
    POINTER,
    Structure,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint32,
    c_uint64,
    c_void_p,
)

from pegaflow.client.errors import LibraryError

LIB_BASENAME = "libpegaflow.so"
PF_LEASE_LEN = 16


# ------------------------------------------------------------------ structures


class PfLayerDesc(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("ipc", POINTER(c_uint8)),
        ("ipc_len", c_size_t),
        ("num_blocks", c_uint64),
        ("bytes_per_block", c_uint64),
        ("kv_stride_bytes", c_uint64),
        ("segments", c_uint32),
        ("group_id", c_uint32),
    ]


class PfRegisterArgs(Structure):
    _fields_ = [
        ("instance_id", c_char_p),
        ("namespace_", c_char_p),
        ("tp_rank", c_uint32),
        ("tp_size", c_uint32),
        ("world_size", c_uint32),
        ("pp_rank", c_uint32),
        ("device_id", c_int32),
        ("transfer_mode", c_int),
        ("page_first", c_int),
        ("client_version", c_char_p),
        ("layers", POINTER(PfLayerDesc)),
        ("nlayers", c_size_t),
    ]


# Byte buffers the calls only read (hashes, leases) are declared c_char_p (const uint8_t*
# in C: the same pointer), so a bytes object is passed, or stored in a structure, as a
# pointer to its own buffer: no copy and no ctypes.cast on the hot path (engine.py).


class PfSaveLayer(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("block_ids", POINTER(c_uint32)),
        ("hashes", c_char_p),
        ("hash_lens", POINTER(c_uint32)),
        ("hash_len", c_uint32),
        ("n", c_size_t),
    ]


class PfQueryResult(Structure):
    _fields_ = [
        ("loading", c_int),
        ("num_hit_blocks", c_uint32),
        ("lease_len", c_uint32),
        ("lease", c_uint8 * PF_LEASE_LEN),
        ("nhit_positions", c_uint32),
    ]


class PfLoadItem(Structure):
    _fields_ = [
        ("lease", c_char_p),
        ("lease_len", c_uint32),
        ("targets", POINTER(c_int64)),
        ("group_counts", POINTER(c_size_t)),
    ]


STRUCTS = {
    "pf_layer_desc": PfLayerDesc,
    "pf_register_args": PfRegisterArgs,
    "pf_save_layer": PfSaveLayer,
    "pf_query_result": PfQueryResult,
    "pf_load_item": PfLoadItem,
}

# Opaque handles are passed as void*.
_client_p = c_void_p
_session_p = c_void_p
_loadstate_p = c_void_p
_simkv_p = c_void_p

# name -> (restype, argtypes), in header order.
PROTOTYPES: dict[str, tuple[object, list[object]]] = {
    "pf_client_version": (c_char_p, []),
    "pf_client_connect": (c_int, [c_char_p, POINTER(_client_p)]),
    "pf_client_close": (None, [_client_p]),
    "pf_client_health": (c_int, [_client_p, c_uint64]),
    "pf_client_shutdown": (c_int, [_client_p, c_uint64]),
    "pf_client_register": (c_int, [_client_p, POINTER(PfRegisterArgs), c_uint64]),
    "pf_client_save": (
        c_int,
        [_client_p, c_char_p, c_uint32, c_uint32, c_int32, POINTER(PfSaveLayer), c_size_t,
         c_uint64],
    ),
    "pf_client_query": (
        c_int,
        [_client_p, c_char_p, c_char_p, c_char_p, POINTER(c_uint32), c_uint32,
         c_size_t, c_int, c_uint32, POINTER(PfQueryResult), POINTER(c_uint32), c_size_t,
         c_uint64],
    ),
    "pf_client_release": (c_int, [_client_p, c_char_p, c_uint32, c_uint64]),
    "pf_client_load": (
        c_int,
        [_client_p, c_char_p, c_uint32, c_int32, c_char_p, POINTER(c_char_p),
         POINTER(c_size_t), c_size_t, POINTER(PfLoadItem), c_size_t, c_uint64],
    ),
    "pf_client_unregister": (c_int, [_client_p, c_char_p, c_uint64]),
    "pf_client_session_open": (
        c_int, [_client_p, c_char_p, c_char_p, c_uint32, c_uint32, c_uint64, POINTER(_session_p)]
    ),
    "pf_client_watch_open": (c_int, [_client_p, c_char_p, c_uint64, POINTER(_session_p)]),
    "pf_client_reconnect": (None, [_client_p]),
    "pf_client_session_alive": (c_int, [_session_p]),
    "pf_client_session_close": (None, [_session_p]),
    "pf_loadstate_create": (c_int, [POINTER(_loadstate_p)]),
    "pf_loadstate_name": (c_char_p, [_loadstate_p]),
    "pf_loadstate_get": (c_int64, [_loadstate_p]),
    "pf_loadstate_wait": (c_int64, [_loadstate_p, c_uint64]),
    "pf_loadstate_cancel": (c_int64, [_loadstate_p]),
    "pf_loadstate_destroy": (None, [_loadstate_p]),
    "pf_client_ipc_cuda": (
        c_int,
        [POINTER(c_uint8), POINTER(c_uint8), c_uint64, c_uint64, POINTER(c_uint8), c_size_t,
         POINTER(c_size_t)],
    ),
    "pf_client_ipc_sim": (
        c_int,
        [c_char_p, c_int, c_uint64, c_uint64, POINTER(c_uint8), c_size_t, POINTER(c_size_t)],
    ),
    "pf_simkv_create": (c_int, [c_uint64, c_int, POINTER(_simkv_p)]),
    "pf_simkv_ptr": (c_void_p, [_simkv_p]),
    "pf_simkv_size": (c_uint64, [_simkv_p]),
    "pf_simkv_name": (c_char_p, [_simkv_p]),
    "pf_simkv_ipc": (
        c_int,
        [_simkv_p, c_uint64, c_uint64, POINTER(c_uint8), c_size_t, POINTER(c_size_t)],
    ),
    "pf_simkv_destroy": (None, [_simkv_p]),
    "pf_last_error_code": (c_int, []),
    "pf_last_error_message": (c_char_p, []),
}

# Functions without which the binding cannot work at all.
REQUIRED = ("pf_client_version", "pf_client_connect", "pf_client_close",
            "pf_last_error_code", "pf_last_error_message")


class Lib:
    """A loaded libpegaflow with every prototype it exports declared.

    Functions the library lacks (an older build) are recorded in ``missing``; calling
    ``fn(name)`` for one raises LibraryError naming it, so a partial library can still be
    used for what it has (tests skip on ``has``).
    """

    def __init__(self, cdll: ctypes.CDLL, path: str):
        self._cdll = cdll
        self.path = path
        self._fns: dict[str, object] = {}
        self.missing: list[str] = []
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                f = getattr(cdll, name)
            except AttributeError:
                self.missing.append(name)
                continue
            f.restype = restype
            f.argtypes = argtypes
            self._fns[name] = f
        absent = [n for n in REQUIRED if n in self.missing]
        if absent:
            raise LibraryError(f"{path} is not libpegaflow: it lacks {', '.join(absent)}")

    def has(self, *names: str) -> bool:
        return all(n in self._fns for n in names)

    def fn(self, name: str):
        f = self._fns.get(name)
        if f is None:
            raise LibraryError(
                f"{self.path} lacks {name}: this libpegaflow is older than the connector "
                f"(rebuild it with `make`, or point PEGAFLOW_LIB at a current build)"
            )
        return f

    def version(self) -> str:
        return self.fn("pf_client_version")().decode()

    def last_error(self) -> tuple[int, str]:
        code = self.fn("pf_last_error_code")()
        msg = self.fn("pf_last_error_message")()
        return int(code), (msg.decode(errors="replace") if msg else "")


def _package_dir() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def candidates(env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(where, what to dlopen) in search order."""
    env = os.environ if env is None else env
    out: list[tuple[str, str]] = []
    v = env.get("PEGAFLOW_LIB")
    if v:
        path = os.path.join(v, LIB_BASENAME) if os.path.isdir(v) else v
        out.append(("$PEGAFLOW_LIB", path))
    pkg = _package_dir()
    out.append(("next to the package", os.path.join(pkg, "lib", LIB_BASENAME)))
    out.append(("next to the package", os.path.join(pkg, LIB_BASENAME)))
    found = ctypes.util.find_library("pegaflow")
    if found:
        out.append(("system (ctypes.util.find_library)", found))
    out.append(("system library path (dlopen)", LIB_BASENAME))
    return out


_lock = threading.Lock()
_cached: Lib | None = None


def load_library(path: str | None = None, env: dict[str, str] | None = None) -> Lib:
    """Load libpegaflow (once per process unless ``path`` is given).

    Raises LibraryError listing every place searched and why each failed.
    """
    global _cached
    if path is not None:
        try:
            return Lib(ctypes.CDLL(path), path)
        except OSError as e:
            raise LibraryError(f"cannot load libpegaflow from {path}: {e}") from e
    with _lock:
        if _cached is not None and env is None:
            return _cached
        tried: list[str] = []
        for where, cand in candidates(env):
            if os.sep in cand and not os.path.exists(cand):
                tried.append(f"  {where}: {cand} (no such file)")
                continue
            try:
                lib = Lib(ctypes.CDLL(cand), cand)
            except OSError as e:
                tried.append(f"  {where}: {cand} ({e})")
                continue
            except LibraryError as e:
                tried.append(f"  {where}: {cand} ({e})")
                continue
            if env is None:
                _cached = lib
            return lib
        raise LibraryError(
            "libpegaflow not found. Build it with `make` (build/rel/lib/libpegaflow.so) and "
            "set PEGAFLOW_LIB to it, copy it into the package's pegaflow/lib/, or install it "
            "on the system library path. Searched:\n" + "\n".join(tried)
        )


def reset_cache() -> None:
    """Forget the cached library (tests)."""
    global _cached
    with _lock:
        _cached = None
