"""TP across two hosts, each host a network namespace: the driver of
tests/integration/test_tp_netns.sh (not collected by `pytest tests/python`: its name does
not start with test_; run it through that script, which sets the environment below).

The script starts one ``pegaflow-server --gpu-backend sim`` in each of two namespaces,
bound to that namespace's veth address, and runs this file in a third namespace routed to
both. Sim KV memory is POSIX shm in /dev/shm, which network namespaces share, so workers
here register with servers "on other hosts" (the servers' default ``--local-rpcs auto``
admits them: no TLS, no cluster token).

Environment (from the script):
  PF_TP_ENDPOINTS   "IP0:PORT0,IP1:PORT1"   gRPC endpoints = pegaflow.tp_shard_endpoints
  PF_TP_HTTP        "IP0:PORT0,IP1:PORT1"   the servers' HTTP listeners (/metrics)
  PF_TP_CUT         "NS DEV"                the veth of shard 1's host, set down to cut it
  PF_TEST_SEED      seed of the model's KV (printed)

The connector is the real one end to end: PegaKVConnector created by the vLLM stub's
factory, ``pegaflow.tp_shard_endpoints`` parsed by it, its own EngineClients with its
timeouts (the facade's client factory is not replaced), workers on sim-GPU memory.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.request
import uuid

import pytest

from harness import Engine, RealBackend

PROMPT = [1000 + (i * 37) % 5000 for i in range(80)]  # 5 blocks of 16
QUERY_TIMEOUT_MS = 1000
RPC_TIMEOUT_MS = 3000


def _env_list(name):
    v = os.environ.get(name, "")
    if not v:
        pytest.skip(f"SKIP: {name} is unset (run tests/integration/test_tp_netns.sh)")
    return [x.strip() for x in v.split(",") if x.strip()]


@pytest.fixture
def hosts(engine_lib, monkeypatch):
    from conftest import require_engine_server
    from pegaflow.client.engine import EngineClient

    monkeypatch.setenv("PYTHONHASHSEED", "0")
    eps, http = _env_list("PF_TP_ENDPOINTS"), _env_list("PF_TP_HTTP")
    assert len(eps) == 2 and len(http) == 2, (eps, http)
    probes = [EngineClient(e, lib=engine_lib, timeout_ms=5000) for e in eps]
    for p in probes:
        require_engine_server(p)
    h = type("Hosts", (), {})()
    h.eps, h.http, h.probes, h.lib = eps, http, probes, engine_lib
    yield h
    for p in probes:
        p.close()


def visible(h, i, iid, hs):
    q = h.probes[i].query_raw(iid, "probe-" + uuid.uuid4().hex, list(hs))
    if q.lease:
        h.probes[i].release(q.lease)
    return 0 if q.loading else q.num_hit_blocks


def wait_visible(h, i, iid, hs, timeout=10.0):
    deadline = time.monotonic() + timeout
    while visible(h, i, iid, hs) < len(hs):
        assert time.monotonic() < deadline, f"server {i} never held {iid}'s {len(hs)} blocks"
        time.sleep(0.01)


def metric(h, i, name):
    body = urllib.request.urlopen(f"http://{h.http[i]}/metrics", timeout=5).read().decode()
    for line in body.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in server {i}'s /metrics")


def released(h, i, lease):
    """True when server i no longer knows ``lease`` (consumed or released)."""
    from pegaflow.client.errors import FailedPrecondition

    try:
        h.probes[i].release(lease)
    except FailedPrecondition:
        return True
    return False


def cut(up: bool):
    ns, dev = os.environ["PF_TP_CUT"].split()
    subprocess.run(["ip", "-n", ns, "link", "set", dev, "up" if up else "down"], check=True)


def test_tp4_over_two_namespaces_per_shard_leases_then_a_cut_link(hosts, monkeypatch):
    h = hosts
    seed = int(os.environ.get("PF_TEST_SEED") or 0) or int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed} (PF_TEST_SEED={seed} replays it)")
    alloc = RealBackend(h.eps[0], h.lib)  # sim-GPU memory for the workers (shared /dev/shm)
    made = []
    # the facade's own client factory and device adapter: only the test's step loop is ours
    keep = lambda obj, name, value: None  # noqa: E731

    def engine(iid):
        e = Engine(alloc, keep, instance_id=iid, tp=4, seed=seed,
                   extra_config={"pegaflow.tp_shard_endpoints": h.eps,
                                 "pegaflow.query_timeout_ms": QUERY_TIMEOUT_MS,
                                 "pegaflow.rpc_timeout_ms": RPC_TIMEOUT_MS})
        made.append(e)
        return e

    def capture(e):
        metas = []
        orig = e.sched.build_connector_meta

        def build(so):
            m = orig(so)
            metas.append(m)
            return m

        e.sched.build_connector_meta = build
        return metas

    try:
        # A: TP=4 over the two hosts, ranks 0-1 on host 0, 2-3 on host 1; misses and saves
        e1 = engine("tp-a")
        assert [w._client.target for w in e1.workers] == [h.eps[0]] * 2 + [h.eps[1]] * 2
        for r, w in enumerate(e1.workers):
            c = w._ctx
            assert (c.shard_index, c.tp_rank, c.tp_size, c.world_size) == (r // 2, r % 2, 2, 2)
            assert c.namespace.endswith(f":tp-shard-{r // 2}-of-2")
        assert all(s is not None for s in e1.sched._scheduler.sessions)  # one per host
        a = e1.add_request("A", PROMPT, max_tokens=3)
        e1.run()
        assert e1.logs["A"].loaded_blocks == 0
        for i in range(2):
            wait_visible(h, i, "tp-a", a.block_hashes[:5])
        snap = e1.logs["A"].snapshot
        saved = [metric(h, i, "pegaflow_save_bytes_total") for i in range(2)]
        print(f"saved bytes per host: {saved}")
        assert saved[0] > 0 and saved[0] == saved[1]  # each host holds its half

        # B: another vLLM loads A's 5 blocks, one lease per shard, each from its own host
        e2 = engine("tp-b")
        metas = capture(e2)
        e2.add_request("B", PROMPT, max_tokens=3)
        e2.run()
        loads = [m.plan.loads["B"] for m in metas if "B" in m.plan.loads]
        assert len(loads) == 1
        it = loads[0]
        leases = [it.leases_for(i) for i in range(2)]
        assert [len(x) for x in leases] == [1, 1] and leases[0][0].lease != leases[1][0].lease
        lg = e2.logs["B"]
        assert lg.loaded_blocks == 5 and not lg.load_failed and len(lg.loaded) == 5
        for hsh, per_worker in lg.loaded.items():  # block by block, all four ranks
            assert per_worker == snap[hsh], f"block {hsh.hex()[:8]} differs"
            assert any(any(b) for b in per_worker), "loaded block is all zeros"
        assert e2.requests["B"].output_token_ids == e1.requests["A"].output_token_ids
        for i in range(2):  # each lease consumed by its shard's two workers
            assert released(h, i, leases[i][0].lease), f"shard {i}'s lease still held"
            assert metric(h, i, "pegaflow_leases_active") == 0
        st = e2.sched._scheduler.stats
        print(f"B scheduler stats: {st}")

        # C: registered on both hosts, then host 1's link goes down: shard 1's query runs
        # into the connector's query deadline, the request is a miss (recomputed, same
        # outputs), shard 0's lease is released
        e3 = engine("tp-c")
        metas = capture(e3)
        answers = []  # (shard, QueryResult) of every query C's scheduler made
        for i, c in enumerate(e3.sched._scheduler.clients):
            def rec(*a, _q=c.query, _i=i, **k):
                r = _q(*a, **k)
                answers.append((_i, r))
                return r

            c.query = rec
        cut(up=False)
        t0 = time.monotonic()
        e3.add_request("C", PROMPT, max_tokens=3)
        e3.run()  # (bounded: the step loop's own 20 s deadline)
        print(f"C with host 1 cut: done in {time.monotonic() - t0:.1f} s "
              f"(query deadline {QUERY_TIMEOUT_MS} ms, RPC deadline {RPC_TIMEOUT_MS} ms)")
        st = e3.sched._scheduler.stats
        print(f"C scheduler stats: {st}")
        assert not any("C" in m.plan.loads for m in metas)
        assert e3.logs["C"].loaded_blocks == 0 and not e3.logs["C"].load_failed
        assert e3.requests["C"].output_token_ids == e1.requests["A"].output_token_ids
        # shard 0 answered 5 blocks with a lease, shard 1 was unreachable (deadline): the
        # client's miss, which the scheduler does not count as a query error
        assert [(i, r.num_hit_blocks, bool(r.lease), r.unreachable) for i, r in answers] == \
            [(0, 5, True, False), (1, 0, False, True)]
        assert st["hits"] == 0 and st["releases"] == 1 and st["release_errors"] == 0
        assert released(h, 0, answers[0][1].lease)  # shard 0's lease released
        assert metric(h, 0, "pegaflow_leases_active") == 0
    finally:
        try:
            cut(up=True)
        except Exception:
            pass
        for e in made:
            try:
                e.shutdown()
            except Exception:
                pass
