"""Python face of libpegaflow's Engine client.

One EngineClient wraps one ``struct pf_client`` (thread-safe in C: several Python threads
may call concurrently; the GIL is released during each call). Every call carries a
deadline in milliseconds. Failures raise the classes of pegaflow.client.errors, except
``query``, which, like the reference client, turns UNAVAILABLE and DEADLINE_EXCEEDED into
a plain miss (``QueryResult.miss()``): a down server must cost a recompute, not an error.

The connector logic (scheduler.py, worker.py) depends only on the method names and
return types here, so tests substitute an in-memory fake with the same surface.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import struct
from ctypes import POINTER, byref, c_char_p, c_size_t, c_uint8, c_uint32, c_void_p
from dataclasses import dataclass, field
from array import array
from itertools import chain
from typing import Sequence

from pegaflow.client import _lib
from pegaflow.client.errors import error_for, is_unreachable

log = logging.getLogger("pegaflow.client")

TRANSFER_MODE_DIRECT = 0
TRANSFER_MODE_KERNEL = 1

DEFAULT_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class QueryResult:
    """QueryPrefetch answer: ``loading`` (ask again later) or Ready(num_hit_blocks, lease)."""

    loading: bool
    num_hit_blocks: int = 0
    lease: bytes = b""
    hit_positions: tuple[int, ...] = ()
    # a miss because the server could not be asked (not the server's answer)
    unreachable: bool = False

    @staticmethod
    def miss(unreachable: bool = True) -> "QueryResult":
        return QueryResult(loading=False, unreachable=unreachable)


@dataclass(frozen=True)
class LayerRegistration:
    """One layer of RegisterContextBatch (sizes in bytes; see pegaflow.h pf_layer_desc)."""

    name: str
    ipc: bytes
    num_blocks: int
    bytes_per_block: int
    kv_stride_bytes: int = 0
    segments: int = 1
    group_id: int = 0


@dataclass(frozen=True)
class SaveLayer:
    name: str
    block_ids: Sequence[int]
    block_hashes: Sequence[bytes]


@dataclass(frozen=True)
class LeaseLoad:
    """One lease of a Load: destination block ids per layer group (None = no target)."""

    lease: bytes
    block_ids_by_group: Sequence[Sequence[int | None]]


@dataclass
class RegisterArgs:
    instance_id: str
    namespace: str
    tp_rank: int
    tp_size: int
    world_size: int
    pp_rank: int
    device_id: int
    layers: list[LayerRegistration] = field(default_factory=list)
    transfer_mode: int = TRANSFER_MODE_DIRECT
    page_first: bool = False
    client_version: str | None = None  # None: the library's pf_client_version()


_NONE_TO_MINUS1 = {None: -1}  # .get(x, x): None -> -1, anything else unchanged


def _struct_of(cls, fields: list[tuple[str, str]]) -> struct.Struct:
    """struct layout of a ctypes Structure (fields as (name, code): "P" a pointer, "I" a
    uint32_t, "Q" a uint64_t / size_t), built from its offsets and checked against its
    size."""
    fmt, pos = "=", 0
    width = {"P": 8, "I": 4, "Q": 8}
    for name, code in fields:
        off = getattr(cls, name).offset
        fmt += f"{off - pos}x" if off > pos else ""
        fmt += "Q" if code == "P" else code
        pos = off + width[code]
    fmt += f"{ctypes.sizeof(cls) - pos}x" if ctypes.sizeof(cls) > pos else ""
    st = struct.Struct(fmt)
    if (st.size != ctypes.sizeof(cls) or ctypes.sizeof(c_void_p) != 8
            or ctypes.sizeof(c_size_t) != 8 or array("Q").itemsize != 8
            or array("I").itemsize != 4):
        raise ImportError(f"{cls.__name__} layout not as expected on this platform")
    return st


_ITEM = _struct_of(_lib.PfLoadItem, [("lease", "P"), ("lease_len", "I"), ("targets", "P"),
                                     ("group_counts", "P")])
_LAYER = _struct_of(_lib.PfSaveLayer, [("name", "P"), ("block_ids", "P"), ("hashes", "P"),
                                       ("hash_lens", "P"), ("hash_len", "I"), ("n", "Q")])


def _u8(buf: bytes):
    """(keepalive, uint8_t*) for a bytes object; NULL for empty input."""
    if not buf:
        return None, None
    arr = (c_uint8 * len(buf)).from_buffer_copy(buf)
    return arr, ctypes.cast(arr, POINTER(c_uint8))


def pack_hashes(hashes: Sequence[bytes]):
    """Concatenated hash buffer + (hash_lens array or None, hash_len) per pegaflow.h:
    (blob, pointer, lens keepalive, lens pointer, hash_len).

    No Python code runs per hash (join and map(len) iterate in C; the library reads the
    joined bytes in place: the pointer is the bytes object itself, passed as c_char_p),
    so the cost of a call does not grow with Python work per block. Each hash is a
    bytes-like object (vLLM's block hashes are bytes)."""
    if not isinstance(hashes, (list, tuple)):
        hashes = list(hashes)  # (an iterator is read once)
    if not hashes:
        return None, None, None, None, 0
    blob = b"".join(hashes)
    if not blob:
        return None, None, None, None, 0
    lens = set(map(len, hashes))
    if len(lens) == 1:
        return blob, blob, None, None, lens.pop()
    arr = _u32s(map(len, hashes))
    return blob, blob, arr, arr, 0


def _u32s(values) -> "ctypes.Array":
    """A uint32_t array of ``values`` (an iterable of ints), converted in C (array.array)
    and copied in one memcpy, not by ctypes' per-element constructor."""
    a = array("I", values)
    return (c_uint32 * len(a)).from_buffer_copy(a) if a else (c_uint32 * 1)()


class Session:
    """The liveness Session stream (pf_client_session_*). Close it, or let it be closed
    with the process: when this process dies the server drops the instance."""

    def __init__(self, lib: "_lib.Lib", handle: c_void_p):
        self._lib = lib
        self._h = handle

    def alive(self) -> bool:
        if not self._h:
            return False
        return bool(self._lib.fn("pf_client_session_alive")(self._h))

    def close(self) -> None:
        h, self._h = self._h, None
        if h:
            self._lib.fn("pf_client_session_close")(h)


class EngineClient:
    """Client of one pegaflow-server. ``target`` is "host:port" or "http://host:port";
    the connection is made lazily by the library, so construction never blocks."""

    def __init__(self, target: str, *, lib: "_lib.Lib | None" = None,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS, query_timeout_ms: int | None = None):
        self._lib = lib if lib is not None else _lib.load_library()
        self.target = target
        self.timeout_ms = int(timeout_ms)
        self.query_timeout_ms = int(query_timeout_ms if query_timeout_ms is not None
                                    else timeout_ms)
        h = c_void_p()
        rc = self._lib.fn("pf_client_connect")(target.encode(), byref(h))
        if rc:
            self._raise("pf_client_connect", rc)
        self._h = h

    # ---------------------------------------------------------------- plumbing

    @property
    def lib(self) -> "_lib.Lib":
        return self._lib

    def _raise(self, method: str, rc: int):
        code, msg = self._lib.last_error()
        raise error_for(method, rc, code, msg)

    def _check(self, method: str, rc: int) -> None:
        if rc:
            self._raise(method, rc)

    def _t(self, timeout_ms: int | None) -> int:
        return self.timeout_ms if timeout_ms is None else int(timeout_ms)

    def close(self) -> None:
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._lib.fn("pf_client_close")(h)

    def __del__(self):  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass

    def version(self) -> str:
        return self._lib.version()

    # ---------------------------------------------------------------- RPCs

    def health(self, timeout_ms: int | None = None) -> None:
        self._check("pf_client_health", self._lib.fn("pf_client_health")(self._h, self._t(timeout_ms)))

    def shutdown_server(self, timeout_ms: int | None = None) -> None:
        self._check("pf_client_shutdown",
                    self._lib.fn("pf_client_shutdown")(self._h, self._t(timeout_ms)))

    def register(self, a: RegisterArgs, timeout_ms: int | None = None) -> None:
        f = self._lib.fn("pf_client_register")
        keep = []
        descs = (_lib.PfLayerDesc * max(1, len(a.layers)))()
        for i, layer in enumerate(a.layers):
            k, p = _u8(layer.ipc)
            keep.append(k)
            d = descs[i]
            d.name = layer.name.encode()
            d.ipc = p
            d.ipc_len = len(layer.ipc)
            d.num_blocks = layer.num_blocks
            d.bytes_per_block = layer.bytes_per_block
            d.kv_stride_bytes = layer.kv_stride_bytes
            d.segments = layer.segments
            d.group_id = layer.group_id
        args = _lib.PfRegisterArgs()
        args.instance_id = a.instance_id.encode()
        args.namespace_ = a.namespace.encode()
        args.tp_rank = a.tp_rank
        args.tp_size = a.tp_size
        args.world_size = a.world_size
        args.pp_rank = a.pp_rank
        args.device_id = a.device_id
        args.transfer_mode = a.transfer_mode
        args.page_first = 1 if a.page_first else 0
        args.client_version = a.client_version.encode() if a.client_version is not None else None
        args.layers = ctypes.cast(descs, POINTER(_lib.PfLayerDesc))
        args.nlayers = len(a.layers)
        self._check("pf_client_register", f(self._h, byref(args), self._t(timeout_ms)))

    def save(self, instance_id: str, tp_rank: int, pp_rank: int, device_id: int,
             layers: Sequence[SaveLayer], timeout_ms: int | None = None) -> None:
        f = self._lib.fn("pf_client_save")
        # The connector passes every layer of a group the same id and hash sequences:
        # marshal each distinct sequence once per call, not once per layer, into buffers
        # converted in C (array.array), and pack one pf_save_layer per layer with
        # pointers into them (one struct.pack_into per layer, no ctypes object each).
        names = [layer.name.encode() for layer in layers]
        name_buf = array("B", b"\0".join(names) + b"\0")
        na = name_buf.buffer_info()[0]
        bufs: dict[int, tuple] = {}  # id(sequence) -> (its buffers, addresses...)
        keep = []
        buf = bytearray(_LAYER.size * max(1, len(layers)))
        noff = 0
        for i, layer in enumerate(layers):
            bids, bhs = layer.block_ids, layer.block_hashes
            if len(bids) != len(bhs):
                raise ValueError(f"save layer {layer.name}: {len(bids)} block ids "
                                 f"but {len(bhs)} hashes")
            ids = bufs.get(id(bids))
            if ids is None:
                a = array("I", bids)
                ids = bufs[id(bids)] = (a, a.buffer_info()[0])
                keep.append(bids)  # the id() keys stay valid while the call runs
            hs = bufs.get(id(bhs))
            if hs is None:
                blob, _, lens, _, hlen = pack_hashes(bhs)
                hb = array("B", blob or b"")
                hs = bufs[id(bhs)] = ((hb, lens), hb.buffer_info()[0] if blob else 0,
                                      ctypes.addressof(lens) if lens is not None else 0, hlen)
                keep.append(bhs)
            _LAYER.pack_into(buf, i * _LAYER.size, na + noff, ids[1], hs[1], hs[2], hs[3],
                             len(bids))
            noff += len(names[i]) + 1
        arr = (_lib.PfSaveLayer * max(1, len(layers))).from_buffer(buf)
        self._check("pf_client_save",
                    f(self._h, instance_id.encode(), tp_rank, pp_rank, device_id, arr,
                      len(layers), self._t(timeout_ms)))
        del name_buf, bufs, keep  # (alive until the call returned)

    def query_raw(self, instance_id: str, req_id: str, hashes: Sequence[bytes], *,
                  wait_for_full_prefix: bool = False, group_id: int = 0,
                  hit_cap: int = 0, timeout_ms: int | None = None) -> QueryResult:
        """QueryPrefetch; every failure raises (see ``query`` for the miss mapping)."""
        f = self._lib.fn("pf_client_query")
        if not isinstance(hashes, (list, tuple)):
            hashes = list(hashes)
        blob, _, lens, _, hlen = pack_hashes(hashes)
        res = _lib.PfQueryResult()
        pos = (c_uint32 * hit_cap)() if hit_cap else None
        rc = f(self._h, instance_id.encode(), req_id.encode(), blob, lens, hlen, len(hashes),
               1 if wait_for_full_prefix else 0, group_id, byref(res), pos, hit_cap,
               self.query_timeout_ms if timeout_ms is None else int(timeout_ms))
        if rc:
            self._raise("pf_client_query", rc)
        if res.loading:
            return QueryResult(loading=True)
        lease = bytes(res.lease[: min(res.lease_len, _lib.PF_LEASE_LEN)])
        hits = tuple(pos[: min(hit_cap, res.nhit_positions)]) if pos is not None else ()
        return QueryResult(False, int(res.num_hit_blocks), lease, hits)

    def query(self, instance_id: str, req_id: str, hashes: Sequence[bytes], *,
              wait_for_full_prefix: bool = False, group_id: int = 0,
              timeout_ms: int | None = None) -> QueryResult:
        """QueryPrefetch with the reference client's contract: UNAVAILABLE and
        DEADLINE_EXCEEDED become a miss (Ready 0, no lease); other errors raise. Groups
        > 0 return every hit position (membership answers)."""
        try:
            return self.query_raw(instance_id, req_id, hashes,
                                  wait_for_full_prefix=wait_for_full_prefix,
                                  group_id=group_id, timeout_ms=timeout_ms,
                                  hit_cap=len(hashes) if group_id else 0)
        except Exception as e:
            if is_unreachable(e):
                log.debug("query %s: server unreachable, treated as a miss: %s", req_id, e)
                return QueryResult.miss()
            raise

    def release(self, lease: bytes, timeout_ms: int | None = None) -> None:
        f = self._lib.fn("pf_client_release")
        lease = lease if type(lease) is bytes else bytes(lease)
        self._check("pf_client_release",
                    f(self._h, lease or None, len(lease), self._t(timeout_ms)))

    def load(self, instance_id: str, tp_rank: int, device_id: int, load_state_shm: str,
             groups: Sequence[Sequence[str]], loads: Sequence[LeaseLoad],
             timeout_ms: int | None = None) -> None:
        f = self._lib.fn("pf_client_load")
        names = [n.encode() for g in groups for n in g]
        name_arr = (c_char_p * max(1, len(names)))(*names)
        gsizes = (c_size_t * max(1, len(groups)))(*map(len, groups))
        ng = len(groups)
        bgs = [ll.block_ids_by_group for ll in loads]
        for i, bg in enumerate(bgs):
            if len(bg) != ng:
                raise ValueError(f"load item {i}: {len(bg)} target groups "
                                 f"for {ng} layer groups")
        # Three flat buffers for every item (targets as int64 with None -> -1, the target
        # counts per item and group, the leases joined), each converted in C, and one
        # pf_load_item per item packed with pointers into them: no ctypes object and no
        # Python per block, one struct.pack_into per item.
        counts = array("Q", [len(g) for bg in bgs for g in bg])
        flat = list(chain.from_iterable(chain.from_iterable(bgs)))
        try:
            targets = array("q", flat)
        except TypeError:  # None targets (no destination)
            targets = array("q", map(_NONE_TO_MINUS1.get, flat, flat))
        leases = [ll.lease if type(ll.lease) is bytes else bytes(ll.lease) for ll in loads]
        joined = array("B", b"".join(leases))
        la, ta, ca = (joined.buffer_info()[0], targets.buffer_info()[0],
                      counts.buffer_info()[0])
        buf = bytearray(_ITEM.size * max(1, len(loads)))
        loff = toff = 0
        for i, lease in enumerate(leases):
            n = len(lease)
            _ITEM.pack_into(buf, i * _ITEM.size, la + loff if n else 0, n,
                            ta + toff * 8, ca + i * ng * 8)
            loff += n
            toff += sum(counts[i * ng:(i + 1) * ng])
        items = (_lib.PfLoadItem * max(1, len(loads))).from_buffer(buf)
        self._check("pf_client_load",
                    f(self._h, instance_id.encode(), tp_rank, device_id, load_state_shm.encode(),
                      name_arr, gsizes, len(groups), items, len(loads), self._t(timeout_ms)))

    def unregister(self, instance_id: str, timeout_ms: int | None = None) -> None:
        self._check("pf_client_unregister",
                    self._lib.fn("pf_client_unregister")(self._h, instance_id.encode(),
                                                         self._t(timeout_ms)))

    def open_session(self, instance_id: str, namespace: str, tp_size: int, world_size: int,
                     timeout_ms: int | None = None) -> Session:
        f = self._lib.fn("pf_client_session_open")
        s = c_void_p()
        self._check("pf_client_session_open",
                    f(self._h, instance_id.encode(), namespace.encode(), tp_size, world_size,
                      self._t(timeout_ms), byref(s)))
        return Session(self._lib, s)

    def reconnect(self) -> None:
        """Drop the channel's reconnect backoff (pf_client_reconnect): the next call tries
        to connect at once."""
        if self._lib.has("pf_client_reconnect"):
            self._lib.fn("pf_client_reconnect")(self._h)

    def fresh(self, timeout_ms: int = 1000) -> "EngineClient":
        """Another client to the same server on its own channel (no reconnect backoff
        inherited): to probe a server that was down (close it after)."""
        return EngineClient(self.target, lib=self._lib, timeout_ms=timeout_ms)

    def has_watch(self) -> bool:
        return self._lib.has("pf_client_watch_open")

    def open_watch(self, instance_id: str = "", timeout_ms: int | None = None) -> Session:
        """A watch Session: alive() turns False when the server process ends (a worker's
        signal to re-register, and proof that no Load of that process still copies)."""
        f = self._lib.fn("pf_client_watch_open")
        s = c_void_p()
        self._check("pf_client_watch_open",
                    f(self._h, instance_id.encode(), self._t(timeout_ms), byref(s)))
        return Session(self._lib, s)


# ------------------------------------------------------------------ IpcTensor builders


def _build(lib: "_lib.Lib", name: str, *args) -> bytes:
    f = lib.fn(name)
    cap = 256
    for _ in range(2):
        buf = (c_uint8 * cap)()
        n = c_size_t()
        rc = f(*args, ctypes.cast(buf, POINTER(c_uint8)), cap, byref(n))
        if rc == 0:
            return bytes(buf[: n.value])
        if rc == -errno.ENOSPC and n.value > cap:  # *len_p = needed
            cap = n.value
            continue
        code, msg = lib.last_error()
        raise error_for(name, rc, code, msg or "cannot build IpcTensor")
    raise RuntimeError(f"{name}: buffer size negotiation failed")


def ipc_cuda(lib: "_lib.Lib", uuid: bytes, handle: bytes, offset: int, size: int) -> bytes:
    """Serialized IpcTensor of kind CUDA_IPC (16-byte device UUID, 64-byte IPC handle)."""
    if len(uuid) != 16:
        raise ValueError(f"device UUID must be 16 bytes, got {len(uuid)}")
    if len(handle) != 64:
        raise ValueError(f"CUDA IPC handle must be 64 bytes, got {len(handle)}")
    u = (c_uint8 * 16).from_buffer_copy(uuid)
    h = (c_uint8 * 64).from_buffer_copy(handle)
    return _build(lib, "pf_client_ipc_cuda", ctypes.cast(u, POINTER(c_uint8)),
                  ctypes.cast(h, POINTER(c_uint8)), offset, size)


def ipc_sim(lib: "_lib.Lib", shm_name: str, sim_device: int, offset: int, size: int) -> bytes:
    """Serialized IpcTensor of kind SIM_SHM."""
    return _build(lib, "pf_client_ipc_sim", shm_name.encode(), sim_device, offset, size)
