"""Worker side of the connector (runs in every vLLM GPU worker process).

Talks to the server through an injected client (EngineClient's surface: register, save,
load, release, unregister) and to the GPU through a DeviceAdapter (cuda or sim); imports
neither vLLM nor torch.

* register_kv_caches / register_cross_layers_kv_cache: one RegisterContextBatch per
  device, layouts inferred from shape/stride (layout.py). Any failure raises: vLLM must
  not start with a connector that cannot work (a version mismatch says so).
* start_load_kv: all load intents of the step in one Load RPC with a fresh
  load_state_shm; the RPC returns after submission. A failed RPC (or an intent without a
  lease) turns into load errors for its blocks and "finished receiving" for its requests,
  never an exception.
* get_finished: polls every pending load state (1 success, anything else final is a
  failure); reports each request exactly once. A Load still pending after
  load_timeout_s is cancelled, not abandoned: the worker asks the server to stop
  (load state 0 -> 2), and reports the blocks failed only once the server confirmed
  (a final state: -2 cancelled, or the 1/-1 it wrote first) or the server process is
  gone (the watch Session ended), so no byte lands in a block vLLM already gave to a
  recomputation. A server that never answers is given up on after cancel_wait_s (its
  own copy bound, 120 s, plus a margin), with an error logged.
  Requests with planned saves are reported in finished_sending once they are in
  ``finished_req_ids`` (this or an earlier call) and all their saves completed.
* wait_for_save: records a save fence (a CUDA event on the forward pass's stream, see
  device/cuda.py) and hands the step's saves to a background thread, which waits for
  that fence only (attention kernels are asynchronous; work queued after the forward
  pass is not waited for) and sends one Save covering every registered layer. Save
  failures are logged; the request lifecycle still completes.
* handle_preemptions: waits until saves reading preempted requests' blocks completed,
  before vLLM reuses the blocks.
* Hybrid models: each layer registers with its storage group (``layer_group_ids``);
  recurrent-state layers (vLLM passes a list of state tensors viewing one page per block)
  register as one page-sized segment. Loads go as one Load RPC per storage group with
  leases (its layers, the lease's targets); saves send each group's blocks for that
  group's layers, synchronously (vLLM may free an older recurrent state block before a
  background save would have copied it).
* MLA page-first (one group, no DCP/PP): registered ``page_first``; replicas stripe
  their saves (rank r of the shard saves the blocks with ``block_id % local_tp_size ==
  r``), so every block is copied once; with ``mla_layer_split_kv_cache`` each rank holds
  (and saves) its own layers. Every rank loads every block.
* TP shards: the worker talks to its shard's server only and uses its shard's leases.
* Recovery: each registered worker holds a watch Session (EngineClient.open_watch) on a
  small thread. When it ends (the server process died or restarted) the worker reopens it
  every WATCH_RETRY_S and, the moment the server answers again, registers its KV caches
  again (same IPC handles), so a restarted server serves this vLLM within about one retry
  of its ready, without waiting for a Save or Load to fail. Without a watch (an older
  library) a Save or Load that fails because the server does not have this worker
  registered triggers the re-registration (at most every ``reregister_interval_s``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from pegaflow.client.engine import LayerRegistration, LeaseLoad, RegisterArgs, SaveLayer
from pegaflow.client.errors import FailedPrecondition, InvalidArgument, VersionMismatch
from pegaflow.client.loadstate import (CANCELLED, create_load_state, state_is_final,
                                       state_is_success)
from pegaflow.connector.config import ConnectorContext
from pegaflow.connector.events import WorkerEventLog
from pegaflow.connector.layout import infer_layout, state_layout
from pegaflow.connector.plan import plan_of
from pegaflow.connector.stats import StatsRecorder
from pegaflow.connector.util import RateLimitedLog

log = logging.getLogger("pegaflow.connector.worker")


@dataclass
class _PendingLoad:
    state: Any
    req_blocks: dict[str, tuple[int, ...]]
    started: float
    nblocks: int = 0  # blocks this Load writes (per layer of its group)
    block_bytes: int = 0  # bytes of one block over the group's layers
    epoch: int = 0  # the server process it went to (WorkerConnector._server_epoch)
    cancel_at: float | None = None  # when the worker asked the server to stop it


@dataclass
class _SaveTask:
    req_ids: tuple[str, ...]
    block_ids: list[int]
    hashes: list[bytes]
    # storage group > 0 -> (block ids, hashes)
    groups: dict[int, tuple[list[int], list[bytes]]] | None = None
    # the device's save fence, recorded where the save was issued (None: nothing to wait)
    fence: Any = None


_STOP = object()
_NULL_TO_NONE = {0: None}  # .get(t, t): vLLM's null block 0 -> no target
REREGISTER_INTERVAL_S = 10.0
WATCH_POLL_S = 0.05  # how often the watch thread looks at its Session
WATCH_RETRY_S = 0.1  # reopen attempts while the server is down
WATCH_FORCE_TRIES = 20  # re-registration attempts at that pace once it answers again
# a cancelled Load not confirmed by a live server after this is given up on: the server
# bounds one copy chunk at 120 s (PF_XFER_MAX_MS in src/engine/gpu_worker.c)
CANCEL_WAIT_S = 150.0


def _registration_lost(e: BaseException) -> bool:
    """A Save/Load failure that means "the server does not have this worker registered":
    unknown instance or device (FAILED_PRECONDITION, except lease errors), or an instance
    that another worker re-created and that waits for the rest (INVALID_ARGUMENT
    "registration incomplete"). A needless re-registration is answered "already ..."."""
    msg = getattr(e, "message", str(e)).lower()
    if isinstance(e, FailedPrecondition):
        return "lease" not in msg and "version" not in msg
    return isinstance(e, InvalidArgument) and "registration incomplete" in msg


class WorkerConnector:
    def __init__(self, ctx: ConnectorContext, client: Any, device: Any, *,
                 clock=time.monotonic, load_state_factory=None, save_thread: bool = True,
                 expected_num_blocks: int | None = None,
                 reregister_interval_s: float = REREGISTER_INTERVAL_S,
                 watch: bool = True, watch_thread: bool = True,
                 cancel_wait_s: float = CANCEL_WAIT_S):
        self.ctx = ctx
        self.client = client
        self.device = device
        self._clock = clock
        self._new_load_state = load_state_factory or (
            lambda: create_load_state(getattr(client, "lib", None)))
        self._expected_blocks = expected_num_blocks
        self.layers: list[str] = []
        self.group_layers: dict[int, list[str]] = {}  # storage group -> layer names
        self._group_bytes: dict[int, int] = {}  # storage group -> bytes of one block
        self.registered = False
        self.namespace = ctx.namespace  # of the registered layout, once registered
        self._reg_args: RegisterArgs | None = None
        self._reg_lock = threading.Lock()
        self._reregister_due: float | None = None  # set when the server lost the instance
        self._reregister_interval = reregister_interval_s
        self._device_id: int | None = None
        self._rl = RateLimitedLog(log, clock=clock)
        # watch Session: ends when the server process does
        self._watch_enabled = watch and hasattr(client, "open_watch") and (
            not hasattr(client, "has_watch") or client.has_watch())
        self._watch_thread_on = watch_thread
        self._watch = None
        self._watch_client = None  # the fresh client holding the watch, if any
        self._force_left = 0
        self._watch_next = 0.0
        self._watch_stop = threading.Event()
        self._watch_thr: threading.Thread | None = None
        self._server_epoch = 0  # bumped each time the watch Session ends
        self._cancel_wait = cancel_wait_s
        # loads
        self._pending: list[_PendingLoad] = []
        self._req_loads: dict[str, int] = {}  # request -> its Loads not yet complete
        self._req_failed: dict[str, tuple[int, ...]] = {}  # request -> blocks, once failed
        self._recving: set[str] = set()
        self._load_errors: set[int] = set()
        # saves
        self._cv = threading.Condition()
        self._outstanding: dict[str, int] = {}  # req -> save tasks not yet done
        self._save_reqs: set[str] = set()  # requests with planned saves, not yet reported
        self._finished: set[str] = set()  # finished_req_ids seen, not yet reported
        self.recorder = StatsRecorder()  # what vLLM's get_kv_connector_stats reports
        self.event_log = WorkerEventLog()  # hashes saved, for KV-aware routers
        self._block_bytes = 0  # bytes of one block over every layer registered here
        self.stats = {"loads": 0, "load_failures": 0, "load_timeouts": 0, "saves": 0,
                      "save_failures": 0, "saved_blocks": 0, "loaded_blocks": 0}
        self._q: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        if save_thread:
            self._q = queue.Queue()
            self._thread = threading.Thread(target=self._save_loop, daemon=True,
                                            name="pegaflow-save")
            self._thread.start()

    # ---------------------------------------------------------------- registration

    @property
    def device_id(self) -> int:
        if self._device_id is None:
            self._device_id = int(self.device.device_id())
        return self._device_id

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        self._register([(name, t, False) for name, t in kv_caches.items()])

    def register_cross_layers_kv_cache(self, kv_cache: Any, attn_backend: Any = None) -> None:
        self._register([(self.ctx.cross_layer_name, kv_cache, True)])

    def _register(self, tensors: list[tuple[str, Any, bool]]) -> None:
        if self.registered:
            raise RuntimeError("KV caches are already registered")
        if not tensors:
            raise ValueError("no KV cache tensors to register")
        regs = []
        for name, t, cross in tensors:
            if isinstance(t, (list, tuple)):
                # recurrent-state layer: its state tensors view one page per block
                if not t:
                    raise ValueError(f"{name}: empty list of state tensors")
                lay = state_layout([self.device.tensor_info(x) for x in t],
                                   expected_num_blocks=self._expected_blocks, name=name)
                t = t[0]
            else:
                info = self.device.tensor_info(t)
                lay = infer_layout(info, is_mla=self.ctx.is_mla, cross_layer=cross,
                                   logical_block_size=self.ctx.block_size,
                                   expected_num_blocks=self._expected_blocks, name=name)
            if self.ctx.page_first and lay.segments != 1:
                raise ValueError(f"{name}: page-first (MLA) registration needs one segment "
                                 "per block, this layout has split K/V")
            regs.append(LayerRegistration(
                name=name, ipc=self.device.export_ipc(t), num_blocks=lay.num_blocks,
                bytes_per_block=lay.bytes_per_block, kv_stride_bytes=lay.kv_stride_bytes,
                segments=lay.segments, group_id=self.ctx.layer_group(name)))
        # The namespace names the layout registered here (vLLM may fall back to per-layer
        # tensors although cross-layer blocks were asked for, e.g. on a base class or a
        # model that cannot do them), so incompatible layouts never share keys.
        namespace = self.ctx.namespace_for(any(cross for _, _, cross in tensors))
        args = RegisterArgs(
            instance_id=self.ctx.instance_id, namespace=namespace,
            tp_rank=self.ctx.tp_rank, tp_size=self.ctx.tp_size,
            world_size=self.ctx.world_size, pp_rank=self.ctx.pp_rank,
            device_id=self.device_id, layers=regs, transfer_mode=self.ctx.transfer_mode,
            page_first=self.ctx.page_first, client_version=self.ctx.client_version)
        try:
            self.client.register(args, timeout_ms=self.ctx.rpc_timeout_ms)
        except VersionMismatch as e:
            raise RuntimeError(
                f"pegaflow-server rejected this connector's version: {e.message}. Install "
                f"the libpegaflow built with the running server (same `--version`)") from e
        except Exception as e:
            raise RuntimeError(
                f"RegisterContextBatch failed for instance {self.ctx.instance_id} device "
                f"{self.device_id} layers [{', '.join(r.name for r in regs)}]: {e}") from e
        self.layers = [r.name for r in regs]
        self.group_layers = {}
        self._group_bytes = {}
        for r in regs:
            self.group_layers.setdefault(r.group_id, []).append(r.name)
            self._group_bytes[r.group_id] = (self._group_bytes.get(r.group_id, 0)
                                             + r.bytes_per_block * r.segments)
        self._block_bytes = self._group_bytes.get(0, 0)
        self.registered = True
        self._reg_args = args
        self.namespace = namespace
        self._start_watch()
        log.info("registered %d KV layer(s) of instance %s (namespace %s, tp %d/%d, pp %d, "
                 "device %d, %d blocks of %d bytes x %d segment(s))", len(regs),
                 self.ctx.instance_id, namespace, self.ctx.tp_rank, self.ctx.tp_size,
                 self.ctx.pp_rank, self.device_id, regs[0].num_blocks, regs[0].bytes_per_block,
                 regs[0].segments)

    def _note_failure(self, e: BaseException) -> None:
        if _registration_lost(e) and self._reg_args is not None:
            with self._reg_lock:
                if self._reregister_due is None:
                    self._reregister_due = self._clock()
                    log.warning("pegaflow-server does not know instance %s (restarted?): "
                                "registering the KV caches again", self.ctx.instance_id)

    # ---------------------------------------------------------------- watch Session

    def _start_watch(self) -> None:
        if not self._watch_enabled:
            return
        self.watch_step()
        if self._watch_thread_on and self._watch_thr is None:
            self._watch_thr = threading.Thread(target=self._watch_loop, daemon=True,
                                               name="pegaflow-watch")
            self._watch_thr.start()

    def _watch_loop(self) -> None:
        while not self._watch_stop.wait(WATCH_POLL_S):
            try:
                self.watch_step()
            except Exception:  # pragma: no cover - watch_step handles its errors
                log.exception("watch thread")

    def watch_step(self) -> None:
        """One look at the watch Session: notice its end (the server process is gone: its
        Loads cannot copy any more, and this worker must register again), reopen it once
        the server answers, and then re-register at once."""
        w = self._watch
        if w is not None and w.alive():
            if (self._reregister_due is not None and self._force_left > 0
                    and self._clock() >= self._watch_next):
                # the first attempt after the server came back failed (e.g. the main
                # channel was still connecting): again, every WATCH_RETRY_S, for a while
                self._force_left -= 1
                self._watch_next = self._clock() + WATCH_RETRY_S
                self.maybe_reregister(force=True)
            return
        if w is not None:
            self._watch = None
            try:
                w.close()
            except Exception:  # pragma: no cover
                pass
            self._server_epoch += 1
            self._watch_next = 0.0  # try at once: the new process may be up already
            with self._reg_lock:
                self._reregister_due = self._clock()
            log.warning("pegaflow-server ended the watch Session (it stopped or restarted): "
                        "registering instance %s again as soon as it answers",
                        self.ctx.instance_id)
        now = self._clock()
        if now < self._watch_next:
            return
        self._watch_next = now + WATCH_RETRY_S
        try:
            self._watch, self._watch_client = self._open_watch()
        except Exception as e:
            self._rl(logging.INFO, "watch", "watch Session not open yet: %s", e)
            return
        self._rl.reset("watch")
        if self._reregister_due is not None:
            # the server answers on a fresh channel; the main one may sit in gRPC's
            # reconnect backoff (seconds) after the failed calls: drop it, once
            reconnect = getattr(self.client, "reconnect", None)
            if reconnect is not None:
                reconnect()
            self._force_left = WATCH_FORCE_TRIES
            self.maybe_reregister(force=True)

    def _open_watch(self):
        """(watch, the client that holds it). A fresh channel per attempt where the client
        can make one (EngineClient.fresh): it connects at once when the server is back."""
        to = min(1000, self.ctx.rpc_timeout_ms)
        old, self._watch_client = self._watch_client, None
        if old is not None:
            old.close()
        fresh = getattr(self.client, "fresh", None)
        if fresh is None:
            return self.client.open_watch(self.ctx.instance_id, timeout_ms=to), None
        c = fresh(to)
        try:
            return c.open_watch(self.ctx.instance_id, timeout_ms=to), c
        except BaseException:
            c.close()
            raise

    def maybe_reregister(self, force: bool = False) -> bool:
        """Register again after the server lost the instance; True when (re)registered.
        ``force``: now, even inside the retry interval (the server just came back)."""
        with self._reg_lock:
            due = self._reregister_due
            if due is None or (self._clock() < due and not force):
                return False
            self._reregister_due = self._clock() + self._reregister_interval
            try:
                self.client.register(self._reg_args, timeout_ms=self.ctx.rpc_timeout_ms)
            except Exception as e:
                if "already" in str(e):  # our device is registered (e.g. by a retry)
                    self._reregister_due = None
                    return True
                self._rl(logging.WARNING, "reregister", "re-registration failed (will retry "
                         "in %.0f s): %s", self._reregister_interval, e)
                return False
            self._reregister_due = None
            self.stats["reregistrations"] = self.stats.get("reregistrations", 0) + 1
            log.info("re-registered instance %s device %d with pegaflow-server",
                     self.ctx.instance_id, self.device_id)
            return True

    # ---------------------------------------------------------------- loads

    def _fail_load(self, req_blocks: Mapping[str, tuple[int, ...]], why: str) -> None:
        """Load(s) of these requests failed: their blocks become load errors; a request
        is reported finished once none of its Loads is still running."""
        self.stats["load_failures"] += 1
        self.recorder.add("load_failures")
        for rid, blocks in req_blocks.items():
            self._req_failed[rid] = tuple(blocks)
            self._load_done(rid)
        self._rl(logging.WARNING, "load", "KV load of %d request(s) failed, vLLM recomputes "
                 "their blocks: %s", len(req_blocks), why)

    def _load_done(self, rid: str) -> None:
        n = self._req_loads.get(rid, 1) - 1
        if n > 0:
            self._req_loads[rid] = n
            return
        self._req_loads.pop(rid, None)
        failed = self._req_failed.pop(rid, None)
        if failed is not None:
            self._load_errors.update(failed)
        self._recving.add(rid)

    def start_load_kv(self, metadata: Any) -> None:
        plan = plan_of(metadata)
        if self._reregister_due is not None:
            self.maybe_reregister()
        if not plan.loads:
            return
        failed: dict[str, tuple[int, ...]] = {}
        # storage group -> (items, request -> all its destination blocks)
        by_group: dict[int, tuple[list[LeaseLoad], dict[str, tuple[int, ...]], list[int]]] = {}
        for rid, it in plan.loads.items():
            leases = it.leases_for(self.ctx.shard_index) if it.block_ids else ()
            if not leases:
                failed[rid] = it.block_ids
                continue
            for gl in leases:
                items, reqs, count = by_group.setdefault(gl.group, ([], {}, [0]))
                # vLLM's null block 0 (skipped sliding-window / older state positions)
                # is never a destination (mapped in C: no Python code per block)
                targets = gl.targets
                if 0 in targets:
                    targets = tuple(map(_NULL_TO_NONE.get, targets, targets))
                items.append(LeaseLoad(gl.lease, [targets]))
                reqs[rid] = it.block_ids
                count[0] += len(targets) - targets.count(None)
            self._req_loads[rid] = self._req_loads.get(rid, 0) + len({gl.group for gl in leases})
        if failed:
            for rid in failed:
                self._req_loads.setdefault(rid, 1)
            self._fail_load(failed, "the scheduler could not commit the load")
        for group in sorted(by_group):
            items, reqs, count = by_group[group]
            self._submit_load(group, items, reqs, count[0])

    def _submit_load(self, group: int, items: list[LeaseLoad],
                     req_blocks: dict[str, tuple[int, ...]], nblocks: int) -> None:
        if not self.registered:
            self._release_all(items)
            self._fail_load(req_blocks, "KV caches are not registered")
            return
        # A worker without layers of this group (a PP stage holding none of them) still
        # sends the Load, with no layer: it consumes its share of the lease, copies nothing.
        layers = self.group_layers.get(group, [])
        self.stats["loads"] += 1
        try:
            state = self._new_load_state()
        except Exception as e:
            self._fail_load(req_blocks, f"cannot create load_state_shm: {e}")
            self._release_all(items)
            return
        try:
            self.client.load(self.ctx.instance_id, self.ctx.tp_rank, self.device_id,
                             state.name, [list(layers)], items,
                             timeout_ms=self.ctx.rpc_timeout_ms)
        except Exception as e:
            state.close()
            self._release_all(items)
            self._fail_load(req_blocks, str(e))
            self._note_failure(e)
            return
        self._pending.append(_PendingLoad(state, req_blocks, self._clock(), nblocks,
                                          self._group_bytes.get(group, 0),
                                          self._server_epoch))

    def _release_all(self, items: list[LeaseLoad]) -> None:
        for it in items:
            try:
                self.client.release(it.lease, timeout_ms=self.ctx.query_timeout_ms)
            except Exception:
                pass  # expired, consumed by another worker, or server down

    def _poll_loads(self) -> None:
        still = []
        now = self._clock()
        for p in self._pending:
            try:
                st = p.state.get()
            except Exception as e:  # pragma: no cover
                st = -1
                log.warning("reading load state %s: %s", p.state.name, e)
            if not state_is_final(st):
                if p.cancel_at is None:
                    if now - p.started <= self.ctx.load_timeout_s:
                        still.append(p)
                        continue
                    # give up: ask the server to stop before its next copy
                    self.stats["load_timeouts"] += 1
                    self.recorder.add("load_timeouts")
                    st = self._cancel(p)
                    p.cancel_at = now
                if not state_is_final(st):
                    if p.epoch != self._server_epoch:
                        pass  # that server process is gone: nothing of it copies any more
                    elif now - p.cancel_at <= self._cancel_wait:
                        still.append(p)  # wait for the server's confirmation
                        continue
                    else:
                        log.error("Load %s: pegaflow-server neither finished nor confirmed "
                                  "the cancel within %.0f s; reporting its blocks failed",
                                  p.state.name, self._cancel_wait)
            p.state.close()
            if not state_is_final(st) or st == CANCELLED:
                self._fail_load(p.req_blocks, f"not complete after {self.ctx.load_timeout_s:.0f} "
                                f"s (cancelled{'' if st == CANCELLED else ', server gone'})")
            elif state_is_success(st):
                for rid in p.req_blocks:
                    self._load_done(rid)
                n = p.nblocks
                self.stats["loaded_blocks"] += n
                # duration: submission to the poll that saw it complete (get_finished
                # runs once per step, so this is an upper bound by at most one step)
                self.recorder.record(
                    {"load_success": 1, "load_blocks": n, "load_bytes": n * p.block_bytes},
                    {"load_op_blocks": n, "load_duration_s": max(0.0, now - p.started)})
            else:
                self._fail_load(p.req_blocks, f"server reported state {st}")
        self._pending = still

    def _cancel(self, p: _PendingLoad) -> int:
        try:
            return int(p.state.cancel())
        except Exception as e:  # pragma: no cover
            log.warning("cancelling load %s: %s", p.state.name, e)
            return int(p.state.get())

    def get_block_ids_with_load_errors(self) -> set[int]:
        errs, self._load_errors = self._load_errors, set()
        return errs

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None  # loads are asynchronous (WAITING_FOR_REMOTE_KVS)

    # ---------------------------------------------------------------- saves

    def wait_for_save(self, metadata: Any) -> None:
        plan = plan_of(metadata)
        if not plan.saves:
            return
        per: dict[int, tuple[list[int], list[bytes], set[bytes]]] = {}
        for it in plan.saves.values():
            for g, (bids, hs) in it.by_group().items():
                ids, hashes, seen = per.setdefault(g, ([], [], set()))
                if 0 not in bids and seen.isdisjoint(hs) and len(set(hs)) == len(hs):
                    ids.extend(bids)  # the common case, without a Python loop per block
                    hashes.extend(hs)
                    seen.update(hs)
                    continue
                for b, h in zip(bids, hs):
                    if b == 0 or h in seen:  # null block; same block twice in one batch
                        continue
                    seen.add(h)
                    ids.append(b)
                    hashes.append(h)
        ids, hashes, _ = per.pop(0, ([], [], set()))
        task = _SaveTask(tuple(plan.saves), ids, hashes,
                         {g: (v[0], v[1]) for g, v in per.items() if v[0]} or None,
                         self._save_fence())
        with self._cv:
            for rid in task.req_ids:
                self._outstanding[rid] = self._outstanding.get(rid, 0) + 1
                self._save_reqs.add(rid)
        if self._q is not None and not self.ctx.hybrid:
            self._q.put(task)
        else:
            # hybrid: vLLM frees an older recurrent-state block as soon as a newer one
            # exists, without telling the connector; copy before returning.
            self._run_saves([task])

    def _save_fence(self) -> Any:
        """The device's fence for a save issued now (vLLM calls wait_for_save on the thread
        that queued the forward pass, as its forward context exits). An adapter without
        save_fence gets a device-wide synchronize on the save thread instead."""
        f = getattr(self.device, "save_fence", None)
        return f() if f is not None else None

    def _wait_fences(self, batch: list[_SaveTask]) -> None:
        """Block until the KV the batch's saves read is written: every task's fence
        (recorded on the forward stream, so in order), within rpc_timeout_ms."""
        limit = self.ctx.rpc_timeout_ms / 1000
        for t in batch:
            if t.fence is None:
                self.device.synchronize()
            elif not t.fence.wait(limit):
                raise TimeoutError(f"the forward pass's kernels did not finish within "
                                   f"{limit:.0f} s of the save (GPU hung?)")

    def _save_loop(self) -> None:
        while True:
            task = self._q.get()
            if task is _STOP:
                return
            batch = [task]
            stop = False
            while True:
                try:
                    t = self._q.get_nowait()
                except queue.Empty:
                    break
                if t is _STOP:
                    stop = True
                    break
                batch.append(t)
            try:
                self._run_saves(batch)
            except Exception:  # pragma: no cover - _run_saves never raises
                log.exception("save thread")
            if stop:
                return

    def _merge(self, batch: list[_SaveTask]) -> dict[int, tuple[list[int], list[bytes]]]:
        if len(batch) == 1:  # one task: wait_for_save already dropped its duplicates
            t = batch[0]
            out = {0: (t.block_ids, t.hashes)}
            out.update(t.groups or {})
            return {g: v for g, v in out.items() if v[0]}
        per: dict[int, tuple[list[int], list[bytes], set[bytes]]] = {}
        for t in batch:
            groups = {0: (t.block_ids, t.hashes)}
            groups.update(t.groups or {})
            for g, (bids, hs) in groups.items():
                ids, hashes, seen = per.setdefault(g, ([], [], set()))
                for b, h in zip(bids, hs):
                    if h not in seen:
                        seen.add(h)
                        ids.append(b)
                        hashes.append(h)
        return {g: (v[0], v[1]) for g, v in per.items() if v[0]}

    def _stripe(self, ids: list[int], hashes: list[bytes]) -> tuple[list[int], list[bytes]]:
        """Page-first MLA replicas: this rank's share of the blocks."""
        if not self.ctx.stripe_saves:
            return ids, hashes
        n, r = self.ctx.local_size, self.ctx.local_rank
        keep = [(b, h) for b, h in zip(ids, hashes) if b % n == r]
        return [k[0] for k in keep], [k[1] for k in keep]

    def _run_saves(self, batch: list[_SaveTask]) -> None:
        per = self._merge(batch)
        all_hashes = per.get(0, ([], []))[1]
        mine = {g: self._stripe(*v) for g, v in per.items()}
        layers = []
        nblocks = nbytes = 0
        for g, (ids, hashes) in sorted(mine.items()):
            if not ids:
                continue
            names = self.group_layers.get(g, self.layers if g == 0 else [])
            layers.extend(SaveLayer(name, ids, hashes) for name in names)
            if names:
                nblocks += len(ids)
                nbytes += len(ids) * self._group_bytes.get(g, 0)
        try:
            if layers and self.registered and not self.ctx.skip_save:
                t0 = self._clock()
                self._wait_fences(batch)
                self.client.save(self.ctx.instance_id, self.ctx.tp_rank, self.ctx.pp_rank,
                                 self.device_id, layers, timeout_ms=self.ctx.rpc_timeout_ms)
                self.stats["saves"] += 1
                self.stats["saved_blocks"] += nblocks
                self.recorder.record(
                    {"save_success": 1, "save_blocks": nblocks, "save_bytes": nbytes},
                    {"save_op_blocks": nblocks,
                     "save_duration_s": max(0.0, self._clock() - t0)})
                # (striped replicas report every hash of the batch: together they stored
                # it, and each rank's own report decides whether it counts as stored)
                if self.ctx.kv_events:
                    self.event_log.saved(all_hashes)
            elif per and self.registered and self.ctx.kv_events:
                # skip_save (MLA replica), or a striped rank with nothing of its own:
                # report the same hashes so the scheduler's "all workers saved it" rule
                # is decided by the ranks that copied
                self.event_log.saved(all_hashes)
        except Exception as e:
            self.stats["save_failures"] += 1
            self.recorder.add("save_failures")
            self._rl(logging.WARNING, "save", "Save of %d block(s) failed (they stay "
                     "uncached): %s", nblocks, e)
            self._note_failure(e)
        finally:
            with self._cv:
                for t in batch:
                    for rid in t.req_ids:
                        n = self._outstanding.get(rid, 0) - 1
                        if n > 0:
                            self._outstanding[rid] = n
                        else:
                            self._outstanding.pop(rid, None)
                self._cv.notify_all()

    def handle_preemptions(self, preempted_req_ids, timeout_s: float | None = None) -> None:
        ids = set(preempted_req_ids or ())
        if not ids:
            return
        limit = timeout_s if timeout_s is not None else self.ctx.rpc_timeout_ms / 1000 + 5
        deadline = time.monotonic() + limit
        with self._cv:
            while any(self._outstanding.get(r, 0) for r in ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error("saves of preempted requests still running after %.0f s", limit)
                    return
                self._cv.wait(left)

    def wait_saves_idle(self, timeout_s: float = 30.0) -> bool:
        """Block until no save is queued or running (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self._outstanding:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    # ---------------------------------------------------------------- completion

    def get_finished(self, finished_req_ids) -> tuple[set[str] | None, set[str] | None]:
        self._poll_loads()
        recving, self._recving = self._recving, set()
        sending: set[str] = set()
        with self._cv:
            if finished_req_ids:
                self._finished.update(self._save_reqs.intersection(finished_req_ids))
            for rid in list(self._finished):
                if self._outstanding.get(rid, 0) == 0:
                    sending.add(rid)
                    self._finished.discard(rid)
                    self._save_reqs.discard(rid)
        return (sending or None), (recving or None)

    # ---------------------------------------------------------------- shutdown

    def shutdown(self, unregister: bool = True) -> None:
        self._watch_stop.set()
        if self._watch_thr is not None:
            self._watch_thr.join(timeout=5)
            self._watch_thr = None
        if self._watch is not None:
            try:
                self._watch.close()
            except Exception:  # pragma: no cover
                pass
            self._watch = None
        if self._watch_client is not None:
            self._watch_client.close()
            self._watch_client = None
        if self._thread is not None:
            self._q.put(_STOP)
            self._thread.join(timeout=self.ctx.rpc_timeout_ms / 1000 + 5)
            self._thread = None
        for p in self._pending:
            p.state.close()
        self._pending = []
        if (unregister and self.registered and self.ctx.local_rank == 0
                and self.ctx.pp_rank == 0):
            try:
                self.client.unregister(self.ctx.instance_id, timeout_ms=self.ctx.query_timeout_ms)
            except Exception as e:
                log.info("UnregisterContext: %s", e)
        self.registered = False
