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

Hybrid models (several KV cache groups, config.CacheGroup): storage group 0 (the first
full-attention group) is queried as a prefix; every other storage group with a
membership query over that prefix (``hit_positions``; the want-set form with
``pegaflow.wait_for_full_prefix``). The resume point is the longest prefix k such that
every full-attention group holds blocks 0..k-1 and every recurrent-state group holds the
state of block k-1; group 0 is re-queried for exactly k blocks when it hit more. Hit
tokens are then whole blocks (a recurrent state cannot be resumed inside a block).
Saves: full-attention groups save every new full block, state groups the block at the
step's end when the step ends on a block boundary (its state is then exactly that
prefix's). Destination blocks of a state group that vLLM left null (older states) get
no target; a non-null destination without a stored state fails the commit.

TP shards across hosts (``pegaflow.tp_shard_endpoints``): one client per shard server;
every shard is queried, the minimum hit count wins, shards that hit more are re-queried
for exactly that prefix (req id ``{id}:tp-common-{k}``) and their longer leases released;
the load carries one lease set per shard. A shard that is down answers a miss, so the
request misses.

A cache must degrade to recompute, never fail vLLM: any query failure is a miss, a
release failure is logged, and a commit that cannot be honoured becomes a load intent
without a lease, which the workers report as failed blocks (vLLM recomputes them).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from itertools import compress
from typing import Any

from pegaflow.client.engine import QueryResult
from pegaflow.client.errors import FailedPrecondition
from pegaflow.connector.config import FULL, ConnectorContext
from pegaflow.connector.plan import GroupLease, LoadIntent, SaveIntent, StepPlan
from pegaflow.connector.events import EventTracker
from pegaflow.connector.stats import StatsRecorder
from pegaflow.connector.util import RateLimitedLog, cdiv

log = logging.getLogger("pegaflow.connector.scheduler")

PROBE_MAX_AGE_S = 300.0  # half the server's 600 s lease TTL
SESSION_RETRY_S = 5.0
SERVER_PROBE_S = 0.1  # how often a server whose Session ended is asked whether it is back

# (storage group, lease, positions of the leased blocks within the query)
_Held = tuple[int, bytes, tuple[int, ...]]


@dataclass
class _Probe:
    computed_blocks: int
    hashes: tuple[bytes, ...]
    created: float
    loading: bool = False
    hit_blocks: int = 0
    prefetched: bool = False  # the server answered Loading before Ready (SSD / P2P)
    # per shard: the leases held for this probe (storage group 0 first)
    leases: list[list[_Held]] = field(default_factory=list)

    @property
    def identity(self) -> tuple[int, tuple[bytes, ...]]:
        return (self.computed_blocks, self.hashes)

    @property
    def lease(self) -> bytes:
        """Shard 0's storage-group-0 lease (b"" when none)."""
        if self.leases and self.leases[0] and self.leases[0][0][0] == 0:
            return self.leases[0][0][1]
        return b""

    def take_leases(self) -> list[tuple[int, bytes]]:
        out = [(s, h[1]) for s, held in enumerate(self.leases) for h in held]
        self.leases = []
        self.hit_blocks = 0
        return out


@dataclass
class _Req:
    request: Any
    block_ids: list[int] = field(default_factory=list)  # prefix group's block table
    tables: dict[int, list[int]] = field(default_factory=dict)  # other vLLM groups
    cursor: int = 0  # blocks [0, cursor) are saved, loaded or locally cached
    save_planned: bool = False
    load_committed: bool = False  # an async load awaits its second alloc call
    load_start: int = 0  # block index of the first loaded block
    load_blocks: tuple[int, ...] = ()
    finished: bool = False


def _hashed_prefix(blocks: Any, group: int = 0) -> int | None:
    """Number of leading blocks of ``group`` that carry a block hash (locally cached)."""
    groups = getattr(blocks, "blocks", None)
    if not groups or group >= len(groups):
        return None
    n = 0
    for b in groups[group]:
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


def _saved_pairs(table, hashes, lo: int, hi: int) -> tuple[tuple[int, ...], tuple[bytes, ...]]:
    """Block ids ``table[lo:hi]`` and their hashes, without vLLM's null block 0 (skipped
    sliding-window / older state positions, never saved). No Python loop per block on
    the common path (slices; bytes() mapped in C: vLLM's hashes are bytes already, which
    bytes() returns as they are); a table shorter than ``hi`` ends the range."""
    ids = tuple(table[lo:hi])
    hs = tuple(map(bytes, hashes[lo:lo + len(ids)]))
    if 0 in ids:
        keep = tuple(map(bool, ids))
        ids, hs = tuple(compress(ids, keep)), tuple(compress(hs, keep))
    return ids, hs


def _is_preempted(request: Any) -> bool:
    status = getattr(request, "status", None)
    return getattr(status, "name", None) == "PREEMPTED"


def _all_ids(blocks: Any) -> tuple[list[int], ...]:
    if blocks is None:
        return ()
    ids = blocks.get_block_ids()
    return tuple(list(g) for g in ids) if ids else ()


def _positions(res: QueryResult, asked: int) -> tuple[int, ...]:
    """Positions (within the query) of the blocks a group>0 answer leased, in lease
    order: ``hit_positions``, or 0..n-1 for an answer without them (want-set)."""
    if not res.lease or res.loading:
        return ()
    pos = tuple(int(p) for p in (res.hit_positions or ()))
    if not pos:
        pos = tuple(range(min(int(res.num_hit_blocks), asked)))
    return pos


class SchedulerConnector:
    def __init__(self, ctx: ConnectorContext, client: Any, *, clock=time.monotonic,
                 probe_max_age_s: float = PROBE_MAX_AGE_S, session: bool = True,
                 session_thread: bool = True, session_retry_s: float = SESSION_RETRY_S):
        self.ctx = ctx
        # one client per TP shard server (a plain client: one shard)
        self.clients = list(client) if isinstance(client, (list, tuple)) else [client]
        self.client = self.clients[0]
        self._clock = clock
        self._probe_max_age = probe_max_age_s
        self._probes: dict[str, _Probe] = {}
        self._reqs: dict[str, _Req] = {}
        self._pending_loads: dict[str, LoadIntent] = {}
        self._awaiting_send: set[str] = set()
        self._rl = RateLimitedLog(log, clock=clock)
        self.block_pool = None  # vLLM's GPU BlockPool (bind_gpu_block_pool)
        self.recorder = StatsRecorder()  # what vLLM's get_kv_connector_stats reports
        self.events = EventTracker(ctx.world_size * len(self.clients))
        self.stats = {"queries": 0, "query_errors": 0, "hits": 0, "hit_tokens": 0,
                      "loads_committed": 0, "commit_failures": 0, "saves_planned": 0,
                      "releases": 0, "release_errors": 0, "shard_mismatches": 0}
        # liveness Session (one per shard server)
        self._session_enabled = session
        self._sessions: list = [None] * len(self.clients)
        self._session_retry = session_retry_s
        self._session_next = [0.0] * len(self.clients)
        self._down = [False] * len(self.clients)  # its Session ended; not answering yet
        self._probe_next = [0.0] * len(self.clients)
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

    def _q(self, shard: int, req_id: str, hashes, group: int = 0,
           membership: bool = False) -> QueryResult:
        self.stats["queries"] += 1
        try:
            ctx = self.ctx
            # (hashes as given: the binding takes a tuple or list without copying it)
            if group:
                res = self.clients[shard].query(
                    ctx.instance_id, req_id, hashes,
                    wait_for_full_prefix=ctx.wait_for_full_prefix and not membership,
                    timeout_ms=ctx.query_timeout_ms, group_id=group)
            else:
                res = self.clients[shard].query(
                    ctx.instance_id, req_id, hashes,
                    wait_for_full_prefix=ctx.wait_for_full_prefix and not membership,
                    timeout_ms=ctx.query_timeout_ms)
        except Exception as e:  # never into vLLM: a failed query is a miss
            self.stats["query_errors"] += 1
            self.recorder.add("query_errors")
            self._rl(logging.WARNING, "query", "QueryPrefetch failed, treating as a miss: %s", e)
            # FAILED_PRECONDITION: the server does not know this instance (it restarted),
            # so it holds nothing of ours - an answer; anything else is not one.
            return QueryResult.miss(unreachable=not isinstance(e, FailedPrecondition))
        return res

    def _release(self, lease: bytes, why: str, shard: int = 0) -> None:
        if not lease:
            return
        self.stats["releases"] += 1
        try:
            self.clients[shard].release(lease, timeout_ms=self.ctx.query_timeout_ms)
        except Exception as e:
            self.stats["release_errors"] += 1
            self._rl(logging.INFO, "release", "Release (%s) failed; the server's lease TTL "
                     "reclaims it: %s", why, e)

    def _release_probe(self, probe: _Probe, why: str) -> None:
        for shard, lease in probe.take_leases():
            self._release(lease, why, shard)

    def _drop_probe(self, req_id: str, why: str) -> None:
        p = self._probes.pop(req_id, None)
        if p is not None:
            self._release_probe(p, why)

    # ---------------------------------------------------------------- the lookup

    def _lookup(self, rid: str, probe: _Probe, max_blocks: int) -> bool:
        """Queries every shard (and, for hybrid models, every storage group) for the
        probe's hashes and leaves in the probe the longest usable prefix with leases of
        exactly that length. True: some server answered Loading (ask again later)."""
        hashes = probe.hashes
        nsh = len(self.clients)
        held: list[list[_Held]] = [[] for _ in range(nsh)]
        probe.loading = False

        def give_up(why: str) -> None:
            for s, hs in enumerate(held):
                for h in hs:
                    self._release(h[1], why, s)
            probe.leases, probe.hit_blocks = [], 0

        hits0, unreachable, loading = [], False, False
        for s in range(nsh):
            r = self._q(s, rid, hashes)
            if r.loading:
                loading = True
                continue
            unreachable |= bool(getattr(r, "unreachable", False))
            n = max(0, min(int(r.num_hit_blocks), len(hashes)))
            if n > 0 and not r.lease:
                n = 0  # a hit without a lease pins nothing: unusable
            if n > 0:
                held[s].append((0, r.lease, tuple(range(n))))
            elif r.lease:
                self._release(r.lease, "unusable hit", s)
            hits0.append(n)
        if loading:
            give_up("another shard is still loading")
            probe.loading = probe.prefetched = True
            return True
        if not unreachable and self.ctx.kv_events:
            self.events.answered(hashes, min(hits0))
        k = min(min(hits0), max(0, max_blocks))
        if k > 0 and self.ctx.hybrid:
            limit, cands = k, None
            for g in self.ctx.storage_groups[1:]:
                for s in range(nsh):
                    r, pos = self._query_group(s, rid, g, hashes, k)
                    if r.loading:
                        loading = True
                        break
                    if pos:
                        held[s].append((g.storage_id, r.lease, pos))
                    elif r.lease:
                        self._release(r.lease, "unusable hit", s)
                    if g.kind == FULL:
                        run = 0
                        while run < k and run in pos:
                            run += 1
                        limit = min(limit, run)
                    else:
                        c = {p + 1 for p in pos if p < k}
                        cands = c if cands is None else cands & c
                if loading:
                    break
            if loading:
                give_up("a group is still loading")
                probe.loading = probe.prefetched = True
                return True
            k = limit if cands is None else max((c for c in cands if c <= limit), default=0)
        if k <= 0:
            give_up("miss")
            return False
        # every shard's storage-group-0 lease covers exactly k blocks
        for s in range(nsh):
            g0 = held[s][0]
            if len(g0[2]) == k:
                continue
            rq = rid if nsh == 1 else f"{rid}:tp-common-{k}"
            r = self._q(s, rq, hashes[:k])
            got = int(r.num_hit_blocks) if (r.lease and not r.loading) else 0
            if got != k:
                if r.lease:
                    self._release(r.lease, "re-query mismatch", s)
                self.stats["shard_mismatches"] += 1
                self._rl(logging.INFO, "requery", "request %s: re-query of the common prefix "
                         "(%d blocks) hit %d on shard %d; treating it as a miss", rid, k, got, s)
                give_up("re-query mismatch")
                return False
            self._release(g0[1], "lease longer than the load", s)
            held[s][0] = (0, r.lease, tuple(range(k)))
        probe.leases, probe.hit_blocks = held, k
        return False

    def _query_group(self, s: int, rid: str, g, hashes, k: int
                     ) -> tuple[QueryResult, tuple[int, ...]]:
        """Storage group g > 0 of shard s over the first k hashes: (answer, positions of
        the leased blocks). Membership query by default; with wait_for_full_prefix the
        want-set form (all-or-nothing, may fetch from SSD / peers): every block for a
        full-attention group, the state at block k-1 for a recurrent group, falling back
        to a membership query (RAM) when that state is not to be had."""
        req = f"{rid}:group-{g.storage_id}"
        asked = list(range(k))
        if self.ctx.wait_for_full_prefix and g.kind != FULL:
            asked = [k - 1]
        r = self._q(s, req, [hashes[p] for p in asked], g.storage_id)
        if (not r.loading and not r.lease and self.ctx.wait_for_full_prefix
                and g.kind != FULL and k > 1):
            asked = list(range(k))
            r = self._q(s, req + ":any", hashes[:k], g.storage_id, membership=True)
        pos = tuple(asked[i] for i in _positions(r, len(asked)) if i < len(asked))
        return r, pos

    def _max_blocks(self, request: Any, num_computed_tokens: int) -> int:
        """Most blocks a load may cover: vLLM computes at least the last token itself;
        hybrid models resume only at block boundaries (recurrent states)."""
        left = request.num_tokens - num_computed_tokens - 1
        if left <= 0:
            return 0
        vbs = self.ctx.virtual_block_size
        return left // vbs if self.ctx.hybrid else cdiv(left, vbs)

    # ---------------------------------------------------------------- vLLM hooks

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        """vLLM's GPU BlockPool (scheduler, once, after the KV cache manager exists)."""
        self.block_pool = gpu_block_pool

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
        max_blocks = self._max_blocks(request, num_computed_tokens)

        probe = self._probes.get(rid)
        if probe is not None and probe.loading:
            # The server keys its fetch by req_id: keep polling with the original hashes.
            # (if the identity drifted, the stale answer is released once it is Ready)
            if self._lookup(rid, probe, self._max_blocks(request, probe.computed_blocks * vbs)):
                return None, False
        if probe is not None and (probe.identity != identity
                                  or now - probe.created > self._probe_max_age):
            self._drop_probe(rid, "probe drifted" if probe.identity != identity else "probe aged")
            probe = None
        if probe is None:
            if not hashes:
                return 0, False
            probe = _Probe(computed_blocks, hashes, now)
            self._probes[rid] = probe
            if self._lookup(rid, probe, max_blocks):
                return None, False
        return self._answer(request, probe, num_computed_tokens)

    def _answer(self, request: Any, probe: _Probe, num_computed_tokens: int
                ) -> tuple[int, bool]:
        vbs = self.ctx.virtual_block_size
        n = probe.hit_blocks
        if n <= 0:
            return 0, False
        hit_tokens = min(n * vbs, request.num_tokens - num_computed_tokens - 1)
        if hit_tokens <= 0:
            self._release_probe(probe, "hit covers only the last token")
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
        tables = _all_ids(blocks)
        g0 = self.ctx.prefix_group_index
        if num_external_tokens > 0:
            probe = self._probes.pop(rid, None)
            intent, start = self._commit(rid, blocks, tables, num_external_tokens, probe)
            if intent.lease is not None and probe is not None:
                vbs = self.ctx.virtual_block_size
                if self.ctx.kv_events:
                    ev = self.events
                    for j in range(cdiv(num_external_tokens, vbs)):
                        if not ev.announced(probe.hashes[j]):  # describe only what is new
                            ev.hit(probe.hashes[j],
                                   EventTracker.describe(request, start + j, vbs))
                tier = "prefetched" if probe.prefetched else "ram"
                self.recorder.add(f"hit_tokens_{tier}", num_external_tokens)
                self.recorder.add("miss_tokens", max(0, len(probe.hashes) * vbs
                                                     - num_external_tokens))
            self._pending_loads[rid] = intent
            n = cdiv(num_external_tokens, self.ctx.virtual_block_size)
            st.cursor = start + n
            st.load_committed = True
            st.load_start, st.load_blocks = start, intent.block_ids[:n]
        elif st.load_committed:
            st.load_committed = False  # the call after the async load: nothing to do
        else:
            # (Re)admission without an external load: a probe's lease is not needed.
            probe = self._probes.get(rid)
            if probe is not None and not probe.loading:
                self.recorder.add("miss_tokens", len(probe.hashes) * self.ctx.virtual_block_size)
            self._drop_probe(rid, "not loaded")
            hashed = _hashed_prefix(blocks, g0) or 0
            st.cursor = 0 if not self.ctx.read_enabled else hashed
        self._set_tables(st, tables, replace=True)

    def _set_tables(self, st: _Req, tables, replace: bool) -> None:
        g0 = self.ctx.prefix_group_index
        for vi, ids in enumerate(tables or ()):
            ids = list(ids)
            if vi == g0:
                st.block_ids = ids if replace else st.block_ids + ids
            else:
                st.tables[vi] = ids if replace else st.tables.get(vi, []) + ids
        if replace and not tables:
            st.block_ids, st.tables = [], {}

    def _commit(self, rid: str, blocks: Any, tables, num_external_tokens: int,
                probe: _Probe | None) -> tuple[LoadIntent, int]:
        vbs = self.ctx.virtual_block_size
        n = cdiv(num_external_tokens, vbs)
        g0 = self.ctx.prefix_group_index
        ids = list(tables[g0]) if g0 < len(tables) else []
        hashed = _hashed_prefix(blocks, g0)
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
        extra = self._other_dest(tables, start, n)
        shard_leases: tuple = ()
        if why is None and (self.ctx.hybrid or len(self.clients) > 1):
            shard_leases, why = self._targets(probe, tables, start, n, dest)
        if why is None:
            self.stats["loads_committed"] += 1
            return LoadIntent(dest + extra, probe.lease, num_external_tokens,
                              shard_leases), start
        self.stats["commit_failures"] += 1
        log.error("request %s: cannot commit the external load (%s); its %d blocks will be "
                  "reported as failed and recomputed", rid, why, len(dest) + len(extra))
        if probe is not None:
            self._release_probe(probe, "failed commit")
        return LoadIntent(dest + extra, None, num_external_tokens), start

    def _other_dest(self, tables, start: int, n: int) -> tuple[int, ...]:
        """Non-null destination blocks of the groups other than the prefix group."""
        g0 = self.ctx.prefix_group_index
        out = []
        for vi, t in enumerate(tables or ()):
            if vi != g0:
                out.extend(b for b in t[start:start + n] if b)
        return tuple(out)

    def _targets(self, probe: _Probe, tables, start: int, n: int, dest: tuple[int, ...]
                 ) -> tuple[tuple, str | None]:
        """Per shard, the GroupLeases of a commit; or why it cannot be committed."""
        by_sid = {g.storage_id: g for g in self.ctx.groups}
        unneeded: list[tuple[int, bytes]] = []
        out = []
        for s, held in enumerate(probe.leases):
            have = {h[0]: h for h in held}
            gls = []
            for sid in sorted(set(by_sid) | {0}):
                if sid == 0:
                    g0 = have.get(0)
                    if g0 is None or len(g0[2]) != n:
                        return (), f"shard {s} holds no lease of {n} prefix blocks"
                    gls.append(GroupLease(0, g0[1], dest))
                    continue
                g = by_sid[sid]
                table = tables[g.vllm_index] if g.vllm_index < len(tables) else []
                h = have.get(sid)
                pos = h[2] if h is not None else ()
                stored = {p for p in pos if p < n}
                for p in range(n):
                    j = start + p
                    if j < len(table) and table[j] and p not in stored:
                        return (), (f"KV cache group {g.vllm_index} needs block {j}, which the "
                                    f"server does not hold (shard {s})")
                if h is None:
                    continue
                targets = tuple((table[start + p] or None) if p < n and start + p < len(table)
                                else None for p in pos)
                if any(t is not None for t in targets):
                    gls.append(GroupLease(sid, h[1], targets))
                else:
                    unneeded.append((s, h[1]))
            out.append(tuple(gls))
        for s, lease in unneeded:
            self._release(lease, "no destination for these blocks", s)
        return tuple(out), None

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
                st.block_ids, st.tables = [], {}  # freed; re-admission sets them again
        nsched = scheduler_output.num_scheduled_tokens
        for nr in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(nr.req_id)
            if st is None:
                continue
            self._set_tables(st, nr.block_ids, replace=True)
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
                self._set_tables(st, new_ids or (), replace=True)
            elif new_ids:
                self._set_tables(st, new_ids, replace=False)
            self._plan_save(plan, rid, st, cr.num_computed_tokens[i], nsched.get(rid, 0))
        plan.preempted = preempted
        return plan

    def _plan_save(self, plan: StepPlan, rid: str, st: _Req, num_computed: int,
                   num_scheduled: int) -> None:
        if num_scheduled <= 0:
            return
        hashes = st.request.block_hashes  # live: grows during decode
        vbs = self.ctx.virtual_block_size
        end = num_computed + num_scheduled
        full = min(end // vbs, _publishable(st.request), len(st.block_ids))
        cur = st.cursor
        if full <= cur:
            return
        ids, hs = _saved_pairs(st.block_ids, hashes, cur, full)
        if self.ctx.kv_events:
            ev = self.events
            for i in range(cur, full):
                if st.block_ids[i] != 0:
                    ev.planned(bytes(hashes[i]), EventTracker.describe(st.request, i, vbs))
        extra = []
        for g in self.ctx.storage_groups[1:] if self.ctx.hybrid else ():
            table = st.tables.get(g.vllm_index, [])
            if g.kind == FULL:
                gids, ghs = _saved_pairs(table, hashes, cur, full)
            elif end % vbs == 0 and full == end // vbs:
                # the state after exactly ``full`` blocks
                gids, ghs = _saved_pairs(table, hashes, full - 1, full)
            else:
                continue  # the step ended inside a block: no state at a block boundary
            if gids:
                extra.append((g.storage_id, gids, ghs))
        st.cursor = full
        if not ids and not extra:
            return
        plan.saves[rid] = SaveIntent(ids, hs, tuple(extra))
        st.save_planned = True
        self.stats["saves_planned"] += 1

    def update_connector_output(self, connector_output: Any) -> None:
        ev = getattr(connector_output, "kv_cache_events", None)
        if ev is not None and self.ctx.kv_events and getattr(ev, "pegaflow", False):
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

    def request_finished_all_groups(self, request: Any, block_ids: Any = None
                                    ) -> tuple[bool, dict | None]:
        """SupportsHMA: vLLM's finish hook for every group (also with one group)."""
        return self.request_finished(request, block_ids)

    def take_events(self) -> list[tuple]:
        """Router events since the last call (plain records; see events.py)."""
        return self.events.take()

    def has_pending_push_work(self) -> bool:
        """True while finished requests wait for their saves (keeps vLLM stepping so the
        workers can report them and vLLM can free the blocks)."""
        return bool(self._awaiting_send)

    # ---------------------------------------------------------------- Session

    def ensure_session(self) -> bool:
        """Open the liveness Session on every shard server where it is not open (at most
        every session_retry_s per server). True when all are open."""
        if not self._session_enabled:
            return False
        ok = True
        with self._session_lock:
            for i in range(len(self.clients)):
                ok &= self._ensure_one(i)
        return ok

    def _ensure_one(self, i: int) -> bool:
        s = self._sessions[i]
        try:
            if s is not None and s.alive():
                return True
        except Exception:
            pass
        now = self._clock()
        if s is not None and not self._down[i]:
            self._down[i] = True  # the server process ended (or restarts): watch for it
        if self._down[i]:
            if not self._server_back(i, now):
                return False
            self._session_next[i] = now  # back: the Session again at once
        if now < self._session_next[i]:
            return False
        self._session_next[i] = now + self._session_retry
        if s is not None:
            self._sessions[i] = None
            try:
                s.close()
            except Exception:
                pass
        try:
            self._sessions[i] = self.clients[i].open_session(
                self.ctx.instance_id, self.ctx.namespace_of_shard(i), self.ctx.tp_size,
                self.ctx.world_size, timeout_ms=self.ctx.query_timeout_ms)
        except Exception as e:
            self._rl(logging.WARNING, f"session{i}", "cannot open the liveness Session%s "
                     "(will retry): %s", f" of shard {i}" if len(self.clients) > 1 else "", e)
            return False
        self._rl.reset(f"session{i}")
        log.debug("liveness Session open for %s (shard %d)", self.ctx.instance_id, i)
        return True

    def _server_back(self, i: int, now: float) -> bool:
        """After the Session ended: is the server answering again? Asked on a fresh
        channel (EngineClient.fresh) every SERVER_PROBE_S, since the client's own channel
        sits in gRPC's reconnect backoff (seconds) after the failed calls; once it answers,
        that backoff is dropped (reconnect) so queries reach the new process at once."""
        if now < self._probe_next[i]:
            return False
        self._probe_next[i] = now + SERVER_PROBE_S
        fresh = getattr(self.clients[i], "fresh", None)
        if fresh is not None:
            c = fresh(1000)
            try:
                c.health(timeout_ms=1000)
            except Exception:
                return False
            finally:
                c.close()
            reconnect = getattr(self.clients[i], "reconnect", None)
            if reconnect is not None:
                reconnect()
        self._down[i] = False
        return True

    def _keep_session(self) -> None:
        while not self._stop.wait(SERVER_PROBE_S if any(self._down) else 1.0):
            try:
                self.ensure_session()
            except Exception:  # pragma: no cover
                log.exception("session keeper")

    @property
    def session(self):
        return self._sessions[0]

    @property
    def sessions(self) -> list:
        return list(self._sessions)

    # ---------------------------------------------------------------- shutdown

    def shutdown(self) -> None:
        self._stop.set()
        if self._keeper is not None:
            self._keeper.join(timeout=5)
        for rid in list(self._probes):
            self._drop_probe(rid, "shutdown")
        with self._session_lock:
            ss, self._sessions = self._sessions, [None] * len(self.clients)
            self._session_enabled = False
        for s in ss:
            if s is not None:
                try:
                    s.close()
                except Exception:
                    pass
