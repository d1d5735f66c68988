"""Model families beyond one dense attention group, against the in-memory FakeServer:

  * hybrid (attention group + Mamba-style recurrent-state group): per-group registration,
    saves (every full attention block; the state block at a step's block boundary),
    membership queries and the resume point, per-group loads byte for byte, membership
    gaps, a null/non-null destination without a stored state, the want-set form;
  * MLA page-first on TP=4: striped saves store every block once, every rank loads it;
    the layer-split variant;
  * TP across hosts: two servers each holding half of a TP group, per-shard leases,
    mismatched shard hit counts (common-prefix re-query), a shard down (miss).

Every loaded block is compared with the bytes the saving worker held (seeded data; the
seed is printed).
"""

from __future__ import annotations

import numpy as np
import pytest

import fakes
from fakes import FakeEngineClient, FakeServer, HostDeviceAdapter, HostTensor
from pegaflow.connector.config import FULL, STATE, CacheGroup, ConnectorContext
from pegaflow.connector.plan import plan_of
from pegaflow.connector.scheduler import SchedulerConnector
from pegaflow.connector.worker import WorkerConnector

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


def hybrid_caches(dev=0):
    """One page buffer per layer pair, as vLLM allocates hybrid caches: the attention
    view (2, N, BS, H, D) with K and V adjacent inside a page, the state views (conv,
    ssm) at offsets 0 and 256 bytes of each page."""
    att_base = np.zeros(N * PAGE, np.uint8)
    mam_base = np.zeros(N * PAGE, np.uint8)
    half = BS * H * D  # elements
    att = ViewTensor(att_base, (2, N, BS, H, D), (half, 2 * half, H * D, D, 1), np.uint16,
                     device=dev)
    conv = ViewTensor(mam_base, (N, 4, 32), (PAGE // 2, 32, 1), np.uint16, device=dev)
    ssm = ViewTensor(mam_base, (N, 8, 8), (PAGE // 2, 8, 1), np.uint16, offset=128,
                     device=dev)
    return {ATT: att, MAM: [conv, ssm]}, att_base, mam_base


def page(base, b):
    return base[b * PAGE:(b + 1) * PAGE]


class Hybrid:
    def __init__(self, srv, iid, **kw):
        self.srv = srv
        ctx = ConnectorContext(iid, "ns-hybrid", BS, groups=GROUPS, cross_layer_blocks=False,
                               **kw)
        self.s = SchedulerConnector(ctx, FakeEngineClient(srv), session=False)
        self.w = WorkerConnector(ctx, FakeEngineClient(srv), HostDeviceAdapter(0),
                                 save_thread=False)
        kv, self.att, self.mam = hybrid_caches()
        self.w.register_kv_caches(kv)

    def save_steps(self, rid, hs, ntok, att_ids, mam_ids, steps, r):
        """Prefill in ``steps`` (token counts); fills the blocks written with seeded data
        and returns {hash: page bytes} per group."""
        req = Req(rid, hs, ntok)
        assert self.s.get_num_new_matched_tokens(req, 0) == (0, False)
        self.s.update_state_after_alloc(req, Blocks(att_ids, mam_ids), 0)
        done = 0
        for i, n in enumerate(steps):
            for b in att_ids[done // BS:(done + n + BS - 1) // BS]:
                page(self.att, b)[:] = r.integers(0, 256, PAGE, dtype=np.uint8)
            end = done + n
            if end % BS == 0 and mam_ids[end // BS - 1]:
                page(self.mam, mam_ids[end // BS - 1])[:] = r.integers(0, 256, PAGE,
                                                                       dtype=np.uint8)
            so = SO(new=[NewReq(rid, (att_ids, mam_ids), 0)] if i == 0 else [],
                    cached=Cached([rid], [None], [done]) if i else None, sched={rid: n})
            meta = self.s.build_connector_meta(so)
            self.w.wait_for_save(meta)
            done = end
        return req

    def load(self, rid, hs, ntok, att_ids, mam_ids):
        req = Req(rid, hs, ntok)
        got = self.s.get_num_new_matched_tokens(req, 0)
        if got[0]:
            self.s.update_state_after_alloc(req, Blocks(att_ids, mam_ids), got[0])
        plan = self.s.build_connector_meta(SO())
        self.w.start_load_kv(plan)
        return got, plan, self.w.get_finished(set()), self.w.get_block_ids_with_load_errors()


def test_hybrid_saves_both_groups_and_loads_them_byte_exact():
    r = rng()
    srv = FakeServer()
    a = Hybrid(srv, "A")
    hs = hashes("p", 5)
    att_a = [1, 2, 3, 4, 5, 6]
    mam_a = [0, 0, 0, 0, 9, 10]  # align mode: older states null, the state after 80 tokens
    a.save_steps("a", hs, 85, att_a, mam_a, [80, 5], r)
    saves = [c[1]["layers"] for c in srv.calls if c[0] == "save"]
    assert saves == [[(ATT, [1, 2, 3, 4, 5], hs), (MAM, [9], [hs[4]])]]  # once, one sync
    # B: another vLLM on the same node
    b = Hybrid(srv, "B")
    att_b = [11, 12, 13, 14, 15, 16]
    mam_b = [0, 0, 0, 0, 17, 18]
    got, plan, (_, recv), errs = b.load("b", hs, 85, att_b, mam_b)
    assert got == (80, True) and recv == {"b"} and errs == set()
    groups = [c[1] for c in srv.calls if c[0] == "query" and c[1]["req_id"].startswith("b")]
    assert [(q["group"], q["n"]) for q in groups] == [(0, 5), (1, 5)]
    lg = plan.loads["b"].leases_for(0)
    assert [(x.group, x.targets) for x in lg] == [(0, (11, 12, 13, 14, 15)), (1, (17,))]
    for sa, sb in zip(att_a[:5], att_b[:5]):
        assert bytes(page(b.att, sb)) == bytes(page(a.att, sa))
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 9))
    assert not srv.leases  # both leases consumed by the one worker


def test_hybrid_membership_gap_moves_the_resume_point_back():
    r = rng()
    srv = FakeServer()
    a = Hybrid(srv, "A")
    hs = hashes("g", 5)
    # steps of 48 and 37 tokens: a state at block 2 only (85 is not a block boundary)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 7, 0, 0, 8], [48, 37], r)
    b = Hybrid(srv, "B")
    got, plan, (_, recv), errs = b.load("b", hs, 85, [11, 12, 13, 0, 0, 0],
                                        [0, 0, 17, 0, 0, 0])
    assert got == (48, True) and recv == {"b"} and not errs
    q0 = [c[1] for c in srv.calls if c[0] == "query" and c[1]["group"] == 0
          and c[1]["req_id"] == "b"]
    assert [q["n"] for q in q0] == [5, 3]  # re-queried for exactly the common prefix
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 7))
    assert [bytes(page(b.att, x)) for x in (11, 12, 13)] == \
        [bytes(page(a.att, x)) for x in (1, 2, 3)]
    assert not srv.leases  # the 5-block lease was released, the others consumed


def test_hybrid_without_any_state_is_a_miss_and_releases_the_prefix_lease():
    r = rng()
    srv = FakeServer()
    a = Hybrid(srv, "A")
    hs = hashes("m", 3)
    a.save_steps("a", hs, 55, [1, 2, 3, 4], [0, 0, 0, 0], [55], r)  # never on a boundary
    b = Hybrid(srv, "B")
    got, plan, _, _ = b.load("b", hs, 55, [5, 6, 7, 8], [0, 0, 9, 10])
    assert got == (0, False) and not plan.loads and not srv.leases


def test_hybrid_destination_without_a_stored_state_fails_the_commit():
    r = rng()
    srv = FakeServer()
    a = Hybrid(srv, "A")
    hs = hashes("d", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    b = Hybrid(srv, "B")
    # vLLM allocated a real state block at position 1 too: nothing stored there
    got, plan, (_, recv), errs = b.load("b", hs, 85, [11, 12, 13, 14, 15, 16],
                                        [0, 19, 0, 0, 17, 18])
    assert got == (80, True)
    assert plan.loads["b"].lease is None and recv == {"b"}
    assert errs == {11, 12, 13, 14, 15, 19, 17}  # every destination block, both groups
    assert not srv.leases


def test_hybrid_want_set_asks_for_the_resume_state_then_falls_back():
    r = rng()
    srv = FakeServer()
    a = Hybrid(srv, "A")
    hs = hashes("w", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 7, 0, 0, 8], [48, 37], r)
    b = Hybrid(srv, "B", wait_for_full_prefix=True)
    got, plan, (_, recv), _ = b.load("b", hs, 85, [11, 12, 13, 0, 0, 0], [0, 0, 17, 0, 0, 0])
    g1 = [c[1] for c in srv.calls if c[0] == "query" and c[1]["group"] == 1]
    # the want-set (the state at block 4) is short: a membership query finds block 2's
    assert [(q["req_id"], q["n"]) for q in g1] == [("b:group-1", 1), ("b:group-1:any", 5)]
    assert got == (48, True) and recv == {"b"}
    assert bytes(page(b.mam, 17)) == bytes(page(a.mam, 7))


def test_hybrid_state_group_loading_answer_is_polled():
    r = rng()
    srv = FakeServer()
    a = Hybrid(srv, "A")
    hs = hashes("l", 5)
    a.save_steps("a", hs, 85, [1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 9, 10], [80, 5], r)
    b = Hybrid(srv, "B")
    srv.loading["b:group-1"] = 1
    req = Req("b", hs, 85)
    assert b.s.get_num_new_matched_tokens(req, 0) == (None, False)
    assert not srv.leases  # the prefix lease of the unfinished answer was released
    assert b.s.get_num_new_matched_tokens(req, 0) == (80, True)


# ------------------------------------------------------------------ MLA

MLA_LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
LAT = 72  # latent + rope, uint16


def mla_ctx(rank, tp, iid, split=False):
    return ConnectorContext(iid, "ns-mla", BS, tp_rank=0, tp_size=1, world_size=tp,
                            physical_tp_rank=rank, local_tp_rank=rank, local_tp_size=tp,
                            is_mla=True, collapse_mla_tp=True, page_first=True,
                            mla_layer_split=split, transfer_mode=1, cross_layer_blocks=False)


def mla_ranks(srv, tp, iid, split=False):
    ws = []
    for rank in range(tp):
        w = WorkerConnector(mla_ctx(rank, tp, iid, split), FakeEngineClient(srv),
                            HostDeviceAdapter(rank), save_thread=False)
        names = MLA_LAYERS if not split else [MLA_LAYERS[rank % len(MLA_LAYERS)]]
        kv = {n: HostTensor(np.zeros((N, BS, LAT), np.uint16), rank) for n in names}
        w.register_kv_caches(kv)
        ws.append((w, kv))
    return ws


def test_mla_tp4_page_first_stores_each_block_once_and_every_rank_loads_it():
    r = rng()
    srv = FakeServer()
    ws = mla_ranks(srv, 4, "A")
    args = srv.calls[0][1]["args"]
    assert args.page_first and args.tp_size == 1 and args.world_size == 4
    ids = list(range(1, 9))
    hs = hashes("mla", 8)
    data = {n: r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16) for n in MLA_LAYERS}
    for w, kv in ws:  # MLA: every rank holds the same KV
        for n, t in kv.items():
            t.numpy()[...] = data[n]
    from pegaflow.connector.plan import SaveIntent, StepPlan

    plan = StepPlan(saves={"a": SaveIntent(tuple(ids), tuple(hs))})
    for w, _ in ws:
        w.wait_for_save(plan)
    saved = [(c[1]["device_id"], c[1]["layers"][0][1]) for c in srv.calls if c[0] == "save"]
    assert saved == [(0, [4, 8]), (1, [1, 5]), (2, [2, 6]), (3, [3, 7])]  # 1/4 each
    assert all(srv.slot_writes[("ns-mla", h)] == len(MLA_LAYERS) for h in hs)  # once
    # every rank reports every hash (the scheduler counts 4 workers per block)
    assert all(sorted(x[1] for x in w.event_log.take()) == sorted(hs) for w, _ in ws)
    # B (another instance, 4 ranks) loads all 8 blocks on every rank
    wb = mla_ranks(srv, 4, "B")
    q = srv.query("B", "b", hs)
    assert q.num_hit_blocks == 8
    from pegaflow.connector.plan import LoadIntent

    dest = tuple(range(10, 18))
    lp = StepPlan(loads={"b": LoadIntent(dest, q.lease, 8 * BS)})
    for w, kv in wb:
        w.start_load_kv(lp)
        assert w.get_finished(set()) == (None, {"b"})
        for n, t in kv.items():
            assert np.array_equal(t.numpy()[list(dest)], data[n][ids])
    assert not srv.leases  # 4 shares consumed


def test_mla_layer_split_ranks_each_save_their_layers():
    r = rng()
    srv = FakeServer()
    ws = mla_ranks(srv, 2, "A", split=True)
    from pegaflow.connector.plan import SaveIntent, StepPlan

    hs = hashes("split", 3)
    for w, kv in ws:
        for t in kv.values():
            t.numpy()[...] = r.integers(0, 65536, (N, BS, LAT), dtype=np.uint16)
    plan = StepPlan(saves={"a": SaveIntent((1, 2, 3), tuple(hs))})
    ws[0][0].wait_for_save(plan)
    assert srv.query("A", "q0", hs).num_hit_blocks == 0  # rank 1's layer is missing
    ws[1][0].wait_for_save(plan)
    saved = [(c[1]["device_id"], [x[0] for x in c[1]["layers"]], c[1]["layers"][0][1])
             for c in srv.calls if c[0] == "save"]
    assert saved == [(0, [MLA_LAYERS[0]], [1, 2, 3]), (1, [MLA_LAYERS[1]], [1, 2, 3])]
    q = srv.query("A", "q1", hs)
    assert q.num_hit_blocks == 3
    srv.release(q.lease)


def test_page_first_refuses_split_kv_layouts():
    srv = FakeServer()
    w = WorkerConnector(mla_ctx(0, 1, "X"), FakeEngineClient(srv), HostDeviceAdapter(0),
                        save_thread=False)
    ctx = w.ctx
    object.__setattr__(ctx, "is_mla", False)  # a (2, N, ...) K/V split tensor
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

    def __init__(self, servers, iid, r):
        self.servers = servers
        self.s = SchedulerConnector(shard_ctx(iid, 0, 0), [FakeEngineClient(x) for x in servers],
                                    session=True, session_thread=False)
        self.ws = []
        for rank in range(4):
            sh, lr = divmod(rank, 2)
            w = WorkerConnector(shard_ctx(iid, sh, lr), FakeEngineClient(servers[sh]),
                                HostDeviceAdapter(rank), save_thread=False)
            kv = {n: HostTensor(np.zeros((2, N, BS, 2, 8), np.uint16), rank) for n in DL}
            w.register_kv_caches(kv)
            self.ws.append((w, kv))
        self.r = r

    def fill(self):
        for w, kv in self.ws:
            for t in kv.values():
                t.numpy()[...] = self.r.integers(0, 65536, t.shape, dtype=np.uint16)

    def save(self, rid, hs, ids):
        req = Req(rid, hs, len(hs) * BS + 3)
        self.s.get_num_new_matched_tokens(req, 0)
        self.s.update_state_after_alloc(req, Blocks(ids + [0]), 0)
        plan = self.s.build_connector_meta(SO(new=[NewReq(rid, (ids + [0],), 0)],
                                              sched={rid: req.num_tokens}))
        for w, _ in self.ws:
            w.wait_for_save(plan)

    def load(self, rid, hs, ids):
        req = Req(rid, hs, len(hs) * BS + 3)
        got = self.s.get_num_new_matched_tokens(req, 0)
        if got[0]:
            self.s.update_state_after_alloc(req, Blocks(ids), got[0])
        plan = self.s.build_connector_meta(SO())
        res = []
        for w, _ in self.ws:
            w.start_load_kv(plan)
            res.append(w.get_finished(set()))
        return got, plan, res


def test_two_servers_each_hold_half_a_tp_group_and_serve_one_request():
    r = rng()
    srvs = [FakeServer(), FakeServer()]
    a = Sharded(srvs, "A", r)
    assert [x.count("session_open") for x in srvs] == [1, 1]
    assert srvs[1].instances["A"].namespace == "ns:tp-shard-1-of-2"
    assert srvs[0].instances["A"].world_size == 2
    a.fill()
    hs = hashes("t", 4)
    a.save("a", hs, [1, 2, 3, 4])
    b = Sharded(srvs, "B", r)
    got, plan, res = b.load("b", hs, [5, 6, 7, 8])
    assert got == (4 * BS, True) and all(x == (None, {"b"}) for x in res)
    it = plan.loads["b"]
    l0, l1 = it.leases_for(0)[0].lease, it.leases_for(1)[0].lease
    assert l0 != l1  # one lease per shard, each from its own server
    for (wa, kva), (wb, kvb) in zip(a.ws, b.ws):
        for n in DL:
            assert np.array_equal(kvb[n].numpy()[:, 5:9], kva[n].numpy()[:, 1:5])
    assert not srvs[0].leases and not srvs[1].leases


def test_mismatched_shard_hits_requery_the_common_prefix():
    r = rng()
    srvs = [FakeServer(), FakeServer()]
    a = Sharded(srvs, "A", r)
    a.fill()
    hs = hashes("mm", 4)
    a.save("a", hs, [1, 2, 3, 4])
    del srvs[1].blocks[("ns:tp-shard-1-of-2", hs[3])]  # shard 1 lost block 3
    b = Sharded(srvs, "B", r)
    got, plan, res = b.load("b", hs, [5, 6, 7, 8])
    assert got == (3 * BS, True) and all(x == (None, {"b"}) for x in res)
    q = [(c[1]["req_id"], c[1]["n"]) for c in srvs[0].calls if c[0] == "query"
         and c[1]["req_id"].startswith("b")]
    assert q == [("b", 4), ("b:tp-common-3", 3)]
    for (wa, kva), (wb, kvb) in zip(a.ws, b.ws):
        assert np.array_equal(kvb[DL[0]].numpy()[:, 5:8], kva[DL[0]].numpy()[:, 1:4])
    assert not srvs[0].leases and not srvs[1].leases  # the 4-block lease released


def test_a_shard_that_lost_the_common_prefix_on_requery_is_a_miss():
    r = rng()
    srvs = [FakeServer(), FakeServer()]
    a = Sharded(srvs, "A", r)
    a.fill()
    hs = hashes("rq", 4)
    a.save("a", hs, [1, 2, 3, 4])
    del srvs[1].blocks[("ns:tp-shard-1-of-2", hs[3])]
    b = Sharded(srvs, "B", r)
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


def test_a_shard_down_degrades_to_a_miss():
    r = rng()
    srvs = [FakeServer(), FakeServer()]
    a = Sharded(srvs, "A", r)
    a.fill()
    hs = hashes("dn", 4)
    a.save("a", hs, [1, 2, 3, 4])
    b = Sharded(srvs, "B", r)
    srvs[1].down = True
    got, plan, _ = b.load("b", hs, [5, 6, 7, 8])
    assert got == (0, False) and not plan.loads
    assert not srvs[0].leases  # shard 0's lease released
