"""Shared pieces of the model-family tests (test_hybrid.py, test_mla.py,
test_tp_shards.py, test_tiers.py): backends (the in-memory FakeServer with numpy "GPU"
memory, or real pegaflow-server processes with sim-GPU memory; [real] skips while PF_BIN
is unset), strided views as vLLM lays out hybrid caches, minimal vLLM scheduler objects,
and one driver per family. The tests cover:

  * hybrid (attention group + Mamba-style recurrent-state group): per-group registration,
    saves (every full attention block; the state block at a step's block boundary),
    membership queries and the resume point, per-group loads byte for byte, membership
    gaps, a null/non-null destination without a stored state, the want-set form;
  * MLA page-first on TP=4: striped saves store every block once, every rank loads it;
    the layer-split variant;
  * TP across hosts: two servers each holding half of a TP group, per-shard leases,
    mismatched shard hit counts (common-prefix re-query), a shard down (miss);
  * the hybrid and MLA layouts through the SSD tier and across two nodes over P2P.

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
from conftest import require_engine_server
from fakes import FakeEngineClient, FakeServer, HostDeviceAdapter, HostTensor
from pegaflow.connector.config import FULL, STATE, CacheGroup, ConnectorContext
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
        p = self.procs[i]
        req = urllib.request.Request(f"http://{p.http_host}:{int(m[-1])}{path}", method=method,
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
