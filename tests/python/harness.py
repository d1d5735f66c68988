"""Step-loop harness: a MODEL of vLLM's engine loop (scheduler + N TP workers) around
PegaKVConnector, after vLLM main @003df29 (vllm/v1/core/sched/scheduler.py,
kv_connector_model_runner_mixin.py, kv_connector/utils.py KVOutputAggregator). It is not
vLLM; it replays the call order the connector sees:

  schedule():  promote WAITING_FOR_REMOTE_KVS requests whose load finished (vLLM's
               _update_waiting_for_remote_kv, incl. the "-1" full-hit rule and the
               truncation of failed loads); running requests first (chunked prefill /
               decode, preemption of the last running request when blocks run out);
               then, unless this step preempted, waiting requests: get_num_new_matched_tokens (None -> retry next
               step) -> allocate -> update_state_after_alloc; async loads park the
               request in WAITING_FOR_REMOTE_KVS; build_connector_meta.
  workers:     per TP worker, the metadata pickled (vLLM ships it across processes) ->
               bind -> handle_preemptions -> start_load_kv -> forward (writes KV) ->
               wait_for_save -> get_finished -> get_block_ids_with_load_errors ->
               get_kv_connector_stats / get_kv_connector_kv_cache_events -> clear.
  aggregate:   a request id surfaces only when every worker reported it; stats objects
               summed with aggregate(); KV-event containers added to the first one's.
  update:      invalid blocks (policy recompute/fail), finished_recving,
               finished_sending frees delayed blocks, update_connector_output, the
               scheduler connector's stats added (stats_mode "main": always; "legacy":
               only with worker stats) and logged as SchedulerStats would carry them
               (stats_log), take_events (events), sampled tokens, finished requests ->
               request_finished (True delays the free).

The "model" is deterministic: the KV written for position p is a function of the token
prefix up to p (so identical prefixes produce identical KV, as in a real model) and the
sampled token likewise (greedy decoding). Block contents can therefore be checked byte
for byte: a loaded block must equal what the saving request wrote.

Hybrid mode (``hybrid=True``): a second KV cache group of one Mamba-style layer
(MambaSpec, mamba_cache_mode "align", one page per block, its own block pool): the
request's state lives in the block of the position holding its last computed token;
positions before the newest state are null (block 0) and an older state block is freed
when a newer one is allocated (vLLM does not tell the connector); a load of k blocks gets
null state blocks except at position k-1. Every loaded state is compared with the state
the model defines for that prefix (``ReqLog.states_checked``).

MLA mode (``mla=True``): the model config has ``kv_lora_rank``; each layer's cache is
``(N, block, heads * head_dim * 2)`` (one latent row per token), identical on every TP
rank (the KV values do not depend on the worker), so the connector registers page-first
and stripes saves across ranks.

Backends: FakeBackend (in-memory FakeServer, numpy "GPU") and RealBackend (the C server
with sim KV caches over libpegaflow's shared memory).
"""

from __future__ import annotations

import hashlib
from types import SimpleNamespace
import pickle
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from vllm.config import (
    CacheConfig,
    KVEventsConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed import parallel_state
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.forward_context import ForwardContext
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_request_block_hasher
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus

import pegaflow.connector._facade as facade

DTYPE = np.uint16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------ backends


class FakeBackend:
    name = "fake"

    def __init__(self, server):
        self.server = server

    def client(self):
        from fakes import FakeEngineClient

        return FakeEngineClient(self.server)

    def alloc(self, rank: int, shape: tuple[int, ...], names: list[str]):
        from fakes import HostTensor

        return None, {n: HostTensor(np.zeros(shape, dtype=DTYPE), device=rank) for n in names}

    def adapter(self, tensor, client):
        from fakes import HostDeviceAdapter

        return HostDeviceAdapter(tensor.dev)


class RealBackend:
    name = "real"

    def __init__(self, target: str, lib):
        self.target = target
        self.lib = lib

    def client(self):
        from pegaflow.client.engine import EngineClient

        return EngineClient(self.target, lib=self.lib, timeout_ms=10_000, query_timeout_ms=2_000)

    def alloc(self, rank: int, shape: tuple[int, ...], names: list[str]):
        from pegaflow.device.sim import allocate_kv_caches

        return allocate_kv_caches(names, shape, DTYPE, sim_device=rank, lib=self.lib)

    def adapter(self, tensor, client):
        from pegaflow.device.sim import SimDeviceAdapter

        return SimDeviceAdapter(tensor.sim_device)


class ShardedBackend:
    """One backend per server endpoint (``pegaflow.tp_shard_endpoints``): clients go to
    the endpoint's server; KV memory comes from the first backend."""

    sharded = True

    def __init__(self, by_endpoint: dict[str, Any]):
        self.by_endpoint = dict(by_endpoint)
        self.first = next(iter(self.by_endpoint.values()))
        self.name = self.first.name

    def client(self, endpoint: str):
        return self.by_endpoint[endpoint].client()

    def alloc(self, rank, shape, names):
        return self.first.alloc(rank, shape, names)

    def adapter(self, tensor, client):
        return self.first.adapter(tensor, client)


# ------------------------------------------------------------------ engine model


class BlockPool:
    def __init__(self, num_blocks: int):
        self.null = KVCacheBlock(0, is_null=True)
        self.free: deque[KVCacheBlock] = deque(KVCacheBlock(i) for i in range(1, num_blocks))

    def alloc(self, n: int) -> list[KVCacheBlock] | None:
        if n > len(self.free):
            return None
        return [self.free.popleft() for _ in range(n)]

    def release(self, blocks: list[KVCacheBlock]) -> None:
        for b in blocks:
            b.reset_hash()
            self.free.append(b)


class Aggregator:
    """KVOutputAggregator model: ids surface once all ``n`` workers reported them; a
    worker reporting an id again before it surfaced is a connector bug."""

    def __init__(self, n: int):
        self.n = n
        self.counts = {"s": Counter(), "r": Counter()}
        self.reported = {"s": [set() for _ in range(n)], "r": [set() for _ in range(n)]}

    def aggregate(self, outs: list[KVConnectorOutput]) -> KVConnectorOutput:
        done = {"s": set(), "r": set()}
        invalid: set[int] = set()
        for w, o in enumerate(outs):
            for kind, ids in (("s", o.finished_sending), ("r", o.finished_recving)):
                for rid in ids or ():
                    assert rid not in self.reported[kind][w], \
                        f"worker {w} reported {rid} twice in finished_{kind}"
                    self.reported[kind][w].add(rid)
                    self.counts[kind][rid] += 1
                    if self.counts[kind][rid] == self.n:
                        done[kind].add(rid)
                        del self.counts[kind][rid]
                        for r in self.reported[kind]:
                            r.discard(rid)
            invalid |= set(o.invalid_block_ids or ())
        # connector stats: summed over workers with the stats objects' aggregate();
        # KV events: every worker's added to the first one's container
        stats = None
        events = None
        for o in outs:
            if o.kv_connector_stats:
                stats = o.kv_connector_stats if stats is None else stats.aggregate(
                    o.kv_connector_stats)
            # (as vLLM's KVOutputAggregator: the first worker's object accumulates)
            if events is None:
                events = o.kv_cache_events
            elif o.kv_cache_events:
                events.add_events(o.kv_cache_events.get_all_events())
                events.increment_workers(1)
        return KVConnectorOutput(finished_sending=done["s"] or None,
                                 finished_recving=done["r"] or None,
                                 invalid_block_ids=invalid, kv_connector_stats=stats,
                                 kv_cache_events=events)


@dataclass
class ReqLog:
    waited_remote_steps: int = 0
    loaded_blocks: int = 0
    load_failed: bool = False
    finished_status: RequestStatus | None = None
    freed: bool = False
    delayed_free: bool = False
    snapshot: dict[bytes, list[bytes]] = field(default_factory=dict)  # hash -> per worker
    loaded: dict[bytes, list[bytes]] = field(default_factory=dict)
    preemptions: int = 0
    states_checked: int = 0  # loaded recurrent states compared (hybrid)


class Engine:
    """One "vLLM" (one instance id): a scheduler-side connector and ``tp`` workers."""

    def __init__(self, backend, patch: Callable, *, instance_id: str, tp: int = 2,
                 layers: int = 2, num_blocks: int = 48, block_size: int = 16, heads: int = 2,
                 head_dim: int = 8, token_budget: int = 64, policy: str = "recompute",
                 extra_config: dict | None = None, seed: int = 1234,
                 report_preempted: bool = True, stats_mode: str = "main",
                 hybrid: bool = False, mla: bool = False, kv_events: bool = True):
        self.backend = backend
        self.tp = tp
        self.L = layers
        self.bs = block_size
        self.heads = heads
        self.head_dim = head_dim
        self.budget = token_budget
        self.policy = policy
        self.seed = seed
        self.stats_mode = stats_mode
        self.stats_log: list[dict] = []  # KVConnectorStats.data per step, as vLLM ships it
        self.events: list = []  # KV events the scheduler published
        self.report_preempted = report_preempted  # False: SchedulerOutput without them
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
        self.hybrid = hybrid
        self.mla = mla
        self.mamba_name = f"model.layers.{layers}.mixer"
        self.state_elems = 2 * block_size * heads * head_dim  # one page, like attention
        kv_cache_utils.init_none_hash(sha256)
        self.hasher = get_request_block_hasher(block_size, sha256)
        patch(facade, "_make_client", lambda ctx, endpoint: backend.client(endpoint)
              if getattr(backend, "sharded", False) else backend.client())
        patch(facade, "_device_adapter_for", backend.adapter)

        self.vllm_config = VllmConfig(
            model_config=ModelConfig(model="pegaflow-test/tiny", dtype="torch.float16",
                                     num_kv_heads=heads * tp, head_size=head_dim,
                                     num_hidden_layers=layers,
                                     hf_text_config=SimpleNamespace(
                                         kv_lora_rank=512 if mla else None)),
            cache_config=CacheConfig(block_size=block_size),
            parallel_config=ParallelConfig(tensor_parallel_size=tp),
            scheduler_config=SchedulerConfig(disable_hybrid_kv_cache_manager=not hybrid),
            # KV events published (--kv-events-config '{"enable_kv_cache_events": true}');
            # kv_events=False: vLLM's default, the connector does no event work
            kv_events_config=KVEventsConfig(enable_kv_cache_events=True) if kv_events
            else None,
            kv_transfer_config=KVTransferConfig(
                kv_connector="PegaKVConnector", kv_role="kv_both",
                kv_connector_module_path="pegaflow.connector", engine_id=instance_id,
                kv_connector_extra_config=dict(extra_config or {}),
                kv_load_failure_policy=policy),
        )
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=heads,
                                 head_size=head_dim, dtype=DTYPE)
        page = 2 * block_size * heads * head_dim * np.dtype(DTYPE).itemsize
        groups = [KVCacheGroupSpec(list(self.layer_names), spec)]
        if hybrid:
            from vllm.v1.kv_cache_interface import MambaSpec

            groups.append(KVCacheGroupSpec([self.mamba_name], MambaSpec(
                block_size=block_size, shapes=((self.state_elems,),), dtypes=(DTYPE,),
                mamba_cache_mode="align")))
        self.kv_cache_config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[KVCacheTensor(num_blocks * page, [n]) for n in self.layer_names],
            kv_cache_groups=groups)
        self.num_blocks = num_blocks

        parallel_state.set_ranks(0, 0, 0)
        self.sched = KVConnectorFactory.create_connector(self.vllm_config,
                                                         KVConnectorRole.SCHEDULER,
                                                         self.kv_cache_config)
        self.workers = []
        self.kv: list[dict[str, Any]] = []
        self._keep = []
        self.cross = None
        for r in range(tp):
            parallel_state.set_ranks(r, 0, 0)
            w = KVConnectorFactory.create_connector(self.vllm_config, KVConnectorRole.WORKER,
                                                    self.kv_cache_config)
            if w.prefer_cross_layer_blocks:
                self.cross = True
                shape = (num_blocks, layers, 2, block_size, heads, head_dim)
                keep, t = backend.alloc(r, shape, ["ALL_LAYERS"])
                w.register_cross_layers_kv_cache(t["ALL_LAYERS"], None)
            else:
                self.cross = False
                shape = ((num_blocks, block_size, 2 * heads * head_dim) if mla
                         else (2, num_blocks, block_size, heads, head_dim))
                keep, t = backend.alloc(r, shape, self.layer_names)
                regs = dict(t)
                if hybrid:
                    mkeep, m = backend.alloc(r, (num_blocks, self.state_elems),
                                             [self.mamba_name])
                    self._keep.append(mkeep)
                    t = {**t, **m}
                    regs[self.mamba_name] = [m[self.mamba_name]]  # vLLM: a list of states
                w.register_kv_caches(regs)
            self._keep.append(keep)
            self.kv.append(t)
            self.workers.append(w)
        parallel_state.set_ranks(0, 0, 0)

        self.pool = BlockPool(num_blocks)
        self.mpool = BlockPool(num_blocks)  # the state group's blocks
        self.mam: dict[str, list[KVCacheBlock]] = {}  # per position; null = mpool.null
        self.sched.bind_gpu_block_pool(self.pool)  # vLLM: Scheduler.__init__
        self.agg = Aggregator(tp)
        self.requests: dict[str, Request] = {}
        self.req_blocks: dict[str, list[KVCacheBlock]] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.finished_recving: set[str] = set()
        self.failed_recving: set[str] = set()
        self.delayed: set[str] = set()
        self.finished_ids: set[str] = set()
        self.logs: dict[str, ReqLog] = {}
        self.before_workers: Callable[[SchedulerOutput], None] | None = None
        self._ctx_hash: dict[str, list[int]] = {}
        self.steps = 0

    # ---------------------------------------------------------------- model

    def _prefix_hashes(self, req: Request, upto: int) -> list[int]:
        hs = self._ctx_hash.setdefault(req.request_id, [])
        toks = req.all_token_ids
        while len(hs) < upto:
            prev = hs[-1] if hs else self.seed
            d = hashlib.blake2b(prev.to_bytes(8, "little") +
                                int(toks[len(hs)]).to_bytes(8, "little"), digest_size=8)
            hs.append(int.from_bytes(d.digest(), "little"))
        return hs

    def _kv_values(self, worker: int, h: int) -> np.ndarray:
        if self.mla:
            worker = 0  # MLA: the latent KV is the same on every TP rank
        rng = np.random.default_rng([self.seed, worker, h & 0xFFFFFFFFFFFF])
        return rng.integers(0, 65536, size=(self.L, 2, self.heads, self.head_dim),
                            dtype=np.uint32).astype(DTYPE)

    def _state_values(self, worker: int, h: int) -> np.ndarray:
        """The recurrent state after the token whose prefix hash is h."""
        rng = np.random.default_rng([self.seed, 7, worker, h & 0xFFFFFFFFFFFF])
        return rng.integers(0, 65536, size=self.state_elems, dtype=np.uint32).astype(DTYPE)

    def _mam_extend(self, req: Request, ntokens: int) -> list[int] | None:
        """State table after computing up to ``ntokens``: positions up to the one holding
        the last token, null except that one (a real block); an older real block is
        freed and nulled. Returns the ids of the appended positions; None: no block."""
        rid = req.request_id
        t = self.mam.setdefault(rid, [])
        end = cdiv(ntokens, self.bs) - 1
        before = len(t)
        while len(t) <= end:
            t.append(self.mpool.null)
        if end >= 0 and t[end].block_id == 0:
            got = self.mpool.alloc(1)
            if got is None:
                del t[before:]
                return None
            t[end] = got[0]
        for i in range(len(t)):
            if i != end and t[i].block_id != 0 and i < end:
                self.mpool.release([t[i]])
                t[i] = self.mpool.null
        return [b.block_id for b in t[before:]]

    def _groups(self, rid: str, attn_ids: list[int], mam_new: list[int] | None = None,
                whole: bool = False):
        """Block ids per group as vLLM ships them (hybrid: attention, state)."""
        if not self.hybrid:
            return (attn_ids,)
        mam = [b.block_id for b in self.mam.get(rid, [])] if whole else list(mam_new or [])
        return (attn_ids, mam)

    def _blocks(self, rid: str) -> KVCacheBlocks:
        groups = [list(self.req_blocks.get(rid, []))]
        if self.hybrid:
            groups.append(list(self.mam.get(rid, [])))
        return KVCacheBlocks(tuple(groups))

    def _sample(self, req: Request) -> int:
        h = self._prefix_hashes(req, req.num_tokens)[-1]
        return 100 + h % 30000

    def _arr(self, w: int, layer: int) -> tuple[np.ndarray, bool]:
        if self.cross:
            return self.kv[w]["ALL_LAYERS"].numpy(), True
        return self.kv[w][self.layer_names[layer]].numpy(), False

    def _write_token(self, w: int, block: int, slot: int, vals: np.ndarray) -> None:
        for l in range(self.L):
            a, cross = self._arr(w, l)
            if cross:
                a[block, l, :, slot] = vals[l]
            elif self.mla:
                a[block, slot] = vals[l].reshape(-1)
            else:
                a[:, block, slot] = vals[l]

    def read_block(self, w: int, block: int) -> bytes:
        out = []
        for l in range(self.L):
            a, cross = self._arr(w, l)
            out.append((a[block, l] if cross else a[block] if self.mla
                        else a[:, block]).tobytes())
        return b"".join(out)

    def zero_caches(self) -> None:
        for w in range(self.tp):
            for t in self.kv[w].values():
                t.numpy()[...] = 0

    def forward(self, w: int, so: SchedulerOutput, pre: dict[str, int],
                blocks: dict[str, list[int]]) -> None:
        """Worker w's forward pass: writes the KV of every scheduled token."""
        for rid, n in so.num_scheduled_tokens.items():
            req = self.requests[rid]
            start = pre[rid]
            hs = self._prefix_hashes(req, start + n)
            for pos in range(start, start + n):
                b = blocks[rid][pos // self.bs]
                self._write_token(w, b, pos % self.bs, self._kv_values(w, hs[pos]))
            if self.hybrid and n > 0:
                sb = self.mam[rid][cdiv(start + n, self.bs) - 1].block_id
                assert sb != 0, "the state of the last computed token has no block"
                self.kv[w][self.mamba_name].numpy()[sb] = self._state_values(w, hs[start + n - 1])

    # ---------------------------------------------------------------- API

    def add_request(self, rid: str, prompt: list[int], max_tokens: int = 4,
                    cache_salt: str | None = None) -> Request:
        req = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens), None,
                      cache_salt=cache_salt, block_hasher=self.hasher)
        self.requests[rid] = req
        self.waiting.append(req)
        self.logs[rid] = ReqLog()
        return req

    def _ensure_blocks(self, req: Request, ntokens: int) -> bool:
        have = self.req_blocks.setdefault(req.request_id, [])
        need = cdiv(ntokens, self.bs) - len(have)
        if need <= 0:
            return True
        got = self.pool.alloc(need)
        if got is None:
            return False
        have.extend(got)
        return True

    def _free(self, rid: str) -> None:
        self.pool.release(self.req_blocks.pop(rid, []))
        self.mpool.release([b for b in self.mam.pop(rid, []) if b.block_id != 0])
        self.logs[rid].freed = True

    def _preempt(self, req: Request, preempted: set[str]) -> None:
        self.running.remove(req)
        self._free(req.request_id)
        self.logs[req.request_id].freed = False
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.logs[req.request_id].preemptions += 1
        self.waiting.appendleft(req)
        preempted.add(req.request_id)

    def _promote(self, req: Request) -> None:
        rid = req.request_id
        self.finished_recving.discard(rid)
        if rid in self.failed_recving:
            self.failed_recving.discard(rid)
            n = req.num_computed_tokens
        else:
            n = min(len(self.req_blocks.get(rid, [])) * self.bs, req.num_tokens)
            if n == req.num_tokens:
                n -= 1
            nb = cdiv(req.num_computed_tokens, self.bs)
            lg = self.logs[rid]
            lg.loaded_blocks = nb
            for i in range(min(nb, len(req.block_hashes))):
                b = self.req_blocks[rid][i].block_id
                lg.loaded[req.block_hashes[i]] = [self.read_block(w, b) for w in range(self.tp)]
            if self.hybrid and nb > 0:
                # the state at the resume point is the model's state after nb blocks
                sb = self.mam[rid][nb - 1].block_id
                hs = self._prefix_hashes(req, nb * self.bs)
                for w in range(self.tp):
                    got = self.kv[w][self.mamba_name].numpy()[sb]
                    assert np.array_equal(got, self._state_values(w, hs[nb * self.bs - 1])), \
                        f"{rid}: loaded state of block {nb - 1} differs (worker {w})"
                lg.states_checked += 1
        req.num_computed_tokens = n
        req.status = RequestStatus.PREEMPTED if req.num_preemptions else RequestStatus.WAITING

    def schedule(self) -> tuple[SchedulerOutput, dict[str, int]]:
        budget = self.budget
        new_reqs, cached = [], CachedRequestData.make_empty()
        nsched: dict[str, int] = {}
        pre: dict[str, int] = {}
        preempted: set[str] = set()

        for req in list(self.running):
            if req not in self.running or budget <= 0:
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                continue
            before = len(self.req_blocks.get(req.request_id, []))
            while not self._ensure_blocks(req, req.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim, preempted)
                if victim is req:
                    break
            if req not in self.running:
                continue
            mam_new = self._mam_extend(req, req.num_computed_tokens + n) if self.hybrid else []
            assert mam_new is not None, "state pool exhausted"
            new_ids = [b.block_id for b in self.req_blocks[req.request_id][before:]]
            cached.req_ids.append(req.request_id)
            cached.new_block_ids.append(self._groups(req.request_id, new_ids, mam_new)
                                        if new_ids or mam_new else None)
            cached.new_token_ids.append([])
            cached.num_computed_tokens.append(req.num_computed_tokens)
            cached.num_output_tokens.append(req.num_output_tokens)
            nsched[req.request_id] = n
            pre[req.request_id] = req.num_computed_tokens
            budget -= n

        skipped = deque()
        # vLLM schedules no waiting request in a step that preempted one
        while self.waiting and budget > 0 and not preempted:
            req = self.waiting.popleft()
            rid = req.request_id
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:
                if rid not in self.finished_recving:
                    self.logs[rid].waited_remote_steps += 1
                    skipped.append(req)
                    continue
                self._promote(req)
            resumed = req.status == RequestStatus.PREEMPTED
            ext, is_async = 0, False
            if req.num_computed_tokens == 0:
                ext, is_async = self.sched.get_num_new_matched_tokens(req, 0)
                if ext is None:
                    skipped.append(req)
                    continue
                assert ext == 0 or is_async, "PegaFlow loads are always asynchronous"
                assert not (ext == 0 and is_async), "load_async must be False for 0 tokens"
            if is_async and ext > 0:
                if not self._ensure_blocks(req, ext):
                    skipped.append(req)
                    break
                if self.hybrid:
                    assert self._mam_extend(req, ext) is not None
                self.sched.update_state_after_alloc(req, self._blocks(rid), ext)
                req.num_computed_tokens = ext
                req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                skipped.append(req)
                continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            before = len(self.req_blocks.get(rid, []))
            if not self._ensure_blocks(req, req.num_computed_tokens + n):
                skipped.append(req)
                break
            if self.hybrid:
                assert self._mam_extend(req, req.num_computed_tokens + n) is not None
            self.sched.update_state_after_alloc(req, self._blocks(rid), 0)
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            ids = [b.block_id for b in self.req_blocks[rid]]
            if resumed:
                cached.req_ids.append(rid)
                cached.resumed_req_ids.add(rid)
                cached.new_block_ids.append(self._groups(rid, ids, whole=True))
                cached.new_token_ids.append([])
                cached.num_computed_tokens.append(req.num_computed_tokens)
                cached.num_output_tokens.append(req.num_output_tokens)
            else:
                new_reqs.append(NewRequestData.from_request(req, self._groups(rid, ids,
                                                                              whole=True)))
            nsched[rid] = n
            pre[rid] = req.num_computed_tokens
            budget -= n
        self.waiting = skipped + self.waiting

        so = SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=nsched, total_num_scheduled_tokens=sum(nsched.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0], finished_req_ids=self.finished_ids,
            free_encoder_mm_hashes=[],
            preempted_req_ids=(preempted or None) if self.report_preempted else None)
        self.finished_ids = set()
        so.kv_connector_metadata = self.sched.build_connector_meta(so)
        for rid, n in nsched.items():  # vLLM's _update_after_schedule
            self.requests[rid].num_computed_tokens += n
        return so, pre

    def run_workers(self, so: SchedulerOutput, pre: dict[str, int]) -> KVConnectorOutput:
        if self.before_workers is not None:
            self.before_workers(so)
        wire = pickle.dumps(so.kv_connector_metadata)
        outs = []
        forward = so.total_num_scheduled_tokens > 0
        # block tables as the workers know them for this step
        tables = {rid: [b.block_id for b in self.req_blocks[rid]] for rid in so.num_scheduled_tokens}
        for rid in so.num_scheduled_tokens:  # (the state table as of this step)
            self.mam.setdefault(rid, [])
        for i, w in enumerate(self.workers):
            # vLLM's order per worker: pre_forward (handle_preemptions, bind, start_load_kv)
            # -> forward -> post_forward (wait_for_save, get_finished, errors, clear)
            meta = pickle.loads(wire)
            w.bind_connector_metadata(meta)
            w.handle_preemptions(meta)
            w.start_load_kv(ForwardContext())
            if forward:
                self.forward(i, so, pre, tables)
                w.wait_for_save()
            fs, fr = w.get_finished(set(so.finished_req_ids))
            errs = w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
            outs.append(KVConnectorOutput(finished_sending=fs, finished_recving=fr,
                                          invalid_block_ids=errs,
                                          kv_connector_stats=w.get_kv_connector_stats(),
                                          kv_cache_events=w.get_kv_connector_kv_cache_events()))
        return self.agg.aggregate(outs)

    def _connector_finished(self, req: Request, ids: list[int]):
        """vLLM's Scheduler._connector_finished: SupportsHMA connectors get every group's
        block ids through request_finished_all_groups, others group 0's."""
        from vllm.distributed.kv_transfer.kv_connector.v1.base import supports_hma

        if supports_hma(self.sched):
            return self.sched.request_finished_all_groups(
                req, self._groups(req.request_id, ids, whole=True))
        return self.sched.request_finished(req, ids)

    def _finish(self, req: Request, status: RequestStatus) -> None:
        rid = req.request_id
        req.status = status
        lg = self.logs[rid]
        lg.finished_status = status
        blocks = self.req_blocks.get(rid, [])
        for i in range(min(len(req.block_hashes), len(blocks),
                           req.num_computed_tokens // self.bs)):
            lg.snapshot[req.block_hashes[i]] = [self.read_block(w, blocks[i].block_id)
                                                for w in range(self.tp)]
        delay, _ = self._connector_finished(req, [b.block_id for b in blocks])
        self.finished_ids.add(rid)
        if delay:
            lg.delayed_free = True
            self.delayed.add(rid)
        else:
            self._free(rid)

    def update(self, so: SchedulerOutput, out: KVConnectorOutput) -> None:
        invalid = set(out.invalid_block_ids or ())
        if invalid:
            for req in list(self.waiting):
                if req.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                    continue
                ids = [b.block_id for b in self.req_blocks.get(req.request_id, [])]
                ncomp = cdiv(req.num_computed_tokens, self.bs)
                bad = [i for i, b in enumerate(ids[:ncomp]) if b in invalid]
                if not bad:
                    continue
                self.logs[req.request_id].load_failed = True
                if self.policy == "fail":
                    self.waiting.remove(req)
                    self._finish(req, RequestStatus.FINISHED_ERROR)
                    continue
                req.num_computed_tokens = bad[0] * self.bs
                self.failed_recving.add(req.request_id)
        for rid in out.finished_recving or ():
            if rid in self.delayed and self.requests[rid].is_finished():
                self.delayed.discard(rid)
                self._free(rid)
            else:
                self.finished_recving.add(rid)
        for rid in out.finished_sending or ():
            assert rid in self.delayed, f"finished_sending for {rid}, which holds no blocks"
            self.delayed.discard(rid)
            self._free(rid)
        self.sched.update_connector_output(out)
        # vLLM's update_from_output: the scheduler connector's stats join the workers'
        # (main: always; "legacy" releases: only when the workers reported some), the
        # sum travels in SchedulerStats to the frontend (stats_log = what it receives).
        stats = out.kv_connector_stats
        if self.stats_mode == "main" or stats:
            mine = self.sched.get_kv_connector_stats()
            if mine is not None and not mine.is_empty():
                stats = stats.aggregate(mine) if stats is not None else mine
        if stats is not None:
            self.stats_log.append(stats.data)
        # the scheduler publishes the connector's KV events with its own
        self.events.extend(self.sched.take_events() or ())
        for rid, n in so.num_scheduled_tokens.items():
            req = self.requests[rid]
            if req.status != RequestStatus.RUNNING or req.num_computed_tokens < req.num_tokens:
                continue
            req.append_output_token_ids(self._sample(req))
            if req.num_output_tokens >= req.max_tokens:
                self.running.remove(req)
                self._finish(req, RequestStatus.FINISHED_LENGTH_CAPPED)

    def step(self) -> SchedulerOutput:
        so, pre = self.schedule()
        out = self.run_workers(so, pre)
        self.update(so, out)
        self.steps += 1
        return so

    def abort(self, rid: str) -> None:
        req = self.requests[rid]
        if req.is_finished():
            return
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._finish_abort(req)

    def _finish_abort(self, req: Request) -> None:
        loading = req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        rid = req.request_id
        req.status = RequestStatus.FINISHED_ABORTED
        self.logs[rid].finished_status = req.status
        delay, _ = self._connector_finished(
            req, [b.block_id for b in self.req_blocks.get(rid, [])])
        self.finished_ids.add(rid)
        if delay or loading:
            self.delayed.add(rid)
        else:
            self._free(rid)

    def idle(self) -> bool:
        return not self.waiting and not self.running and not self.delayed

    def run(self, max_steps: int = 400, until: Callable[[], bool] | None = None,
            timeout_s: float = 20.0) -> int:
        """Steps until ``until()`` (default: idle). Steps that compute nothing only let
        asynchronous transfers progress; they are not counted against max_steps."""
        import time

        deadline = time.monotonic() + timeout_s
        i = 0
        while time.monotonic() < deadline and i < max_steps:
            if (until or self.idle)():
                return i
            so = self.step()
            if so.total_num_scheduled_tokens == 0:
                time.sleep(0.002)
            else:
                i += 1
        if (until or self.idle)():
            return i
        raise AssertionError(f"not done after {max_steps} steps: waiting="
                             f"{[(r.request_id, r.status.name) for r in self.waiting]} "
                             f"running={[r.request_id for r in self.running]} "
                             f"delayed={self.delayed}")

    def shutdown(self) -> None:
        for w in self.workers:
            w.shutdown()
        self.sched.shutdown()
        for k in self._keep:
            if k is not None:
                k.close()

    # ---------------------------------------------------------------- checks

    def free_block_count(self) -> int:
        return len(self.pool.free)
