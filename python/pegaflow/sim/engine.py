"""One node's "vLLM": an engine-loop model around the real PegaKVConnector.

The call order is vLLM's (as tests/python/harness.py models it, after vLLM main
vllm/v1/core/sched/scheduler.py and kv_connector_model_runner_mixin.py): per step the
scheduler side gets get_num_new_matched_tokens -> update_state_after_alloc ->
build_connector_meta; each worker bind -> handle_preemptions -> start_load_kv -> forward
(writes the KV) -> wait_for_save -> get_finished -> get_block_ids_with_load_errors ->
clear; then update_connector_output and request_finished. The connector objects are
made by vLLM's KVConnectorFactory from a VllmConfig naming PegaKVConnector, and talk to
pegaflow-server through libpegaflow exactly as in vLLM; only the "GPU" is a sim KV cache
(POSIX shared memory the server's sim GPU maps).

Simplifications against vLLM (documented in docs/simulation.md): no GPU-side prefix cache
(every full prompt block is asked of PegaFlow), no preemption (a request is admitted only
when the blocks for its whole length are free), greedy "sampling" from the prefix.

The "model" is deterministic: the KV written for position p is a function of the seed and
the token prefix up to p, so identical prefixes give identical KV on every node, and a
loaded block is checked byte for byte against what the model would have computed.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DTYPE = np.uint16
_C0 = np.uint64(0x9E3779B97F4A7C15)
_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True)
class ModelSpec:
    """KV shapes. ``mla``: one segment per layer and block, (blocks, block_size, dim)."""

    name: str
    layers: int
    heads: int
    head_dim: int
    block_size: int
    mla: bool = False

    @property
    def token_values(self) -> int:
        """uint16 values one token occupies in one layer."""
        return self.head_dim if self.mla else 2 * self.heads * self.head_dim

    @property
    def block_bytes(self) -> int:
        return self.layers * self.block_size * self.token_values * np.dtype(DTYPE).itemsize


MODELS = {
    # a toy: 2 KiB per block
    "tiny": ModelSpec("tiny", layers=2, heads=2, head_dim=8, block_size=16),
    # Llama-3-8B's per-layer shape (8 KV heads of 128, GQA) with 4 of its 32 layers: 256 KiB
    "llama-8b-like": ModelSpec("llama-8b-like", layers=4, heads=8, head_dim=128, block_size=16),
    # DeepSeek-style MLA: one latent of 576 (512 + 64 rope) per token and layer: 72 KiB
    "mla-like": ModelSpec("mla-like", layers=4, heads=1, head_dim=576, block_size=16, mla=True),
}


def kv_values(prefix_hashes: np.ndarray, layers: int, count: int) -> np.ndarray:
    """The KV of tokens whose prefix hashes are given: (n, layers, count) uint16 (a
    splitmix64 of hash, layer and index)."""
    h = prefix_hashes.astype(np.uint64)[:, None, None]
    idx = (np.arange(layers, dtype=np.uint64)[:, None] * np.uint64(count)
           + np.arange(count, dtype=np.uint64)[None, :])
    x = h ^ (idx[None] * _C0)
    x ^= x >> np.uint64(30)
    x *= _C1
    x ^= x >> np.uint64(27)
    x *= _C2
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(48)).astype(DTYPE)


@dataclass
class ReqState:
    rid: str
    req: Any
    arrived: float
    blocks: list = field(default_factory=list)  # KVCacheBlocks handed out so far
    reserved: int = 0  # blocks held for the whole request (no preemption)
    queried: bool = False
    requested_blocks: int = 0  # hashes asked of PegaFlow by the first probe
    unreachable: bool = False  # the probe's QueryPrefetch failed (server down)
    prefetched: bool = False  # answered Loading first (SSD or peer fetch)
    ext_tokens: int = 0  # tokens committed to load
    loaded_blocks: int = 0  # blocks loaded and kept (after failures)
    load_failed: bool = False
    bad_blocks: int = 0
    bad_bytes: int = 0
    first_query: float = 0.0
    ready_at: float = 0.0  # the first answer that was not Loading
    load_done: float = 0.0
    first_query_wall: float = 0.0  # time.time() of the first query (for the cluster view)
    ready_wall: float = 0.0
    load_done_wall: float = 0.0
    done: bool = False


class BlockPool:
    def __init__(self, num_blocks: int):
        from vllm.v1.core.kv_cache_utils import KVCacheBlock

        self.free: deque = deque(KVCacheBlock(i) for i in range(1, num_blocks))
        self.reserved = 0

    def reserve(self, n: int) -> bool:
        if self.reserved + n > len(self.free):
            return False
        self.reserved += n
        return True

    def take(self, st: ReqState, n: int) -> list:
        assert n <= st.reserved
        st.reserved -= n
        self.reserved -= n
        got = [self.free.popleft() for _ in range(n)]
        st.blocks.extend(got)
        return got

    def release(self, st: ReqState) -> None:
        for b in st.blocks:
            b.reset_hash()
            self.free.append(b)
        st.blocks = []
        self.reserved -= st.reserved
        st.reserved = 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Engine:
    """One vLLM instance: a scheduler-side PegaKVConnector and ``tp`` workers, their KV
    caches in sim GPU memory. Not thread-safe: one thread steps it."""

    def __init__(self, model: ModelSpec, *, host: str, port: int, instance_id: str,
                 seed: int, num_blocks: int = 512, token_budget: int = 512, tp: int = 1,
                 sim_device: int = 0, rpc_timeout_ms: int = 5000,
                 query_timeout_ms: int = 2000, lib=None):
        from vllm.config import (CacheConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                                 SchedulerConfig, VllmConfig)
        from vllm.distributed import parallel_state
        from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, KVCacheTensor,
                                                MLAAttentionSpec)

        from pegaflow.device.sim import allocate_kv_caches

        self.m = model
        self.tp = tp
        self.instance_id = instance_id
        self.seed = seed & 0xFFFFFFFFFFFFFFFF
        self.budget = token_budget
        self.num_blocks = num_blocks
        bs = model.block_size
        kv_cache_utils.init_none_hash(sha256)
        self.hasher = kv_cache_utils.get_request_block_hasher(bs, sha256)
        hf = None
        if model.mla:
            hf = type("HFTextConfig", (), {"kv_lora_rank": model.head_dim - 64,
                                           "qk_rope_head_dim": 64})()
        extra = {"pegaflow.host": f"http://{host}", "pegaflow.port": port,
                 "pegaflow.rpc_timeout_ms": rpc_timeout_ms,
                 "pegaflow.query_timeout_ms": query_timeout_ms}
        if model.mla:
            # the kernel backend (the MLA default) needs CUDA; sim GPUs copy directly
            extra["pegaflow.transfer_backend"] = "direct"
        self.vllm_config = VllmConfig(
            model_config=ModelConfig(model=f"pegaflow-sim/{model.name}", dtype="torch.float16",
                                     hf_text_config=hf,
                                     num_kv_heads=1 if model.mla else model.heads * tp,
                                     head_size=model.head_dim,
                                     num_hidden_layers=model.layers),
            cache_config=CacheConfig(block_size=bs),
            parallel_config=ParallelConfig(tensor_parallel_size=tp),
            scheduler_config=SchedulerConfig(disable_hybrid_kv_cache_manager=True),
            kv_transfer_config=KVTransferConfig(
                kv_connector="PegaKVConnector", kv_role="kv_both",
                kv_connector_module_path="pegaflow.connector", engine_id=instance_id,
                kv_connector_extra_config=extra, kv_load_failure_policy="recompute"))
        if model.mla:
            spec = MLAAttentionSpec(block_size=bs, num_kv_heads=1, head_size=model.head_dim,
                                    dtype=DTYPE)
        else:
            spec = FullAttentionSpec(block_size=bs, num_kv_heads=model.heads,
                                     head_size=model.head_dim, dtype=DTYPE)
        self.layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(model.layers)]
        page = bs * model.token_values * np.dtype(DTYPE).itemsize
        kcfg = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[KVCacheTensor(num_blocks * page, [n]) for n in self.layer_names],
            kv_cache_groups=[KVCacheGroupSpec(list(self.layer_names), spec)])

        parallel_state.set_ranks(0, 0, 0)
        self.sched = KVConnectorFactory.create_connector(self.vllm_config,
                                                         KVConnectorRole.SCHEDULER, kcfg)
        self.workers, self.kv, self._keep = [], [], []
        self.cross = False
        h, d, L = model.heads, model.head_dim, model.layers
        for r in range(tp):
            parallel_state.set_ranks(r, 0, 0)
            w = KVConnectorFactory.create_connector(self.vllm_config, KVConnectorRole.WORKER,
                                                    kcfg)
            if w.prefer_cross_layer_blocks and not model.mla:
                self.cross = True
                keep, t = allocate_kv_caches(["ALL_LAYERS"], (num_blocks, L, 2, bs, h, d),
                                             DTYPE, sim_device=sim_device + r, lib=lib)
                w.register_cross_layers_kv_cache(t["ALL_LAYERS"], None)
            else:
                shape = (num_blocks, bs, d) if model.mla else (2, num_blocks, bs, h, d)
                keep, t = allocate_kv_caches(self.layer_names, shape, DTYPE,
                                             sim_device=sim_device + r, lib=lib)
                w.register_kv_caches(t)
            self._keep.append(keep)
            self.kv.append({n: x.numpy() for n, x in t.items()})
            self.workers.append(w)
        parallel_state.set_ranks(0, 0, 0)

        self.pool = BlockPool(num_blocks)
        self.states: dict[str, ReqState] = {}
        self.waiting: deque[ReqState] = deque()
        self.loading: list[ReqState] = []
        self.running: list[ReqState] = []
        self.recv_done: set[str] = set()
        self.delayed: set[str] = set()
        self.finished_ids: set[str] = set()
        self.completed: list[ReqState] = []
        self._ctx_hash: dict[str, list[int]] = {}
        self._first_query: dict[str, tuple[int, str]] = {}
        self.asked: dict[str, list[bytes]] = {}  # request -> hashes of its first query
        self.saved: list[tuple[float, list[bytes]]] = []  # (time.time(), hashes) per Save
        self._saved_lock = threading.Lock()
        self._seen: set[str] = set()
        self._agg: dict[str, dict[str, int]] = {"s": {}, "r": {}}  # reports per id so far
        self._observe_queries()
        self._observe_saves()
        self.steps = 0

    # ---------------------------------------------------------------- model

    def _prefix_hashes(self, rid: str, toks: list[int], upto: int) -> list[int]:
        hs = self._ctx_hash.setdefault(rid, [])
        while len(hs) < upto:
            prev = hs[-1] if hs else self.seed
            d = hashlib.blake2b(prev.to_bytes(8, "little")
                                + int(toks[len(hs)]).to_bytes(8, "little"), digest_size=8)
            hs.append(int.from_bytes(d.digest(), "little"))
        return hs

    def _values(self, hashes: list[int], worker: int) -> np.ndarray:
        """(n, layers, token_values) for worker ``worker`` (TP shards differ)."""
        arr = np.array(hashes, dtype=np.uint64) ^ np.uint64(worker * 0x100000001B3)
        return kv_values(arr, self.m.layers, self.m.token_values)

    def _write(self, w: int, bidx: np.ndarray, sidx: np.ndarray, vals: np.ndarray) -> None:
        m, n = self.m, len(bidx)
        if self.cross:
            a = self.kv[w]["ALL_LAYERS"]
            a[bidx, :, :, sidx] = vals.reshape(n, m.layers, 2, m.heads, m.head_dim)
            return
        for l, name in enumerate(self.layer_names):
            a = self.kv[w][name]
            if m.mla:
                a[bidx, sidx] = vals[:, l]
            else:
                a[:, bidx, sidx] = vals[:, l].reshape(n, 2, m.heads, m.head_dim).transpose(
                    1, 0, 2, 3)

    def _block_view(self, w: int, block: int) -> np.ndarray:
        """Block ``block`` of worker w as (block_size, layers, token_values)."""
        m = self.m
        if self.cross:
            a = self.kv[w]["ALL_LAYERS"][block]  # (L, 2, bs, h, d)
            return a.transpose(2, 0, 1, 3, 4).reshape(m.block_size, m.layers, -1)
        parts = []
        for name in self.layer_names:
            a = self.kv[w][name]
            if m.mla:
                parts.append(a[block])  # (bs, d)
            else:
                parts.append(a[:, block].transpose(1, 0, 2, 3).reshape(m.block_size, -1))
        return np.stack(parts, axis=1)

    def verify_block(self, st: ReqState, i: int) -> int:
        """Bytes of block i of st's request (every worker) that differ from the model."""
        bs = self.m.block_size
        toks = st.req.all_token_ids
        hs = self._prefix_hashes(st.rid, toks, (i + 1) * bs)[i * bs:(i + 1) * bs]
        bad = 0
        for w in range(self.tp):
            want = self._values(hs, w)
            got = self._block_view(w, st.blocks[i].block_id)
            bad += int(np.count_nonzero(got.view(np.uint8) != want.view(np.uint8)))
        return bad

    # ---------------------------------------------------------------- API

    def add(self, rid: str, prompt: list[int], max_tokens: int) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        need = cdiv(len(prompt) + max_tokens, self.m.block_size)
        if need > self.num_blocks - 1:
            raise ValueError(f"request {rid}: {len(prompt)} + {max_tokens} tokens need {need} "
                             f"blocks, more than the {self.num_blocks - 1} of this engine")
        req = Request(rid, list(prompt), SamplingParams(max_tokens=max_tokens), None,
                      block_hasher=self.hasher)
        st = ReqState(rid, req, time.monotonic())
        self.states[rid] = st
        self.waiting.append(st)

    def busy(self) -> bool:
        return bool(self.waiting or self.loading or self.running or self.delayed)

    def take_completed(self) -> list[ReqState]:
        out, self.completed = self.completed, []
        return out

    def _observe_queries(self) -> None:
        """Wraps the scheduler connector's client to see, per request, how many block
        hashes its first QueryPrefetch asked for and whether the server answered: "ok",
        "unreachable" (EngineClient turned UNAVAILABLE/DEADLINE into a miss) or an error
        (e.g. FAILED_PRECONDITION from a restarted server that does not know the instance
        yet). Those the server never counted in its tier metric."""
        client = self.sched._scheduler.client
        orig = client.query

        def query(instance_id, req_id, hashes, **kw):
            first = req_id not in self._first_query and req_id not in self._seen
            self._seen.add(req_id)
            try:
                res = orig(instance_id, req_id, hashes, **kw)
            except Exception:
                if first:
                    self._first_query[req_id] = (len(hashes), "error")
                raise
            if first:
                self._first_query[req_id] = (
                    len(hashes), "unreachable" if getattr(res, "unreachable", False) else "ok")
                self.asked[req_id] = [bytes(h) for h in hashes]
            return res

        client.query = query

    def _observe_saves(self) -> None:
        """Wraps each worker's client.save: the hashes of every Save the server accepted,
        with the time it answered (the blocks are in the node's RAM from then on)."""
        for w in self.workers:
            wc = getattr(w, "_worker", None)
            if wc is None:
                continue
            client = wc.client
            orig = client.save

            def save(instance_id, tp_rank, pp_rank, device_id, layers, _orig=orig, **kw):
                _orig(instance_id, tp_rank, pp_rank, device_id, layers, **kw)
                hs = list(layers[0].block_hashes) if layers else []
                with self._saved_lock:
                    self.saved.append((time.time(), [bytes(h) for h in hs]))

            client.save = save

    def take_saved(self) -> list[tuple[float, list[bytes]]]:
        with self._saved_lock:
            out, self.saved = self.saved, []
        return out

    def _alloc(self, st: ReqState, ntokens: int) -> list[int]:
        need = cdiv(ntokens, self.m.block_size) - len(st.blocks)
        got = self.pool.take(st, need) if need > 0 else []
        return [b.block_id for b in got]

    def schedule(self):
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks
        from vllm.v1.core.sched.output import (CachedRequestData, NewRequestData,
                                               SchedulerOutput)
        from vllm.v1.request import RequestStatus

        budget = self.budget
        new_reqs, cached = [], CachedRequestData.make_empty()
        nsched: dict[str, int] = {}
        pre: dict[str, int] = {}

        # loads that finished: the request becomes schedulable (vLLM's
        # _update_waiting_for_remote_kv, the last token always computed)
        for st in list(self.loading):
            if st.rid not in self.recv_done:
                continue
            self.recv_done.discard(st.rid)
            self.loading.remove(st)
            req = st.req
            n = min(len(st.blocks) * self.m.block_size, req.num_tokens) \
                if not st.load_failed else req.num_computed_tokens
            if n == req.num_tokens:
                n -= 1
            req.num_computed_tokens = n
            nb = n // self.m.block_size
            st.loaded_blocks = nb
            st.load_done = time.monotonic()
            st.load_done_wall = time.time()
            for i in range(nb):
                bad = self.verify_block(st, i)
                if bad:
                    st.bad_blocks += 1
                    st.bad_bytes += bad
            req.status = RequestStatus.WAITING
            self.waiting.appendleft(st)

        for st in self.running:
            req = st.req
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if n <= 0:
                continue
            new_ids = self._alloc(st, req.num_computed_tokens + n)
            cached.req_ids.append(st.rid)
            cached.new_block_ids.append((new_ids,) if new_ids else None)
            cached.new_token_ids.append([])
            cached.num_computed_tokens.append(req.num_computed_tokens)
            cached.num_output_tokens.append(req.num_output_tokens)
            nsched[st.rid] = n
            pre[st.rid] = req.num_computed_tokens
            budget -= n

        skipped: deque[ReqState] = deque()
        while self.waiting and budget > 0:
            st = self.waiting.popleft()
            req = st.req
            total = cdiv(req.num_prompt_tokens + req.max_tokens, self.m.block_size)
            if not st.reserved and not st.blocks and not self.pool.reserve(total):
                skipped.append(st)
                break  # FCFS: nothing behind it either
            if not st.reserved and not st.blocks:
                st.reserved = total
            if not st.queried or (req.num_computed_tokens == 0 and not st.ext_tokens):
                if not st.queried:
                    st.first_query = time.monotonic()
                    st.first_query_wall = time.time()
                ext, is_async = self.sched.get_num_new_matched_tokens(req, 0)
                if not st.queried:
                    st.queried = True
                    n, outcome = self._first_query.pop(st.rid, (0, "none"))
                    st.requested_blocks = n
                    st.unreachable = outcome != "ok"
                if ext is None:
                    st.prefetched = True
                    skipped.append(st)
                    continue
                if not st.ready_at:
                    st.ready_at = time.monotonic()
                    st.ready_wall = time.time()
                if is_async and ext > 0:
                    self._alloc(st, ext)
                    self.sched.update_state_after_alloc(req, KVCacheBlocks((list(st.blocks),)),
                                                        ext)
                    st.ext_tokens = ext
                    req.num_computed_tokens = ext
                    req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                    self.loading.append(st)
                    continue
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            self._alloc(st, req.num_computed_tokens + n)
            self.sched.update_state_after_alloc(req, KVCacheBlocks((list(st.blocks),)), 0)
            req.status = RequestStatus.RUNNING
            self.running.append(st)
            new_reqs.append(NewRequestData.from_request(req, ([b.block_id for b in st.blocks],)))
            nsched[st.rid] = n
            pre[st.rid] = req.num_computed_tokens
            budget -= n
        self.waiting = skipped + self.waiting

        so = SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens=nsched, total_num_scheduled_tokens=sum(nsched.values()),
            scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
            num_common_prefix_blocks=[0], finished_req_ids=self.finished_ids,
            free_encoder_mm_hashes=[], preempted_req_ids=None)
        self.finished_ids = set()
        so.kv_connector_metadata = self.sched.build_connector_meta(so)
        for rid, n in nsched.items():
            self.states[rid].req.num_computed_tokens += n
        return so, pre

    def _forward(self, w: int, so, pre: dict[str, int]) -> None:
        bs = self.m.block_size
        for rid, n in so.num_scheduled_tokens.items():
            st = self.states[rid]
            start = pre[rid]
            hs = self._prefix_hashes(rid, st.req.all_token_ids, start + n)[start:start + n]
            pos = np.arange(start, start + n)
            ids = np.array([b.block_id for b in st.blocks], dtype=np.int64)
            self._write(w, ids[pos // bs], pos % bs, self._values(hs, w))

    def step(self) -> int:
        """One engine step; returns the tokens it computed."""
        import pickle

        from vllm.forward_context import ForwardContext
        from vllm.v1.outputs import KVConnectorOutput
        from vllm.v1.request import RequestStatus

        so, pre = self.schedule()
        wire = pickle.dumps(so.kv_connector_metadata)  # vLLM ships it to the workers
        forward = so.total_num_scheduled_tokens > 0
        fs_all, fr_all, invalid = [], [], set()
        for i, w in enumerate(self.workers):
            meta = pickle.loads(wire)
            w.bind_connector_metadata(meta)
            w.handle_preemptions(meta)
            w.start_load_kv(ForwardContext())
            if forward:
                self._forward(i, so, pre)
                w.wait_for_save()
            fs, fr = w.get_finished(set(so.finished_req_ids))
            invalid |= set(w.get_block_ids_with_load_errors() or ())
            w.get_kv_connector_stats()
            w.get_kv_connector_kv_cache_events()
            w.clear_connector_metadata()
            fs_all.append(set(fs or ()))
            fr_all.append(set(fr or ()))
        # KVOutputAggregator: an id is done once every worker reported it
        done = {"s": set(), "r": set()}
        for kind, lists in (("s", fs_all), ("r", fr_all)):
            for ids in lists:
                for rid in ids:
                    c = self._agg[kind][rid] = self._agg[kind].get(rid, 0) + 1
                    if c == self.tp:
                        done[kind].add(rid)
                        del self._agg[kind][rid]
        if invalid:
            for st in self.loading:
                ids = [b.block_id for b in st.blocks]
                ncomp = cdiv(st.req.num_computed_tokens, self.m.block_size)
                bad = [i for i, b in enumerate(ids[:ncomp]) if b in invalid]
                if bad:
                    st.load_failed = True
                    st.req.num_computed_tokens = bad[0] * self.m.block_size
        for rid in done["r"]:
            if rid in self.delayed and self.states[rid].done:
                self._free(rid)
            else:
                self.recv_done.add(rid)
        for rid in done["s"]:
            if rid in self.delayed:
                self._free(rid)
        out = KVConnectorOutput(finished_sending=done["s"] or None,
                                finished_recving=done["r"] or None, invalid_block_ids=invalid)
        self.sched.update_connector_output(out)
        self.sched.take_events()
        for rid, n in so.num_scheduled_tokens.items():
            st = self.states[rid]
            req = st.req
            if req.num_computed_tokens < req.num_tokens:
                continue
            hs = self._prefix_hashes(rid, req.all_token_ids, req.num_tokens)
            req.append_output_token_ids(100 + hs[-1] % 30000)
            if req.num_output_tokens >= req.max_tokens:
                self.running.remove(st)
                req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                self._finish(st)
        self.steps += 1
        return so.total_num_scheduled_tokens

    def _finish(self, st: ReqState) -> None:
        st.done = True
        delay, _ = self.sched.request_finished(st.req, [b.block_id for b in st.blocks])
        self.finished_ids.add(st.rid)
        self.completed.append(st)
        if delay:
            self.delayed.add(st.rid)
        else:
            self._free(st.rid)

    def _free(self, rid: str) -> None:
        self.delayed.discard(rid)
        st = self.states.pop(rid)
        self.pool.release(st)
        self._ctx_hash.pop(rid, None)
        self._seen.discard(rid)

    def shutdown(self) -> None:
        for w in self.workers:
            w.shutdown()
        self.sched.shutdown()
        for k in self._keep:
            if k is not None:
                k.close()
