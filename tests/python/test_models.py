"""Model families beyond one dense attention group, against the in-memory FakeServer
(always) and a real pegaflow-server with sim GPUs ([real]: skips while PF_BIN is unset):

  * hybrid (attention group + Mamba-style recurrent-state group): per-group registration,
    saves (every full attention block; the state block at a step's block boundary),
    membership queries and the resume point, per-group loads byte for byte, membership
    gaps, a null/non-null destination without a stored state, the want-set form;
  * MLA page-first on TP=4: striped saves store every block once, every rank loads it;
    the layer-split variant;
  * TP across hosts: two servers each holding half of a TP group, per-shard leases,
    mismatched shard hit counts (common-prefix re-query), a shard down (miss).

Every loaded block is compared with the bytes the saving worker held (seeded data; the
seed is printed). Checks of the fake server's internals (calls, per-key copies, leases)
run on [fake]; [real] checks what the server exposes (hits, save bytes in /metrics, lease
releases).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import fakes
from fakes import FakeEngineClient, FakeServer, HostDeviceAdapter, HostTensor
from pegaflow.connector.config import FULL, STATE, CacheGroup, ConnectorContext
from pegaflow.connector.plan import plan_of
from pegaflow.connector.scheduler import SchedulerConnector
from pegaflow.connector.worker import WorkerConnector
from conftest import require_engine_server

BS = 16
N = 24  # blocks per cache
SEED = 20261201


class ViewTensor(HostTensor):
    """A strided view over a raw byte buffer (vLLM's hybrid layout: attention and state
    layers of one page buffer)."""

    def __init__(self, base: np.ndarray, shape, stride, dtype, offset=0, device=0):
        self._base = base
        self.shape = tuple(shape)
        self._st = tuple(stride)
        self.dtype = np.dtype(dtype)
        self._off = offset
        self.dev = device
        self.id = next(fakes._ids)
        fakes._registry[self.id] = self

    def stride(self):
        return self._st

    def element_size(self):
        return self.dtype.itemsize

    def storage_offset(self):
        return self._off

    def storage_nbytes(self):
        return self._base.nbytes

    def raw(self):
        return self._base


class FakeB:
    """In-memory servers, numpy "GPU" memory."""

    name = "fake"

    def __init__(self, n=1):
        self.servers = [FakeServer() for _ in range(n)]

    def client(self, i=0):
        return FakeEngineClient(self.servers[i])

    def adapter(self, dev):
        return HostDeviceAdapter(dev)

    def dense(self, shape, dtype, dev=0):
        return HostTensor(np.zeros(shape, dtype), dev)

    def raw(self, nbytes, dev=0):
        base = np.zeros(nbytes, np.uint8)
        return base, lambda shape, stride, dtype, offset=0: ViewTensor(
            base, shape, stride, dtype, offset, dev)

    def hits(self, i, iid, hs, group=0):
        q = self.servers[i].query(iid, "probe-hits", list(hs), False, group)
        if q.lease:
            self.servers[i].release(q.lease)
        return q.num_hit_blocks

    def close(self):
        pass


class RealB:
    """pegaflow-server processes (--gpu-backend sim), KV caches in sim-GPU memory."""

    name = "real"

    def __init__(self, factory, lib, n=1, extra_args=(), per_server=None):
        from pegaflow.client.engine import EngineClient

        self.lib = lib
        self.procs = []
        for i in range(n):
            kw = per_server(i) if per_server else {}
            self.procs.append(factory(f"server{i}", extra_args=tuple(extra_args)
                                      + tuple(kw.get("extra_args", ())),
                                      host=kw.get("host", "127.0.0.1")))
        self._clients = []
        self._keep = []
        self.probe = [EngineClient(p.target, lib=lib, timeout_ms=5000) for p in self.procs]
        require_engine_server(self.probe[0])

    def client(self, i=0):
        from pegaflow.client.engine import EngineClient

        c = EngineClient(self.procs[i].target, lib=self.lib, timeout_ms=10_000,
                         query_timeout_ms=2_000)
        self._clients.append(c)
        return c

    def adapter(self, dev):
        from pegaflow.device.sim import SimDeviceAdapter

        return SimDeviceAdapter(dev)

    def dense(self, shape, dtype, dev=0):
        from pegaflow.device.sim import allocate_kv_caches

        kv, ts = allocate_kv_caches(["t"], shape, dtype, sim_device=dev, lib=self.lib)
        self._keep.append(kv)
        return ts["t"]

    def raw(self, nbytes, dev=0):
        from pegaflow.device.sim import SimKV

        kv = SimKV(nbytes, dev, self.lib)
        self._keep.append(kv)
        base = np.frombuffer(kv.buffer(0, nbytes), np.uint8)
        return base, lambda shape, stride, dtype, offset=0: SimView(
            kv, nbytes, shape, stride, dtype, offset)

    def hits(self, i, iid, hs, group=0):
        q = self.probe[i].query(iid, "probe-hits", list(hs), group_id=group)
        if q.lease:
            self.probe[i].release(q.lease)
        return q.num_hit_blocks

    def http(self, i, path, method="GET"):
        import re
        import urllib.request

        m = re.findall(rb"HTTP listening on \S+ \(port (\d+)\)",
                       open(self.procs[i].log_path, "rb").read())
        req = urllib.request.Request(f"http://127.0.0.1:{int(m[-1])}{path}", method=method,
                                     data=b"" if method == "POST" else None)
        return urllib.request.urlopen(req, timeout=5).read().decode()

    def metric(self, i, name):
        body = self.http(i, "/metrics")
        for line in body.splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise AssertionError(f"{name} not in /metrics")

    def close(self):
        for c in self._clients + self.probe:
            c.close()
        for k in self._keep:
            k.close()


def _sim_view_class():
    from pegaflow.device.sim import SimTensor, _Storage

    class _SimView(SimTensor):
        """A strided view at element offset ``offset`` of a whole SimKV."""

        def __init__(self, kv, nbytes, shape, stride, dtype, offset=0):
            self.kv = kv
            self.offset = 0
            self.dtype = np.dtype(dtype)
            self.shape = tuple(shape)
            self._st = tuple(stride)
            self._eoff = offset
            self.nbytes = nbytes
            self._raw = kv.buffer(0, nbytes)
            flat = np.frombuffer(self._raw, np.uint8)[offset * self.dtype.itemsize:]
            flat = flat[:len(flat) // self.dtype.itemsize * self.dtype.itemsize]
            self._array = np.lib.stride_tricks.as_strided(
                flat.view(self.dtype), self.shape, [x * self.dtype.itemsize for x in stride])
            self._Storage = _Storage

        def stride(self):
            return self._st

        def storage_offset(self):
            return self._eoff

        def untyped_storage(self):
            return self._Storage(self.nbytes)

    return _SimView


def SimView(*a, **k):
    return _sim_view_class()(*a, **k)


@pytest.fixture(params=["fake", "real"])
def backend(request):
    """backend(n): n servers of the parametrised kind."""
    made = []

    def make(n=1):
        if request.param == "fake":
            b = FakeB(n)
        else:
            b = RealB(request.getfixturevalue("server_factory"),
                      request.getfixturevalue("engine_lib"), n)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


class Blk:
    def __init__(self, bid, h=None):
        self.block_id = bid
        self.block_hash = h


class Blocks:
    def __init__(self, *tables):
        self.blocks = tuple([Blk(b) for b in t] for t in tables)

    def get_block_ids(self):
        return tuple([b.block_id for b in g] for g in self.blocks)


class Req:
    def __init__(self, rid, hashes, num_tokens):
        self.request_id = rid
        self.block_hashes = list(hashes)
        self.num_tokens = num_tokens
        self.all_token_ids = list(range(num_tokens))
        self.lora_request = None


class NewReq:
    def __init__(self, rid, block_ids, num_computed):
        self.req_id = rid
        self.block_ids = block_ids
        self.num_computed_tokens = num_computed


class Cached:
    def __init__(self, rids=(), new_ids=(), computed=()):
        self.req_ids = list(rids)
        self.new_block_ids = list(new_ids)
        self.num_computed_tokens = list(computed)
        self.resumed_req_ids = set()


class SO:
    def __init__(self, new=(), cached=None, sched=None):
        self.scheduled_new_reqs = list(new)
        self.scheduled_cached_reqs = cached or Cached()
        self.num_scheduled_tokens = dict(sched or {})
        self.preempted_req_ids = None


def hashes(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode().ljust(32, b"\0") for i in range(n)]


def rng():
    print(f"seed {SEED}")
    return np.random.default_rng(SEED)


# ------------------------------------------------------------------ hybrid

ATT, MAM = "model.layers.0.attn", "model.layers.1.mamba"
H, D = 2, 8
PAGE = 2 * BS * H * D * 2  # attention page (uint16) = the state page
GROUPS = (CacheGroup(0, 0, FULL, (ATT,), BS), CacheGroup(1, 1, STATE, (MAM,), BS))


def hybrid_caches(B, dev=0):
    """One page buffer per layer, as vLLM lays out hybrid caches: the attention view
    (2, N, BS, H, D) with K and V adjacent inside a page, the state views (conv, ssm) at
    offsets 0 and 256 bytes of each page."""
    att_base, att_view = B.raw(N * PAGE, dev)
    mam_base, mam_view = B.raw(N * PAGE, dev)
    half = BS * H * D  # elements
    att = att_view((2, N, BS, H, D), (half, 2 * half, H * D, D, 1), np.uint16)
    conv = mam_view((N, 4, 32), (PAGE // 2, 32, 1), np.uint16)
    ssm = mam_view((N, 8, 8), (PAGE // 2, 8, 1), np.uint16, 128)
    return {ATT: att, MAM: [conv, ssm]}, att_base, mam_base


def page(base, b):
    return base[b * PAGE:(b + 1) * PAGE]


class Hybrid:
    def __init__(self, B, iid, groups=GROUPS, **kw):
        self.B = B
        ctx = ConnectorContext(iid, "ns-hybrid", BS, groups=groups, cross_layer_blocks=False,
                               **kw)
        self.s = SchedulerConnector(ctx, B.client(), session=False)
        self.w = WorkerConnector(ctx, B.client(), B.adapter(0), save_thread=False)
        kv, self.att, self.mam = hybrid_caches(B)
        self.w.register_kv_caches(kv)

    def save_steps(self, rid, hs, ntok, att_ids, mam_ids, steps, r):
        """Prefill in ``steps`` (token counts), writing seeded data into the blocks each
        step fills (the state block when the step ends on a block boundary)."""
        req = Req(rid, hs, ntok)
        assert poll_matched(self.s, req)[0] == (0, False)  # (P2P nodes may say Loading)
        self.s.update_state_after_alloc(req, Blocks(att_ids, mam_ids), 0)
        done = 0
        for i, n in enumerate(steps):
            for b in att_ids[done // BS:(done + n + BS - 1) // BS]:
                page(self.att, b)[:] = r.integers(0, 256, PAGE, dtype=np.uint8)
            end = done + n
            if self.s.ctx.groups[1].kind == FULL:
                for b in mam_ids[done // BS:end // BS]:
                    if b:
                        page(self.mam, b)[:] = r.integers(0, 256, PAGE, dtype=np.uint8)
            elif end % BS == 0 and mam_ids[end // BS - 1]:
                page(self.mam, mam_ids[end // BS - 1])[:] = r.integers(0, 256, PAGE,
                                                                       dtype=np.uint8)
            so = SO(new=[NewReq(rid, (att_ids, mam_ids), 0)] if i == 0 else [],
                    cached=Cached([rid], [None], [done]) if i else None, sched={rid: n})
            meta = self.s.build_connector_meta(so)
            self.w.wait_for_save(meta)
            done = end
        full = done // BS
        wait_hits(self.B, 0, self.s.ctx.instance_id, hs[:full], full)
        every = self.s.ctx.groups[1].kind == FULL
        states = [i for i in range(full) if i < len(mam_ids) and mam_ids[i]
                  and (every or (i + 1) * BS in _ends(steps))]
        wait_hits(self.B, 0, self.s.ctx.instance_id, hs[:full], len(states), group=1)
        return req

    def load(self, rid, hs, ntok, att_ids, mam_ids):
        req = Req(rid, hs, ntok)
        got = self.s.get_num_new_matched_tokens(req, 0)
        if got[0]:
            self.s.update_state_after_alloc(req, Blocks(att_ids, mam_ids), got[0])
        plan = self.s.build_connector_meta(SO())
        self.w.start_load_kv(plan)
        fin = wait_finished(self.w, rid) if plan.loads else (None, None)
        return got, plan, fin, self.w.get_block_ids_with_load_errors()

    def close(self):
        self.w.shutdown(unregister=False)
        self.s.shutdown()


def _ends(steps):
    out, t = set(), 0
    for n in steps:
        t += n
        out.add(t)
    return out


def wait_finished(w, rid, timeout=10.0):
    """get_finished until ``rid`` is reported receiving (the real server's load thread
    completes asynchronously)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fs, fr = w.get_finished(set())
        if fr and rid in fr:
            return fs, fr
        time.sleep(0.005)
    raise AssertionError(f"load of {rid} not reported within {timeout} s")


def q_calls(B, i=0, **match):
    return [c[1] for c in B.servers[i].calls if c[0] == "query"
            and all(c[1].get(k) == v for k, v in match.items())]


def test_hybrid_saves_both_groups_and_loads_them_byte_exact(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("p", 5)
    att_a = [1, 2, 3, 4, 5, 6]
    mam_a = [0, 0, 0, 0, 9, 10]  # align mode: older states null, the state after 80 tokens
    a.save_steps("a", hs, 85, att_a, mam_a, [80, 5], r)
    if B.name == "fake":
        saves = [c[1]["layers"] for c in B.servers[0].calls if c[0] == "save"]
        assert saves == [[(ATT, [1, 2, 3, 4, 5], hs), (MAM, [9], [hs[4]])]]
    b = Hybrid(B, "B")  # another vLLM on the same node
    att_b = [11, 12, 13, 14, 15, 16]
    mam_b = [0, 0, 0, 0, 17, 18]
    got, plan, (_, recv), errs = b.load("b", hs, 85, att_b, mam_b)
    assert got == (80, True) and recv == {"b"} and errs == set()
    lg = plan.loads["b"].leases_for(0)
    assert [(x.group, x.targets) for x in lg] == [(0, (11, 12, 13, 14, 15)), (1, (17,))]
    for sa, sb in zip(att_a[:5], att_b[:5]):
        assert bytes(page(b.att, sb)) == bytes(page(a.att, sa))
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 9))
    assert not page(b.mam, 18).any()  # the running block is not written
    if B.name == "fake":
        assert [(q["group"], q["n"]) for q in q_calls(B) if q["req_id"].startswith("b")] == \
            [(0, 5), (1, 5)]
        assert not B.servers[0].leases  # both leases consumed by the one worker
    a.close()
    b.close()


def test_hybrid_membership_gap_moves_the_resume_point_back(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("g", 5)
    # steps of 48 and 37 tokens: a state at block 2 only (85 is not a block boundary)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 7, 0, 0, 8], [48, 37], r)
    b = Hybrid(B, "B")
    got, plan, (_, recv), errs = b.load("b", hs, 85, [11, 12, 13, 0, 0, 0],
                                        [0, 0, 17, 0, 0, 0])
    assert got == (48, True) and recv == {"b"} and not errs
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 7))
    assert [bytes(page(b.att, x)) for x in (11, 12, 13)] == \
        [bytes(page(a.att, x)) for x in (1, 2, 3)]
    assert b.s.stats["releases"] == 1  # the 5-block prefix lease, after the 3-block one
    if B.name == "fake":
        assert [q["n"] for q in q_calls(B, group=0, req_id="b")] == [5, 3]
        assert not B.servers[0].leases
    a.close()
    b.close()


def test_hybrid_without_any_state_is_a_miss_and_releases_the_prefix_lease(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("m", 3)
    a.save_steps("a", hs, 55, [1, 2, 3, 4], [0, 0, 0, 0], [55], r)  # never on a boundary
    assert B.hits(0, "A", hs) == 3  # the attention blocks are there
    b = Hybrid(B, "B")
    got, plan, _, _ = b.load("b", hs, 55, [5, 6, 7, 8], [0, 0, 9, 10])
    assert got == (0, False) and not plan.loads
    assert b.s.stats["releases"] == 1 and b.s.stats["release_errors"] == 0
    a.close()
    b.close()


def test_hybrid_destination_without_a_stored_state_fails_the_commit(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("d", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    b = Hybrid(B, "B")
    # vLLM allocated a real state block at position 1 too: nothing stored there
    got, plan, (_, recv), errs = b.load("b", hs, 85, [11, 12, 13, 14, 15, 16],
                                        [0, 19, 0, 0, 17, 18])
    assert got == (80, True)
    assert plan.loads["b"].lease is None and recv == {"b"}
    assert errs == {11, 12, 13, 14, 15, 19, 17}  # every destination block, both groups
    assert b.s.stats["commit_failures"] == 1 and b.s.stats["release_errors"] == 0
    if B.name == "fake":
        assert not B.servers[0].leases
    a.close()
    b.close()


def test_hybrid_want_set_asks_for_the_resume_state_then_falls_back(backend):
    r = rng()
    B = backend()
    a = Hybrid(B, "A")
    hs = hashes("w", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 7, 0, 0, 8], [48, 37], r)
    b = Hybrid(B, "B", wait_for_full_prefix=True)
    got, plan, (_, recv), _ = b.load("b", hs, 85, [11, 12, 13, 0, 0, 0], [0, 0, 17, 0, 0, 0])
    assert got == (48, True) and recv == {"b"}
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 7))
    if B.name == "fake":
        # the want-set (the state at block 4) is short: a membership query finds block 2's
        assert [(q["req_id"], q["n"]) for q in q_calls(B, group=1)
                if q["req_id"].startswith("b")] == [("b:group-1", 1), ("b:group-1:any", 5)]
    a.close()
    b.close()


def test_a_second_full_attention_group_needs_every_block_of_the_prefix():
    from fakes import group_key

    r = rng()
    B = FakeB()
    groups = (GROUPS[0], CacheGroup(1, 1, FULL, (MAM,), BS))  # e.g. mamba_cache_mode "all"
    a = Hybrid(B, "A", groups=groups)
    hs = hashes("f2", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], [80, 5], r)
    saves = [c[1]["layers"] for c in B.servers[0].calls if c[0] == "save"]
    assert saves[0][1] == (MAM, [7, 8, 9, 10, 11], hs)
    del B.servers[0].blocks[("ns-hybrid", group_key(hs[3], 1))]  # a gap at block 3
    b = Hybrid(B, "B", groups=groups)
    got, plan, (_, recv), errs = b.load("b", hs, 85, [13, 14, 15, 0, 0, 0],
                                        [16, 17, 18, 0, 0, 0])
    assert got == (48, True) and recv == {"b"} and not errs  # the leading run: 3 blocks
    lg = plan.loads["b"].leases_for(0)
    assert [(x.group, x.targets) for x in lg] == [(0, (13, 14, 15)), (1, (16, 17, 18, None))]
    assert [bytes(page(b.mam, x)) for x in (16, 17, 18)] == \
        [bytes(page(a.mam, x)) for x in (7, 8, 9)]
    assert not B.servers[0].leases


def test_hybrid_state_group_loading_answer_is_polled():
    r = rng()
    B = FakeB()
    a = Hybrid(B, "A")
    hs = hashes("l", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    b = Hybrid(B, "B")
    B.servers[0].loading["b:group-1"] = 1
    req = Req("b", hs, 85)
    assert b.s.get_num_new_matched_tokens(req, 0) == (None, False)
    assert not B.servers[0].leases  # the prefix lease of the unfinished answer was released
    assert b.s.get_num_new_matched_tokens(req, 0) == (80, True)


# ------------------------------------------------------------------ MLA

MLA_LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
LAT = 72  # latent + rope, uint16


def mla_ctx(rank, tp, iid, split=False):
    return ConnectorContext(iid, "ns-mla", BS, tp_rank=0, tp_size=1, world_size=tp,
                            physical_tp_rank=rank, local_tp_rank=rank, local_tp_size=tp,
                            is_mla=True, collapse_mla_tp=True, page_first=True,
                            mla_layer_split=split, transfer_mode=1, cross_layer_blocks=False)


def mla_ranks(B, tp, iid, split=False):
    ws = []
    for rank in range(tp):
        w = WorkerConnector(mla_ctx(rank, tp, iid, split), B.client(), B.adapter(rank),
                            save_thread=False)
        names = MLA_LAYERS if not split else [MLA_LAYERS[rank % len(MLA_LAYERS)]]
        kv = {n: B.dense((N, BS, LAT), np.uint16, rank) for n in names}
        w.register_kv_caches(kv)
        ws.append((w, kv))
    return ws


def test_mla_tp4_page_first_stores_each_block_once_and_every_rank_loads_it(backend):
    from pegaflow.connector.plan import LoadIntent, SaveIntent, StepPlan

    r = rng()
    B = backend()
    ws = mla_ranks(B, 4, "A")
    ids = list(range(1, 9))
    hs = hashes("mla", 8)
    data = {n: r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16) for n in MLA_LAYERS}
    for w, kv in ws:  # MLA: every rank holds the same KV
        for n, t in kv.items():
            t.numpy()[...] = data[n]
    plan = StepPlan(saves={"a": SaveIntent(tuple(ids), tuple(hs))})
    for w, _ in ws:
        w.wait_for_save(plan)
    for w, _ in ws:
        assert w.wait_saves_idle(10)
    # each rank copied 1/4 of the blocks: every block once
    assert [w.stats["saved_blocks"] for w, _ in ws] == [2, 2, 2, 2]
    page_bytes = BS * LAT * 2
    if B.name == "fake":
        args = B.servers[0].calls[0][1]["args"]
        assert args.page_first and args.tp_size == 1 and args.world_size == 4
        saved = [(c[1]["device_id"], c[1]["layers"][0][1]) for c in B.servers[0].calls
                 if c[0] == "save"]
        assert saved == [(0, [4, 8]), (1, [1, 5]), (2, [2, 6]), (3, [3, 7])]
        assert all(B.servers[0].slot_writes[("ns-mla", h)] == len(MLA_LAYERS) for h in hs)
    else:
        # a collapsed-but-not-striped layout would copy 4x this (one slot per rank)
        assert B.metric(0, "pegaflow_save_bytes_total") == len(hs) * len(MLA_LAYERS) * page_bytes
    # every rank reports every hash (the scheduler counts 4 workers per block)
    assert all(sorted(x[1] for x in w.event_log.take()) == sorted(hs) for w, _ in ws)
    assert B.hits(0, "A", hs) == 8
    # B (another instance, 4 ranks) loads all 8 blocks on every rank
    wb = mla_ranks(B, 4, "B")
    c = B.client()
    q = c.query("B", "b", hs)
    assert q.num_hit_blocks == 8
    dest = tuple(range(10, 18))
    lp = StepPlan(loads={"b": LoadIntent(dest, q.lease, 8 * BS)})
    for w, kv in wb:
        w.start_load_kv(lp)
        assert wait_finished(w, "b")[1] == {"b"} and not w.get_block_ids_with_load_errors()
        for n, t in kv.items():
            assert np.array_equal(t.numpy()[list(dest)], data[n][ids])
    from pegaflow.client.errors import FailedPrecondition

    with pytest.raises(FailedPrecondition):  # its 4 shares were consumed
        c.release(q.lease)
    for w, _ in ws + wb:
        w.shutdown(unregister=False)


def test_mla_layer_split_ranks_each_save_their_layers(backend):
    from pegaflow.connector.plan import SaveIntent, StepPlan

    r = rng()
    B = backend()
    ws = mla_ranks(B, 2, "A", split=True)
    hs = hashes("split", 3)
    for w, kv in ws:
        for t in kv.values():
            t.numpy()[...] = r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16)
    plan = StepPlan(saves={"a": SaveIntent((1, 2, 3), tuple(hs))})
    ws[0][0].wait_for_save(plan)
    assert ws[0][0].wait_saves_idle(10)
    if B.name == "fake":  # (the real server seals blocks asynchronously)
        assert B.hits(0, "A", hs) == 0  # rank 1's layer is missing
    ws[1][0].wait_for_save(plan)
    assert ws[1][0].wait_saves_idle(10)
    assert [w.stats["saved_blocks"] for w, _ in ws] == [3, 3]
    if B.name == "fake":
        saved = [(c[1]["device_id"], [x[0] for x in c[1]["layers"]], c[1]["layers"][0][1])
                 for c in B.servers[0].calls if c[0] == "save"]
        assert saved == [(0, [MLA_LAYERS[0]], [1, 2, 3]), (1, [MLA_LAYERS[1]], [1, 2, 3])]
    wait_hits(B, 0, "A", hs, 3)
    for w, _ in ws:
        w.shutdown(unregister=False)


def wait_hits(B, i, iid, hs, n, timeout=10.0, group=0):
    """Until server i answers n hits (saved blocks are sealed by its insert thread
    shortly after the Save returns)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if B.hits(i, iid, hs, group) == n:
            return
        time.sleep(0.01)
    raise AssertionError(f"{n} blocks not visible on server {i} within {timeout} s")


def test_page_first_refuses_split_kv_layouts():
    srv = FakeServer()
    w = WorkerConnector(mla_ctx(0, 1, "X"), FakeEngineClient(srv), HostDeviceAdapter(0),
                        save_thread=False)
    object.__setattr__(w.ctx, "is_mla", False)  # a (2, N, ...) K/V split tensor
    with pytest.raises(ValueError, match="page-first"):
        w.register_kv_caches({"l": HostTensor(np.zeros((2, N, BS, 2, 8), np.uint16))})


# ------------------------------------------------------------------ TP shards

DL = ["model.layers.0.attn", "model.layers.1.attn"]


def shard_ctx(iid, shard, local_rank, n=2, local=2):
    return ConnectorContext(iid, f"ns:tp-shard-{shard}-of-{n}", BS, tp_rank=local_rank,
                            tp_size=local, world_size=local, physical_tp_rank=shard * local
                            + local_rank, local_tp_rank=local_rank, local_tp_size=local,
                            num_shards=n, shard_index=shard, cross_layer_blocks=False)


class Sharded:
    """One vLLM with TP=4 over two hosts: a scheduler with one client per server and
    four workers, ranks 0-1 on server 0, ranks 2-3 on server 1."""

    def __init__(self, B, iid, r):
        self.B = B
        self.s = SchedulerConnector(shard_ctx(iid, 0, 0), [B.client(0), B.client(1)],
                                    session=True, session_thread=False)
        self.ws = []
        for rank in range(4):
            sh, lr = divmod(rank, 2)
            w = WorkerConnector(shard_ctx(iid, sh, lr), B.client(sh), B.adapter(rank),
                                save_thread=False)
            kv = {n: B.dense((2, N, BS, 2, 8), np.uint16, rank) for n in DL}
            w.register_kv_caches(kv)
            self.ws.append((w, kv))
        self.r = r

    def fill(self):
        for w, kv in self.ws:
            for t in kv.values():
                t.numpy()[...] = self.r.integers(0, 65536, t.shape, dtype=np.uint16)

    def save(self, rid, hs, ids, shard1_blocks=None):
        """Saves ``ids``; shard 1's workers only the first ``shard1_blocks``."""
        req = Req(rid, hs, len(hs) * BS + 3)
        self.s.get_num_new_matched_tokens(req, 0)
        self.s.update_state_after_alloc(req, Blocks(ids + [0]), 0)
        plan = self.s.build_connector_meta(SO(new=[NewReq(rid, (ids + [0],), 0)],
                                              sched={rid: req.num_tokens}))
        from pegaflow.connector.plan import SaveIntent, StepPlan

        it = plan.saves[rid]
        cut = len(ids) if shard1_blocks is None else shard1_blocks
        short = StepPlan(saves={rid: SaveIntent(it.block_ids[:cut], it.block_hashes[:cut])})
        for rank, (w, _) in enumerate(self.ws):
            w.wait_for_save(plan if rank < 2 else short)

    def load(self, rid, hs, ids):
        req = Req(rid, hs, len(hs) * BS + 3)
        got = self.s.get_num_new_matched_tokens(req, 0)
        if got[0]:
            self.s.update_state_after_alloc(req, Blocks(ids), got[0])
        plan = self.s.build_connector_meta(SO())
        res = []
        for w, _ in self.ws:
            w.start_load_kv(plan)
            res.append(wait_finished(w, rid) if plan.loads else w.get_finished(set()))
        return got, plan, res

    def close(self):
        for w, _ in self.ws:
            w.shutdown(unregister=False)
        self.s.shutdown()


def test_two_servers_each_hold_half_a_tp_group_and_serve_one_request(backend):
    r = rng()
    B = backend(2)
    a = Sharded(B, "A", r)
    assert all(x is not None and x.alive() for x in a.s.sessions)  # one Session per server
    a.fill()
    hs = hashes("t", 4)
    a.save("a", hs, [1, 2, 3, 4])
    wait_hits(B, 0, "A", hs, 4)
    wait_hits(B, 1, "A", hs, 4)
    if B.name == "fake":
        assert B.servers[1].instances["A"].namespace == "ns:tp-shard-1-of-2"
        assert B.servers[0].instances["A"].world_size == 2
    b = Sharded(B, "B", r)
    got, plan, res = b.load("b", hs, [5, 6, 7, 8])
    assert got == (4 * BS, True) and all(x == (None, {"b"}) for x in res)
    it = plan.loads["b"]
    l0, l1 = it.leases_for(0)[0].lease, it.leases_for(1)[0].lease
    assert l0 != l1  # one lease per shard, each from its own server
    for (wa, kva), (wb, kvb) in zip(a.ws, b.ws):
        assert not wb.get_block_ids_with_load_errors()
        for n in DL:
            assert np.array_equal(kvb[n].numpy()[:, 5:9], kva[n].numpy()[:, 1:5])
    from pegaflow.client.errors import FailedPrecondition

    for i, lease in ((0, l0), (1, l1)):  # each consumed by its shard's two workers
        with pytest.raises(FailedPrecondition):
            B.probe[i].release(lease) if B.name == "real" else B.client(i).release(lease)
    a.close()
    b.close()


def test_mismatched_shard_hits_requery_the_common_prefix(backend):
    r = rng()
    B = backend(2)
    a = Sharded(B, "A", r)
    a.fill()
    hs = hashes("mm", 4)
    a.save("a", hs, [1, 2, 3, 4], shard1_blocks=3)  # shard 1 holds 3 blocks, shard 0 four
    wait_hits(B, 0, "A", hs, 4)
    wait_hits(B, 1, "A", hs, 3)
    b = Sharded(B, "B", r)
    got, plan, res = b.load("b", hs, [5, 6, 7, 8])
    assert got == (3 * BS, True) and all(x == (None, {"b"}) for x in res)
    assert b.s.stats["releases"] == 1  # shard 0's 4-block lease
    for (wa, kva), (wb, kvb) in zip(a.ws, b.ws):
        assert np.array_equal(kvb[DL[0]].numpy()[:, 5:8], kva[DL[0]].numpy()[:, 1:4])
        assert not kvb[DL[0]].numpy()[:, 8].any()
    if B.name == "fake":
        q = [(c["req_id"], c["n"]) for c in q_calls(B, 0) if c["req_id"].startswith("b")]
        assert q == [("b", 4), ("b:tp-common-3", 3)]
        assert not B.servers[0].leases and not B.servers[1].leases
    a.close()
    b.close()


def test_a_shard_that_lost_the_common_prefix_on_requery_is_a_miss():
    r = rng()
    B = FakeB(2)
    srvs = B.servers
    a = Sharded(B, "A", r)
    a.fill()
    hs = hashes("rq", 4)
    a.save("a", hs, [1, 2, 3, 4], shard1_blocks=3)
    b = Sharded(B, "B", r)
    orig = srvs[0].query

    def evicting(instance_id, req_id, hashes_, *a, **k):
        if req_id.endswith(":tp-common-3"):
            srvs[0].blocks.pop(("ns:tp-shard-0-of-2", hs[2]), None)
        return orig(instance_id, req_id, hashes_, *a, **k)

    srvs[0].query = evicting
    got, plan, _ = b.load("b", hs, [5, 6, 7, 8])
    assert got == (0, False) and not plan.loads
    assert b.s.stats["shard_mismatches"] == 1
    assert not srvs[0].leases and not srvs[1].leases


def test_a_shard_down_degrades_to_a_miss(backend):
    r = rng()
    B = backend(2)
    a = Sharded(B, "A", r)
    a.fill()
    hs = hashes("dn", 4)
    a.save("a", hs, [1, 2, 3, 4])
    wait_hits(B, 0, "A", hs, 4)
    b = Sharded(B, "B", r)
    if B.name == "fake":
        B.servers[1].down = True
    else:
        B.procs[1].kill()
    got, plan, _ = b.load("b", hs, [5, 6, 7, 8])
    assert got == (0, False) and not plan.loads
    assert b.s.stats["releases"] == 1 and b.s.stats["release_errors"] == 0  # shard 0's lease
    if B.name == "fake":
        assert not B.servers[0].leases


# ------------------------------------------------------------------ through the SSD tier


@pytest.fixture
def ssd_backend(server_factory, engine_lib, tmp_path):
    b = RealB(server_factory, engine_lib, 1,
              extra_args=("--ssd-cache-path", str(tmp_path / "ssd.dat"),
                          "--ssd-cache-capacity", "64mb"))
    yield b
    b.close()


def evict_ram_after_ssd_writes(B, timeout=15.0):
    """Waits until the SSD writer has nothing pending, then drops every block from RAM
    (the SSD copies stay), so the next query must prefetch from SSD."""
    import json
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (B.metric(0, "pegaflow_ssd_write_bytes_total") > 0
                and B.metric(0, "pegaflow_ssd_write_queue_pending") == 0
                and B.metric(0, "pegaflow_ssd_write_inflight") == 0):
            break
        time.sleep(0.02)
    else:
        raise AssertionError("SSD writes did not settle")
    out = json.loads(B.http(0, "/cache/memory/cleanup", "POST"))
    assert out["evicted_blocks"] > 0, out


def poll_matched(s, req, timeout=15.0):
    """get_num_new_matched_tokens until the server stops answering Loading."""
    import time

    deadline = time.monotonic() + timeout
    loading = 0
    while time.monotonic() < deadline:
        got = s.get_num_new_matched_tokens(req, 0)
        if got[0] is not None:
            return got, loading
        loading += 1
        time.sleep(0.01)
    raise AssertionError("still Loading")


def test_hybrid_round_trips_through_ssd(ssd_backend):
    r = rng()
    B = ssd_backend
    a = Hybrid(B, "A")
    hs = hashes("ssd-h", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    evict_ram_after_ssd_writes(B)
    # the want-set form goes through the prefetch machinery (a membership query is RAM)
    b = Hybrid(B, "B", wait_for_full_prefix=True)
    req = Req("b", hs, 85)
    got, loading = poll_matched(b.s, req)
    assert got == (80, True) and loading >= 1
    b.s.update_state_after_alloc(req, Blocks([11, 12, 13, 14, 15, 16], [0, 0, 0, 0, 17, 18]),
                                 80)
    plan = b.s.build_connector_meta(SO())
    b.w.start_load_kv(plan)
    assert wait_finished(b.w, "b")[1] == {"b"} and not b.w.get_block_ids_with_load_errors()
    for sa, sb in zip([1, 2, 3, 4, 5], [11, 12, 13, 14, 15]):
        assert bytes(page(b.att, sb)) == bytes(page(a.att, sa))
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 9))
    assert B.metric(0, "pegaflow_ssd_prefetch_success_total") >= 6
    a.close()
    b.close()


def test_mla_page_first_round_trips_through_ssd(ssd_backend):
    from pegaflow.connector.plan import SaveIntent, StepPlan

    r = rng()
    B = ssd_backend
    ws = mla_ranks(B, 2, "A")
    ids = list(range(1, 7))
    hs = hashes("ssd-mla", 6)
    data = {n: r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16) for n in MLA_LAYERS}
    for w, kv in ws:
        for n, t in kv.items():
            t.numpy()[...] = data[n]
    plan = StepPlan(saves={"a": SaveIntent(tuple(ids), tuple(hs))})
    for w, _ in ws:
        w.wait_for_save(plan)
    wait_hits(B, 0, "A", hs, 6)
    evict_ram_after_ssd_writes(B)
    wb = mla_ranks(B, 2, "B")
    sched = SchedulerConnector(ConnectorContext("B", "ns-mla", BS, tp_size=1, world_size=2,
                                                is_mla=True, collapse_mla_tp=True,
                                                page_first=True, cross_layer_blocks=False),
                               B.client(), session=False)
    req = Req("b", hs, 6 * BS + 1)
    got, loading = poll_matched(sched, req)
    assert got == (6 * BS, True) and loading >= 1
    dest = [10, 11, 12, 13, 14, 15, 16]
    sched.update_state_after_alloc(req, Blocks(dest), got[0])
    lp = sched.build_connector_meta(SO())
    for w, kv in wb:
        w.start_load_kv(lp)
        assert wait_finished(w, "b")[1] == {"b"} and not w.get_block_ids_with_load_errors()
        for n, t in kv.items():
            assert np.array_equal(t.numpy()[dest[:6]], data[n][ids])
    for w, _ in ws + wb:
        w.shutdown(unregister=False)
    sched.shutdown()


# ------------------------------------------------------------------ across nodes (P2P)


@pytest.fixture
def p2p_backend(server_factory, engine_lib, tmp_path):
    """A MetaServer and two nodes on loopback addresses 127.0.0.2 / 127.0.0.3 with the
    TCP fabric: node 1 fetches what node 0 holds over P2P."""
    import re
    import subprocess
    import time

    from conftest import pf_bin

    log = tmp_path / "meta.log"
    meta = subprocess.Popen([os.path.join(pf_bin(), "pegaflow-metaserver"), "--addr",
                             "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        port = None
        while time.monotonic() < deadline and port is None:
            m = re.findall(rb"gRPC listening on \S+ \(port (\d+)\)", log.read_bytes())
            if m:
                port = int(m[-1])
            elif meta.poll() is not None:
                raise RuntimeError("pegaflow-metaserver exited: " + log.read_text())
            else:
                time.sleep(0.02)
        assert port, "pegaflow-metaserver did not report its port"

        def node(i):
            addr = f"127.0.0.{2 + i}"
            return {"host": addr, "extra_args": ("--nics", addr, "--net-backend", "tcp",
                                                 "--metaserver-addr", f"127.0.0.1:{port}")}

        b = RealB(server_factory, engine_lib, 2, per_server=node)
        yield b
        b.close()
    finally:
        meta.kill()
        meta.wait(timeout=10)


def wait_registered(B, i, n, timeout=15.0):
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if B.metric(i, "pegaflow_metaserver_registration_blocks_total") >= n:
            return
        time.sleep(0.02)
    raise AssertionError(f"node {i} did not register {n} blocks with the MetaServer")


class _OnNode:
    """A backend view whose client() talks to node i of a multi-node backend."""

    def __init__(self, B, i):
        self.B, self.i = B, i

    def client(self, i=0):
        return self.B.client(self.i)

    def hits(self, i, iid, hs, group=0):
        return self.B.hits(self.i, iid, hs, group)

    def __getattr__(self, name):
        return getattr(self.B, name)


def test_hybrid_crosses_p2p(p2p_backend):
    r = rng()
    B = p2p_backend
    a = Hybrid(_OnNode(B, 0), "A")
    hs = hashes("p2p-h", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    wait_registered(B, 0, 6)  # 5 attention blocks + 1 state
    b = Hybrid(_OnNode(B, 1), "B", wait_for_full_prefix=True)
    req = Req("b", hs, 85)
    got, loading = poll_matched(b.s, req)
    assert got == (80, True) and loading >= 1
    b.s.update_state_after_alloc(req, Blocks([11, 12, 13, 14, 15, 16], [0, 0, 0, 0, 17, 18]),
                                 80)
    b.w.start_load_kv(b.s.build_connector_meta(SO()))
    assert wait_finished(b.w, "b")[1] == {"b"} and not b.w.get_block_ids_with_load_errors()
    for sa, sb in zip([1, 2, 3, 4, 5], [11, 12, 13, 14, 15]):
        assert bytes(page(b.att, sb)) == bytes(page(a.att, sa))
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 9))
    a.close()
    b.close()


def test_mla_page_first_crosses_p2p(p2p_backend):
    from pegaflow.connector.plan import SaveIntent, StepPlan

    r = rng()
    B = p2p_backend
    ws = mla_ranks(_OnNode(B, 0), 2, "A")
    ids = list(range(1, 7))
    hs = hashes("p2p-mla", 6)
    data = {n: r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16) for n in MLA_LAYERS}
    for w, kv in ws:
        for n, t in kv.items():
            t.numpy()[...] = data[n]
    plan = StepPlan(saves={"a": SaveIntent(tuple(ids), tuple(hs))})
    for w, _ in ws:
        w.wait_for_save(plan)
    wait_registered(B, 0, 6)
    on1 = _OnNode(B, 1)
    wb = mla_ranks(on1, 2, "B")
    sched = SchedulerConnector(ConnectorContext("B", "ns-mla", BS, tp_size=1, world_size=2,
                                                is_mla=True, collapse_mla_tp=True,
                                                page_first=True, cross_layer_blocks=False),
                               on1.client(), session=False)
    req = Req("b", hs, 6 * BS + 1)
    got, loading = poll_matched(sched, req)
    assert got == (6 * BS, True) and loading >= 1
    dest = [10, 11, 12, 13, 14, 15, 16]
    sched.update_state_after_alloc(req, Blocks(dest), got[0])
    lp = sched.build_connector_meta(SO())
    for w, kv in wb:
        w.start_load_kv(lp)
        assert wait_finished(w, "b")[1] == {"b"} and not w.get_block_ids_with_load_errors()
        for n, t in kv.items():
            assert np.array_equal(t.numpy()[dest[:6]], data[n][ids])
    for w, _ in ws + wb:
        w.shutdown(unregister=False)
    sched.shutdown()
