"""In-memory models used by the unit tests.

FakeServer is a faithful model of pegaflow-server's Engine semantics as the connector
sees them (reference §2.1-2.6): strict version check, topology/sealing, save visibility
only when every slot of a block is stored, prefix queries with 16-byte leases that pin
blocks, expire after 600 s (fake clock) and are consumed once per worker of the
instance, Loading answers, load_state_shm written through the real shm layout, instance
cleanup, and fault switches (down = UNAVAILABLE everywhere, one-shot failures, load
completion modes). It moves real bytes: tensors are numpy arrays (HostTensor) registered
through HostDeviceAdapter, so the step-loop harness can check loaded blocks byte by byte
without the C server.

Hybrid storage groups (layer_group_ids): a block of group g is complete when every
(layer of g, tp rank) slot is stored; keys of groups > 0 carry the 4-byte big-endian group
id; group > 0 queries are membership queries (hit_positions, a lease of exactly those
blocks) or, with wait_for_full_prefix, all-or-nothing want-sets. Page-first instances
(MLA): a save must cover every layer of the worker's shard with one block list.
``slot_writes`` counts the bytes copies per key (a block stored once has one per slot).

FakeEngineClient exposes exactly EngineClient's method surface (and its query miss
mapping); one per simulated process, all sharing one FakeServer.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pegaflow.client.engine import QueryResult
from pegaflow.client.errors import (
    DEADLINE_EXCEEDED,
    FAILED_PRECONDITION,
    INTERNAL,
    INVALID_ARGUMENT,
    UNAVAILABLE,
    error_for,
    is_unreachable,
)
from pegaflow.client.loadstate import ShmLoadState
from pegaflow.device.base import ReadyFence, TensorInfo, describe

SERVER_VERSION = "0.23.12"
LEASE_TTL_S = 600.0


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, dt: float) -> None:
        self.t += dt


# ------------------------------------------------------------------ host "GPU" tensors

_registry: dict[int, "HostTensor"] = {}
_ids = itertools.count(1)


class HostTensor:
    """torch-shaped view of a numpy array (the "GPU memory" of the fake backend)."""

    def __init__(self, array: np.ndarray, device: int = 0):
        if not array.flags.c_contiguous:
            raise ValueError("HostTensor needs a C-contiguous array")
        self._a = array
        self.dev = device
        self.id = next(_ids)
        _registry[self.id] = self
        self.shape = array.shape
        self.dtype = array.dtype

    def stride(self):
        return tuple(s // self._a.itemsize for s in self._a.strides)

    def element_size(self):
        return self._a.itemsize

    def storage_offset(self):
        return 0

    def storage_nbytes(self):
        return self._a.nbytes

    def numpy(self) -> np.ndarray:
        return self._a

    def raw(self) -> np.ndarray:
        return self._a.reshape(-1).view(np.uint8)


class FakeTensor:
    """Geometry only (layout tests): shape, strides (elements), element size."""

    def __init__(self, shape, stride=None, elt=2, storage_offset=0, nbytes=None):
        self.shape = tuple(shape)
        if stride is None:
            stride, acc = [], 1
            for s in reversed(self.shape):
                stride.append(acc)
                acc *= s
            stride = tuple(reversed(stride))
        self._stride = tuple(stride)
        self._elt = elt
        self._off = storage_offset
        span = 1 + sum((a - 1) * b for a, b in zip(self.shape, self._stride))
        self._nbytes = nbytes if nbytes is not None else (span + storage_offset) * elt

    def stride(self):
        return self._stride

    def element_size(self):
        return self._elt

    def storage_offset(self):
        return self._off

    def storage_nbytes(self):
        return self._nbytes


class HostDeviceAdapter:
    kind = "host"

    def __init__(self, device: int = 0):
        self._dev = device
        self.syncs = 0
        self.fences = 0

    def device_id(self) -> int:
        return self._dev

    def tensor_info(self, t) -> TensorInfo:
        return describe(t)

    def export_ipc(self, t) -> bytes:
        if isinstance(t, HostTensor):
            return b"host:%d" % t.id
        return b"fake:%d" % id(t)

    def save_fence(self) -> ReadyFence:
        # host "kernels" are synchronous numpy writes
        self.fences += 1
        return ReadyFence()

    def synchronize(self) -> None:
        self.syncs += 1


# ------------------------------------------------------------------ server model


@dataclass
class _Layer:
    name: str
    tensor: HostTensor | None
    num_blocks: int
    bpb: int
    kv_stride: int
    segments: int
    group: int = 0

    @property
    def block_stride(self) -> int:
        if self.segments == 2 and self.kv_stride > self.bpb:
            return self.bpb
        return self.bpb * self.segments

    def read(self, b: int) -> bytes:
        raw = self.tensor.raw()
        base = b * self.block_stride
        return b"".join(raw[base + s * self.kv_stride: base + s * self.kv_stride + self.bpb]
                        .tobytes() for s in range(self.segments))

    def write(self, b: int, data: bytes) -> None:
        raw = self.tensor.raw()
        base = b * self.block_stride
        for s in range(self.segments):
            chunk = np.frombuffer(data[s * self.bpb:(s + 1) * self.bpb], dtype=np.uint8)
            raw[base + s * self.kv_stride: base + s * self.kv_stride + self.bpb] = chunk


@dataclass
class _Worker:
    device_id: int
    tp_rank: int
    pp_rank: int
    layers: dict[str, _Layer]


@dataclass
class _Instance:
    namespace: str
    tp_size: int
    world_size: int
    workers: dict[int, _Worker] = field(default_factory=dict)
    page_first: bool = False

    @property
    def sealed(self) -> bool:
        return len(self.workers) >= self.world_size

    def slots(self, group: int = 0) -> set[tuple[str, int]]:
        return {(name, w.tp_rank) for w in self.workers.values()
                for name, l in w.layers.items() if l.group == group}

    def groups(self) -> set[int]:
        return {l.group for w in self.workers.values() for l in w.layers.values()}


def group_key(h: bytes, group: int) -> bytes:
    return bytes(h) if group == 0 else bytes(h) + group.to_bytes(4, "big")


@dataclass
class _Lease:
    instance_id: str
    keys: list[tuple[str, bytes]]
    shares: int
    expiry: float
    group: int = 0


class FakeServer:
    def __init__(self, clock=None, version: str = SERVER_VERSION):
        self.clock = clock or FakeClock()
        self.version = version
        self.instances: dict[str, _Instance] = {}
        self.blocks: dict[tuple[str, bytes], dict[tuple[str, int], bytes]] = {}
        self.leases: dict[bytes, _Lease] = {}
        self.down = False
        self.slow = False  # every call exceeds its deadline
        self.save_delay_s = 0.0  # a Save waits this long before it reads the GPU blocks
        self.fail_next: dict[str, Any] = {}  # method -> exception (one shot)
        self.loading: dict[str, int] = {}  # req_id -> Loading answers still to give
        self.load_mode = "complete"  # complete | error | never | stall
        # "stall": the copies wait for run_stalled(), which (like the real load thread,
        # src/engine/gpu_worker.c run_batch with load.c's cancel_fn) reads the state
        # first and, finding a cancel asked (2), copies nothing and confirms -2
        self.stalled: list[tuple[ShmLoadState, list]] = []
        self.watch = False  # offer watch Sessions (EngineClient.open_watch)
        self.life = 0  # the server process incarnation; restart() starts the next
        self.sessions: dict[str, int] = {}
        # opens an IpcTensor that is not a HostTensor's ("host:<id>") into its memory (a
        # uint8 array), as the server's GPU backend would (faketorch.server_open)
        self.ipc_open = None
        self.calls: list[tuple[str, dict]] = []
        self.pending_states: list[ShmLoadState] = []
        self.slot_writes: dict[tuple[str, bytes], int] = {}

    # helpers
    def _gate(self, method: str, **kw) -> None:
        self.calls.append((method, kw))
        if self.down:
            raise error_for(f"pf_client_{method}", -111, UNAVAILABLE,
                            "failed to connect to all addresses")
        if self.slow:
            raise error_for(f"pf_client_{method}", -110, DEADLINE_EXCEEDED, "Deadline Exceeded")
        exc = self.fail_next.pop(method, None)
        if exc is not None:
            raise exc

    def _sweep(self) -> None:
        now = self.clock()
        for k in [k for k, v in self.leases.items() if v.expiry <= now]:
            del self.leases[k]

    def _inst(self, method: str, instance_id: str) -> _Instance:
        inst = self.instances.get(instance_id)
        if inst is None:
            raise error_for(method, -1, FAILED_PRECONDITION, f"instance {instance_id} not found")
        return inst

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.calls if m == method)

    def stored(self, namespace: str, h: bytes) -> bool:
        return (namespace, h) in self.blocks

    def drop_instance(self, instance_id: str) -> None:
        self.instances.pop(instance_id, None)
        for k in [k for k, v in self.leases.items() if v.instance_id == instance_id]:
            del self.leases[k]

    def restart(self) -> None:
        """The server process died and a new one started: nothing registered, no lease,
        no Session; the old process's stalled loads never copy nor confirm."""
        self.life += 1
        self.instances.clear()
        self.leases.clear()
        self.sessions.clear()
        for st, _ in self.stalled:
            st.close()
        self.stalled = []

    def run_stalled(self) -> None:
        for st, copies in self.stalled:
            if st.get() == 2:
                st.set(-2)
            else:
                for lay, b, data in copies:
                    if lay.tensor is not None:
                        lay.write(b, data)
                st.set(1)
            st.close()
        self.stalled = []

    def open_watch(self, instance_id):
        self._gate("watch_open", instance_id=instance_id)
        return FakeWatch(self, self.life)

    def complete_pending(self, state: int = 1) -> None:
        for s in self.pending_states:
            s.set(state)
            s.close()
        self.pending_states = []

    # RPCs
    def register(self, a) -> None:
        m = "pf_client_register"
        self._gate("register", args=a)
        version = a.client_version if a.client_version is not None else self.version
        if version != self.version:
            raise error_for(m, -1, FAILED_PRECONDITION, "PegaFlow version mismatch: client="
                            f"{version or '<missing>'} server={self.version}")
        if a.device_id < 0 or a.tp_size <= 0 or a.world_size <= 0 or a.tp_rank >= a.tp_size:
            raise error_for(m, -22, INVALID_ARGUMENT, "bad topology")
        if not a.layers:
            raise error_for(m, -22, INVALID_ARGUMENT, "no layers")
        inst = self.instances.get(a.instance_id)
        if inst is None:
            inst = self.instances[a.instance_id] = _Instance(a.namespace, a.tp_size, a.world_size,
                                                             page_first=bool(a.page_first))
        elif (inst.tp_size != a.tp_size or inst.world_size != a.world_size
              or inst.page_first != bool(a.page_first)):
            raise error_for(m, -1, FAILED_PRECONDITION, "topology mismatch")
        if a.device_id in inst.workers:
            raise error_for(m, -22, INVALID_ARGUMENT,
                            f"GPU context for device {a.device_id} already exists")
        if inst.sealed:
            raise error_for(m, -22, INVALID_ARGUMENT, "already fully registered")
        layers = {}
        for l in a.layers:
            t = None
            if l.ipc.startswith(b"host:"):
                t = _registry[int(l.ipc[5:])]
            elif self.ipc_open is not None:
                try:
                    t = HostTensor(self.ipc_open(l.ipc))
                except (KeyError, ValueError) as e:
                    raise error_for(m, -22, INVALID_ARGUMENT, f"layer {l.name}: {e}") from e
            if l.segments == 2 and l.kv_stride_bytes < l.bytes_per_block:
                raise error_for(m, -22, INVALID_ARGUMENT, "overlap")
            if a.page_first and (l.segments != 1 or l.group_id != 0):
                raise error_for(m, -22, INVALID_ARGUMENT, "page_first needs one segment, group 0")
            layers[l.name] = _Layer(l.name, t, l.num_blocks, l.bytes_per_block,
                                    l.kv_stride_bytes, l.segments, int(l.group_id))
        inst.workers[a.device_id] = _Worker(a.device_id, a.tp_rank, a.pp_rank, layers)

    def save(self, instance_id, tp_rank, pp_rank, device_id, layers) -> None:
        m = "pf_client_save"
        self._gate("save", instance_id=instance_id, device_id=device_id,
                   layers=[(l.name, list(l.block_ids), list(l.block_hashes)) for l in layers])
        if self.save_delay_s:
            import time

            time.sleep(self.save_delay_s)
        self._sweep()
        inst = self._inst(m, instance_id)
        if not inst.sealed:
            raise error_for(m, -22, INVALID_ARGUMENT, f"registration incomplete: "
                            f"{len(inst.workers)}/{inst.world_size} workers registered")
        w = inst.workers.get(device_id)
        if w is None or w.tp_rank != tp_rank or w.pp_rank != pp_rank:
            raise error_for(m, -1, FAILED_PRECONDITION, f"device {device_id} not registered")
        if inst.page_first:
            names = {sl.name for sl in layers}
            lists = {tuple(sl.block_ids) for sl in layers}
            if names != set(w.layers) or len(lists) != 1:
                raise error_for(m, -22, INVALID_ARGUMENT, "a page-first save must cover every "
                                "layer of its shard with one block list")
        for sl in layers:
            lay = w.layers.get(sl.name)
            if lay is None:
                raise error_for(m, -22, INVALID_ARGUMENT, f"layer {sl.name} not registered")
            if len(sl.block_ids) != len(sl.block_hashes):
                raise error_for(m, -22, INVALID_ARGUMENT, "length mismatch")
            slots = inst.slots(lay.group)
            for b, h in zip(sl.block_ids, sl.block_hashes):
                if not 0 <= b < lay.num_blocks:
                    raise error_for(m, -22, INVALID_ARGUMENT, f"block {b} out of range")
                key = (inst.namespace, group_key(h, lay.group))
                entry = self.blocks.get(key)
                if entry is not None and set(entry) >= slots:
                    continue  # resident
                data = lay.read(b) if lay.tensor is not None else b""
                self.blocks.setdefault(key, {})[(sl.name, w.tp_rank)] = data
                self.slot_writes[key] = self.slot_writes.get(key, 0) + 1

    def _complete(self, inst: _Instance, key: tuple[str, bytes], group: int = 0) -> bool:
        e = self.blocks.get(key)
        return e is not None and set(e) >= inst.slots(group)

    def query(self, instance_id, req_id, hashes, wait_for_full_prefix=False, group_id=0):
        m = "pf_client_query"
        self._gate("query", instance_id=instance_id, req_id=req_id, n=len(hashes), group=group_id)
        self._sweep()
        if not req_id:
            raise error_for(m, -22, INVALID_ARGUMENT, "req_id must not be empty")
        inst = self._inst(m, instance_id)
        if self.loading.get(req_id, 0) > 0:
            self.loading[req_id] -= 1
            return QueryResult(loading=True)
        if group_id:
            if group_id not in inst.groups():
                raise error_for(m, -22, INVALID_ARGUMENT, f"unknown group id {group_id}")
            pos = [i for i, h in enumerate(hashes)
                   if self._complete(inst, (inst.namespace, group_key(h, group_id)), group_id)]
            if wait_for_full_prefix and len(pos) != len(hashes):
                return QueryResult(False, len(pos), b"")  # a short want-set: no lease
            if not pos:
                return QueryResult(False, 0, b"")
            lease = os.urandom(16)
            self.leases[lease] = _Lease(instance_id, [(inst.namespace, group_key(hashes[i],
                                                                                  group_id))
                                                      for i in pos], inst.world_size,
                                        self.clock() + LEASE_TTL_S, group_id)
            return QueryResult(False, len(pos), lease, tuple(pos))
        keys = []
        for h in hashes:
            k = (inst.namespace, bytes(h))
            if not self._complete(inst, k):
                break
            keys.append(k)
        if not keys:
            return QueryResult(False, 0, b"")
        lease = os.urandom(16)
        self.leases[lease] = _Lease(instance_id, keys, inst.world_size,
                                    self.clock() + LEASE_TTL_S)
        return QueryResult(False, len(keys), lease)

    def release(self, lease) -> None:
        self._gate("release", lease=bytes(lease))
        self._sweep()
        if bytes(lease) not in self.leases:
            raise error_for("pf_client_release", -1, FAILED_PRECONDITION,
                            "query lease is unknown or expired")
        del self.leases[bytes(lease)]

    def load(self, instance_id, tp_rank, device_id, load_state_shm, groups, loads) -> None:
        m = "pf_client_load"
        self._gate("load", instance_id=instance_id, device_id=device_id,
                   groups=[list(g) for g in groups],
                   loads=[(bytes(l.lease), [list(g) for g in l.block_ids_by_group])
                          for l in loads])
        self._sweep()
        try:
            state = ShmLoadState.attach(load_state_shm)
        except FileNotFoundError as e:  # the server: a missing record is the caller's mistake
            raise error_for(m, -2, FAILED_PRECONDITION, f"cannot open load_state_shm: {e}")
        except Exception as e:
            raise error_for(m, -5, INTERNAL, f"cannot attach load state: {e}")
        try:
            inst = self._inst(m, instance_id)
            w = inst.workers.get(device_id)
            if not inst.sealed or w is None:
                raise error_for(m, -1, FAILED_PRECONDITION, "device not registered")
            copies = []
            for ll in loads:
                lease = self.leases.get(bytes(ll.lease))
                if lease is None:
                    raise error_for(m, -1, FAILED_PRECONDITION,
                                    "query lease is unknown or expired")
                if lease.instance_id != instance_id:
                    raise error_for(m, -1, FAILED_PRECONDITION,
                                    f"query lease belongs to instance {lease.instance_id}")
                lease.shares -= 1
                if lease.shares <= 0:
                    del self.leases[bytes(ll.lease)]
                if len(ll.block_ids_by_group) != len(groups):
                    raise error_for(m, -22, INVALID_ARGUMENT, "group count mismatch")
                for gi, targets in enumerate(ll.block_ids_by_group):
                    if len(targets) != len(lease.keys):
                        raise error_for(m, -22, INVALID_ARGUMENT,
                                        f"query lease block count {len(lease.keys)} does not "
                                        f"match destination block count {len(targets)}")
                    for key, b in zip(lease.keys, targets):
                        if b is None:
                            continue
                        for name in groups[gi]:
                            lay = w.layers[name]
                            if lay.group != lease.group:
                                raise error_for(m, -22, INVALID_ARGUMENT,
                                                f"layer {name} (storage group {lay.group}) "
                                                f"in a load of group {lease.group} blocks")
                            copies.append((lay, b, self.blocks[key][(name, w.tp_rank)]))
        except Exception:
            state.set(-1)
            state.close()
            raise
        if self.load_mode == "stall":
            self.stalled.append((state, copies))
            return
        for lay, b, data in copies:
            if lay.tensor is not None:
                lay.write(b, data)
        if self.load_mode == "complete":
            state.set(1)
        elif self.load_mode == "error":
            state.set(-1)
        else:
            self.pending_states.append(state)
            return
        state.close()

    def unregister(self, instance_id) -> None:
        self._gate("unregister", instance_id=instance_id)
        self._inst("pf_client_unregister", instance_id)
        self.drop_instance(instance_id)

    def open_session(self, instance_id, namespace, tp_size, world_size):
        self._gate("session_open", instance_id=instance_id)
        if not instance_id:
            raise error_for("pf_client_session_open", -22, INVALID_ARGUMENT, "empty instance")
        self.sessions[instance_id] = self.sessions.get(instance_id, 0) + 1
        return FakeSession(self, instance_id, self.sessions[instance_id])


class FakeSession:
    def __init__(self, server: FakeServer, instance_id: str, token: int):
        self.server = server
        self.instance_id = instance_id
        self.token = token
        self.closed = False

    def alive(self) -> bool:
        return not self.closed and not self.server.down and \
            self.server.sessions.get(self.instance_id) == self.token

    def close(self) -> None:
        self.closed = True


class FakeWatch:
    """A watch Session (src/rpc/engine_service.c s_session_open with watch): alive while
    the server process that opened it runs."""

    def __init__(self, server: FakeServer, life: int):
        self.server = server
        self.life = life
        self.closed = False

    def alive(self) -> bool:
        return not self.closed and not self.server.down and self.server.life == self.life

    def close(self) -> None:
        self.closed = True


class FakeEngineClient:
    """EngineClient's surface over a FakeServer."""

    lib = None

    def __init__(self, server: FakeServer):
        self.server = server
        self.closed = False

    def register(self, a, timeout_ms=None):
        self.server.register(a)

    def save(self, instance_id, tp_rank, pp_rank, device_id, layers, timeout_ms=None):
        self.server.save(instance_id, tp_rank, pp_rank, device_id, layers)

    def query_raw(self, instance_id, req_id, hashes, *, wait_for_full_prefix=False,
                  group_id=0, timeout_ms=None):
        return self.server.query(instance_id, req_id, hashes, wait_for_full_prefix, group_id)

    def query(self, instance_id, req_id, hashes, *, wait_for_full_prefix=False, group_id=0,
              timeout_ms=None):
        try:
            return self.query_raw(instance_id, req_id, hashes,
                                  wait_for_full_prefix=wait_for_full_prefix, group_id=group_id)
        except Exception as e:
            if is_unreachable(e):
                return QueryResult.miss()
            raise

    def release(self, lease, timeout_ms=None):
        self.server.release(lease)

    def load(self, instance_id, tp_rank, device_id, load_state_shm, groups, loads,
             timeout_ms=None):
        self.server.load(instance_id, tp_rank, device_id, load_state_shm, groups, loads)

    def unregister(self, instance_id, timeout_ms=None):
        self.server.unregister(instance_id)

    def open_session(self, instance_id, namespace, tp_size, world_size, timeout_ms=None):
        return self.server.open_session(instance_id, namespace, tp_size, world_size)

    def has_watch(self) -> bool:
        return self.server.watch

    def health(self, timeout_ms=None):
        self.server._gate("health")

    def fresh(self, timeout_ms=1000):
        """EngineClient.fresh: another client on its own channel, to the same server."""
        return FakeEngineClient(self.server)

    def reconnect(self):
        self.server.calls.append(("reconnect", {}))

    def open_watch(self, instance_id="", timeout_ms=None):
        return self.server.open_watch(instance_id)

    def close(self):
        self.closed = True
