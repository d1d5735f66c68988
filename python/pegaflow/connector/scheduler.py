"""Scheduler side of the connector (runs in vLLM's EngineCore process).

Inputs are duck-typed vLLM objects (Request: request_id, block_hashes, num_tokens;
KVCacheBlocks: blocks, get_block_ids(); SchedulerOutput and friends) so this module
imports nothing from vLLM. All server traffic goes through an injected client with
EngineClient's surface (query, release, open_session).

Protocol with the server (reference §2.3-2.4, §2.10):

* get_num_new_matched_tokens is a *probe*: one QueryPrefetch per request identity
  (locally computed blocks, the hashes asked for), memoised, because vLLM may call it
  repeatedly for the same request (allocation failures, ``None`` retries). A Ready with
  hits pins the blocks under a lease; a changed identity, an abort, an age beyond
  ``probe_max_age_s`` (leases expire server-side after 600 s) or shutdown releases it.
  Loading -> ``(None, False)``: vLLM asks again next step. Hit tokens are clamped to
  ``num_tokens - num_computed_tokens - 1`` (vLLM must compute the last token itself) and
  always loaded asynchronously.
* update_state_after_alloc commits the probe: the destination blocks are the ones after
  the locally cached prefix; the lease travels to the workers in the next plan.
* build_connector_meta emits the committed loads and, per scheduled request, a save of
  every block that becomes full this step and was not saved (or loaded) before, per a
  cursor that survives chunked prefill and decode and restarts at re-admission after
  preemption. Block id 0 (vLLM's null block) is never saved.
* request_finished holds the request's blocks (returns True) once any save was planned
  for it: every worker reports it in finished_sending after its saves completed, and
  vLLM frees the blocks then.

A cache must degrade to recompute, never fail vLLM: any query failure is a miss, a
release failure is logged, and a commit that cannot be honoured becomes a load intent
without a lease, which the workers report as failed blocks (vLLM recomputes them).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from pegaflow.client.engine import QueryResult
from pegaflow.client.errors import FailedPrecondition
from pegaflow.connector.config import ConnectorContext
from pegaflow.connector.plan import LoadIntent, SaveIntent, StepPlan
from pegaflow.connector.events import EventTracker
from pegaflow.connector.stats import StatsRecorder
from pegaflow.connector.util import RateLimitedLog, cdiv

log = logging.getLogger("pegaflow.connector.scheduler")

PROBE_MAX_AGE_S = 300.0  # half the server's 600 s lease TTL
SESSION_RETRY_S = 5.0


@dataclass
class _Probe:
    computed_blocks: int
    hashes: tuple[bytes, ...]
    created: float
    loading: bool = False
    hit_blocks: int = 0
    lease: bytes = b""
    prefetched: bool = False  # the server answered Loading before Ready (SSD / P2P)

    @property
    def identity(self) -> tuple[int, tuple[bytes, ...]]:
        return (self.computed_blocks, self.hashes)


@dataclass
class _Req:
    request: Any
    block_ids: list[int] = field(default_factory=list)
    cursor: int = 0  # blocks [0, cursor) are saved, loaded or locally cached
    save_planned: bool = False
    load_committed: bool = False  # an async load awaits its second alloc call
    load_start: int = 0  # block index of the first loaded block
    load_blocks: tuple[int, ...] = ()
    finished: bool = False


def _hashed_prefix(blocks: Any) -> int | None:
    """Number of leading group-0 blocks that carry a block hash (locally cached)."""
    groups = getattr(blocks, "blocks", None)
    if not groups:
        return None
    n = 0
    for b in groups[0]:
        if getattr(b, "block_hash", None) is None:
            break
        n += 1
    return n


def _publishable(request: Any) -> int:
    """Leading block hashes that may be stored by hash: vLLM main's
    ``num_publishable_block_hashes`` (successor-aware EAGLE hashing publishes the
    newest hashes only once the draft KV exists); all of them on older vLLM."""
    n = len(request.block_hashes)
    limit = getattr(request, "num_publishable_block_hashes", None)
    return n if limit is None else max(0, min(n, int(limit)))


def _is_preempted(request: Any) -> bool:
    status = getattr(request, "status", None)
    return getattr(status, "name", None) == "PREEMPTED"


def _group0_ids(blocks: Any) -> list[int]:
    if blocks is None:
        return []
    ids = blocks.get_block_ids()
    return list(ids[0]) if ids else []


class SchedulerConnector:
    def __init__(self, ctx: ConnectorContext, client: Any, *, clock=time.monotonic,
                 probe_max_age_s: float = PROBE_MAX_AGE_S, session: bool = True,
                 session_thread: bool = True, session_retry_s: float = SESSION_RETRY_S):
        self.ctx = ctx
        self.client = client
        self._clock = clock
        self._probe_max_age = probe_max_age_s
        self._probes: dict[str, _Probe] = {}
        self._reqs: dict[str, _Req] = {}
        self._pending_loads: dict[str, LoadIntent] = {}
        self._awaiting_send: set[str] = set()
        self._rl = RateLimitedLog(log, clock=clock)
        self.recorder = StatsRecorder()  # what vLLM's get_kv_connector_stats reports
        self.events = EventTracker(ctx.world_size)  # what take_events reports
        self.stats = {"queries": 0, "query_errors": 0, "hits": 0, "hit_tokens": 0,
                      "loads_committed": 0, "commit_failures": 0, "saves_planned": 0,
                      "releases": 0, "release_errors": 0}
        # liveness Session
        self._session_enabled = session
        self._session = None
        self._session_retry = session_retry_s
        self._session_next = 0.0
        self._session_lock = threading.Lock()
        self._stop = threading.Event()
        self._keeper = None
        if session:
            self.ensure_session()
            if session_thread:
                self._keeper = threading.Thread(target=self._keep_session, daemon=True,
                                                name="pegaflow-session")
                self._keeper.start()

    # ---------------------------------------------------------------- server calls

    def _query(self, req_id: str, hashes: tuple[bytes, ...]) -> QueryResult:
        self.stats["queries"] += 1
        try:
            res = self.client.query(self.ctx.instance_id, req_id, list(hashes),
                                    wait_for_full_prefix=self.ctx.wait_for_full_prefix,
                                    timeout_ms=self.ctx.query_timeout_ms)
        except Exception as e:  # never into vLLM: a failed query is a miss
            self.stats["query_errors"] += 1
            self.recorder.add("query_errors")
            self._rl(logging.WARNING, "query", "QueryPrefetch failed, treating as a miss: %s", e)
            # FAILED_PRECONDITION: the server does not know this instance (it restarted),
            # so it holds nothing of ours - an answer; anything else is not one.
            return QueryResult.miss(unreachable=not isinstance(e, FailedPrecondition))
        return res

    def _release(self, lease: bytes, why: str) -> None:
        if not lease:
            return
        self.stats["releases"] += 1
        try:
            self.client.release(lease, timeout_ms=self.ctx.query_timeout_ms)
        except Exception as e:
            self.stats["release_errors"] += 1
            self._rl(logging.INFO, "release", "Release (%s) failed; the server's lease TTL "
                     "reclaims it: %s", why, e)

    def _drop_probe(self, req_id: str, why: str) -> None:
        p = self._probes.pop(req_id, None)
        if p is not None and p.lease:
            self._release(p.lease, why)

    # ---------------------------------------------------------------- vLLM hooks

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int
                                   ) -> tuple[int | None, bool]:
        if not self.ctx.read_enabled:
            return 0, False
        rid = request.request_id
        vbs = self.ctx.virtual_block_size
        computed_blocks = num_computed_tokens // vbs
        hashes = tuple(request.block_hashes[computed_blocks:])
        identity = (computed_blocks, hashes)
        now = self._clock()

        probe = self._probes.get(rid)
        if probe is not None and probe.loading:
            # The server keys its fetch by req_id: keep polling with the original hashes.
            res = self._query(rid, probe.hashes)
            if res.loading:
                # (if the identity drifted, the stale answer is released once it is Ready)
                return None, False
            self._settle(probe, res)
        if probe is not None and (probe.identity != identity
                                  or now - probe.created > self._probe_max_age):
            self._drop_probe(rid, "probe drifted" if probe.identity != identity else "probe aged")
            probe = None
        if probe is None:
            if not hashes:
                return 0, False
            probe = _Probe(computed_blocks, hashes, now)
            self._probes[rid] = probe
            res = self._query(rid, hashes)
            if res.loading:
                probe.loading = probe.prefetched = True
                return None, False
            self._settle(probe, res)
        return self._answer(request, probe, num_computed_tokens)

    def _settle(self, probe: _Probe, res: QueryResult,
                asked: tuple[bytes, ...] | None = None) -> None:
        """``asked``: the hashes the answer is about (default: the probe's)."""
        probe.loading = False
        if not getattr(res, "unreachable", False):
            self.events.answered(probe.hashes if asked is None else asked,
                                 int(res.num_hit_blocks))
        n = max(0, min(int(res.num_hit_blocks), len(probe.hashes)))
        if n > 0 and not res.lease:
            n = 0  # a hit without a lease pins nothing: unusable
        probe.hit_blocks = n
        probe.lease = res.lease if n > 0 else b""
        if res.lease and n == 0:
            self._release(res.lease, "unusable hit")

    def _answer(self, request: Any, probe: _Probe, num_computed_tokens: int
                ) -> tuple[int, bool]:
        rid = request.request_id
        vbs = self.ctx.virtual_block_size
        n = probe.hit_blocks
        if n <= 0:
            return 0, False
        hit_tokens = min(n * vbs, request.num_tokens - num_computed_tokens - 1)
        if hit_tokens <= 0:
            self._release(probe.lease, "hit covers only the last token")
            probe.hit_blocks, probe.lease = 0, b""
            return 0, False
        need = cdiv(hit_tokens, vbs)
        if need < n:
            # The clamp dropped whole blocks (block size 1): lease exactly what loads.
            self._release(probe.lease, "lease longer than the load")
            probe.hit_blocks, probe.lease = 0, b""
            res = self._query(rid, probe.hashes[:need])
            if res.loading:
                probe.loading = probe.prefetched = True
                return None, False  # type: ignore[return-value]
            self._settle(probe, res, probe.hashes[:need])
            if probe.hit_blocks != need:
                self._release(probe.lease, "re-query mismatch")
                probe.hit_blocks, probe.lease = 0, b""
                return 0, False
        self.stats["hits"] += 1
        self.stats["hit_tokens"] += hit_tokens
        return hit_tokens, True

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        rid = request.request_id
        st = self._reqs.get(rid)
        if st is None:
            st = self._reqs[rid] = _Req(request)
        st.request = request
        st.finished = False
        ids = _group0_ids(blocks)
        if num_external_tokens > 0:
            probe = self._probes.pop(rid, None)
            intent, start = self._commit(rid, blocks, ids, num_external_tokens, probe)
            if intent.lease is not None and probe is not None:
                vbs = self.ctx.virtual_block_size
                for j in range(len(intent.block_ids)):
                    self.events.hit(probe.hashes[j],
                                    EventTracker.describe(request, start + j, vbs))
                tier = "prefetched" if probe.prefetched else "ram"
                self.recorder.add(f"hit_tokens_{tier}", num_external_tokens)
                self.recorder.add("miss_tokens", max(0, len(probe.hashes) * vbs
                                                     - num_external_tokens))
            self._pending_loads[rid] = intent
            st.cursor = start + len(intent.block_ids)
            st.load_committed = True
            st.load_start, st.load_blocks = start, intent.block_ids
        elif st.load_committed:
            st.load_committed = False  # the call after the async load: nothing to do
        else:
            # (Re)admission without an external load: a probe's lease is not needed.
            probe = self._probes.get(rid)
            if probe is not None and not probe.loading:
                self.recorder.add("miss_tokens", len(probe.hashes) * self.ctx.virtual_block_size)
            self._drop_probe(rid, "not loaded")
            hashed = _hashed_prefix(blocks) or 0
            st.cursor = 0 if not self.ctx.read_enabled else hashed
        st.block_ids = ids

    def _commit(self, rid: str, blocks: Any, ids: list[int], num_external_tokens: int,
                probe: _Probe | None) -> tuple[LoadIntent, int]:
        vbs = self.ctx.virtual_block_size
        n = cdiv(num_external_tokens, vbs)
        hashed = _hashed_prefix(blocks)
        start = probe.computed_blocks if probe is not None else (hashed or 0)
        why = None
        if probe is None or probe.loading or not probe.lease:
            why = "no ready probe with a lease"
        elif hashed is not None and hashed != start:
            why = f"{hashed} locally cached blocks, but the probe assumed {start}"
        elif n != probe.hit_blocks:
            why = f"{n} blocks to load, but the lease covers {probe.hit_blocks}"
        elif len(ids) < start + n:
            why = f"only {len(ids)} blocks allocated for {start} + {n}"
        dest = tuple(ids[start:start + n])
        if why is None:
            self.stats["loads_committed"] += 1
            return LoadIntent(dest, probe.lease, num_external_tokens), start
        self.stats["commit_failures"] += 1
        log.error("request %s: cannot commit the external load (%s); its %d blocks will be "
                  "reported as failed and recomputed", rid, why, len(dest))
        if probe is not None and probe.lease:
            self._release(probe.lease, "failed commit")
        return LoadIntent(dest, None, num_external_tokens), start

    def build_connector_meta(self, scheduler_output: Any) -> StepPlan:
        plan = StepPlan(loads=self._pending_loads)
        self._pending_loads = {}
        # vLLM lists this step's preemptions in preempted_req_ids (documented for its v2
        # model runner); a request of ours whose status is PREEMPTED counts too, so the
        # workers always wait for saves still reading its blocks before they are reused.
        preempted = set(getattr(scheduler_output, "preempted_req_ids", None) or ())
        preempted.update(rid for rid, st in self._reqs.items()
                         if st.save_planned and not st.finished and _is_preempted(st.request))
        preempted = frozenset(preempted)
        for rid in preempted:
            st = self._reqs.get(rid)
            if st is not None:
                st.block_ids = []  # freed; re-admission sets table and cursor again
        nsched = scheduler_output.num_scheduled_tokens
        for nr in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(nr.req_id)
            if st is None:
                continue
            st.block_ids = list(nr.block_ids[0]) if nr.block_ids else []
            self._plan_save(plan, nr.req_id, st, nr.num_computed_tokens,
                            nsched.get(nr.req_id, 0))
        cr = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cr, "resumed_req_ids", None)
        legacy = getattr(cr, "resumed_from_preemption", None)
        for i, rid in enumerate(cr.req_ids):
            st = self._reqs.get(rid)
            if st is None:
                continue
            new_ids = cr.new_block_ids[i] if i < len(cr.new_block_ids) else None
            if resumed is not None:
                is_resumed = rid in resumed
            else:
                is_resumed = bool(legacy[i]) if legacy is not None and i < len(legacy) else False
            if is_resumed:
                st.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                st.block_ids.extend(new_ids[0])
            self._plan_save(plan, rid, st, cr.num_computed_tokens[i], nsched.get(rid, 0))
        plan.preempted = preempted
        return plan

    def _plan_save(self, plan: StepPlan, rid: str, st: _Req, num_computed: int,
                   num_scheduled: int) -> None:
        if num_scheduled <= 0:
            return
        hashes = st.request.block_hashes  # live: grows during decode
        full = min((num_computed + num_scheduled) // self.ctx.virtual_block_size,
                   _publishable(st.request), len(st.block_ids))
        if full <= st.cursor:
            return
        pairs = []
        vbs = self.ctx.virtual_block_size
        for i in range(st.cursor, full):
            b, h = st.block_ids[i], bytes(hashes[i])
            if b == 0:
                continue
            pairs.append((b, h))
            self.events.planned(h, EventTracker.describe(st.request, i, vbs))
        st.cursor = full
        if not pairs:
            return
        plan.saves[rid] = SaveIntent(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))
        st.save_planned = True
        self.stats["saves_planned"] += 1

    def update_connector_output(self, connector_output: Any) -> None:
        ev = getattr(connector_output, "kv_cache_events", None)
        if ev is not None and getattr(ev, "pegaflow", False):
            self.events.reports(ev.get_all_events())
        invalid = getattr(connector_output, "invalid_block_ids", None)
        if invalid:
            # Failed loads are recomputed by vLLM: those blocks must be saved again.
            for st in self._reqs.values():
                if not st.load_committed:
                    continue
                for j, b in enumerate(st.load_blocks):
                    if b in invalid:
                        st.cursor = min(st.cursor, st.load_start + j)
                        break
        for rid in getattr(connector_output, "finished_sending", None) or ():
            self._awaiting_send.discard(rid)
            st = self._reqs.get(rid)
            if st is not None and st.finished:
                del self._reqs[rid]

    def request_finished(self, request: Any, block_ids: Any = None) -> tuple[bool, dict | None]:
        rid = request.request_id
        self._drop_probe(rid, "request finished")
        st = self._reqs.get(rid)
        if st is None:
            return False, None
        if st.save_planned:
            st.finished = True
            self._awaiting_send.add(rid)
            return True, None
        del self._reqs[rid]
        return False, None

    def take_events(self) -> list[tuple]:
        """Router events since the last call (plain records; see events.py)."""
        return self.events.take()

    def has_pending_push_work(self) -> bool:
        """True while finished requests wait for their saves (keeps vLLM stepping so the
        workers can report them and vLLM can free the blocks)."""
        return bool(self._awaiting_send)

    # ---------------------------------------------------------------- Session

    def ensure_session(self) -> bool:
        """Open the liveness Session if it is not open (at most every session_retry_s)."""
        if not self._session_enabled:
            return False
        with self._session_lock:
            s = self._session
            try:
                if s is not None and s.alive():
                    return True
            except Exception:
                pass
            now = self._clock()
            if now < self._session_next:
                return False
            self._session_next = now + self._session_retry
            if s is not None:
                self._session = None
                try:
                    s.close()
                except Exception:
                    pass
            try:
                self._session = self.client.open_session(
                    self.ctx.instance_id, self.ctx.namespace, self.ctx.tp_size,
                    self.ctx.world_size, timeout_ms=self.ctx.query_timeout_ms)
            except Exception as e:
                self._rl(logging.WARNING, "session", "cannot open the liveness Session (will "
                         "retry): %s", e)
                return False
            self._rl.reset("session")
            log.debug("liveness Session open for %s", self.ctx.instance_id)
            return True

    def _keep_session(self) -> None:
        while not self._stop.wait(1.0):
            try:
                self.ensure_session()
            except Exception:  # pragma: no cover
                log.exception("session keeper")

    @property
    def session(self):
        return self._session

    # ---------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        for rid in list(self._probes):
            self._drop_probe(rid, "shutdown")
        with self._session_lock:
            s, self._session = self._session, None
            self._session_enabled = False
        if s is not None:
            try:
                s.close()
            except Exception:
                pass
