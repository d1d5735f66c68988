"""pegaflow-sim's pieces (python/pegaflow/sim): the engine model's byte-exact check of
loaded blocks against a real server, Prometheus parsing and quantiles, the plot's windowed
ratios, the workload's determinism, and the flag parsing. The whole program runs in
tests/integration/test_sim.sh."""

from __future__ import annotations

import time

import numpy as np
import pytest

from pegaflow.sim import cli, efficiency, promtext, report
from pegaflow.sim.engine import MODELS, Engine, kv_values
from pegaflow.sim.workload import Workload


def _run(e: Engine, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while e.busy():
        assert time.monotonic() < deadline, "engine not idle"
        if e.step() == 0:
            time.sleep(0.002)


def _wait_queryable(e: Engine, hashes: list[bytes], timeout_s: float = 20.0) -> None:
    client = e.sched._scheduler.client
    deadline = time.monotonic() + timeout_s
    while True:
        r = client.query_raw(e.instance_id, "probe-saved", hashes)
        if r.lease:
            client.release(r.lease)
        if not r.loading and r.num_hit_blocks == len(hashes):
            return
        assert time.monotonic() < deadline, f"{r.num_hit_blocks} of {len(hashes)} saved blocks " \
            f"queryable after {timeout_s} s"
        time.sleep(0.01)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_loaded_blocks_verify_and_a_flipped_byte_is_caught(server_factory, engine_lib, model):
    s = server_factory()
    seed = 20261201
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    e = Engine(MODELS[model], host="127.0.0.1", port=s.port, instance_id=f"simt-{model}",
               seed=seed, num_blocks=64, lib=engine_lib)
    try:
        shared = [int(x) for x in rng.integers(100, 30000, 48)]
        e.add("a", shared + [7, 8, 9], 2)
        _run(e)
        first = e.take_completed()[0]
        assert first.requested_blocks == 3 and first.loaded_blocks == 0
        assert not first.unreachable
        # the request's saves complete in the background: wait until the server answers
        # all 3 blocks before asking again (they may not be queryable yet right now)
        _wait_queryable(e, e.asked["a"])
        # the same prefix again: 3 blocks come back from the server's RAM
        e.add("b", shared + [10, 11], 2)
        st = e.states["b"]
        while not st.loaded_blocks:
            assert e.busy()
            e.step()
            time.sleep(0.002)
        assert st.loaded_blocks == 3 and st.bad_blocks == 0 and st.bad_bytes == 0
        for i in range(3):
            assert e.verify_block(st, i) == 0
        # a flipped byte in a loaded block is seen
        blk = st.blocks[1].block_id
        arr = next(iter(e.kv[0].values()))
        if e.cross:
            arr[blk, 0, 0, 0, 0, 0] ^= 1
        elif MODELS[model].mla:
            arr[blk, 0, 0] ^= 1
        else:
            arr[0, blk, 0, 0, 0] ^= 1
        assert e.verify_block(st, 1) >= 1
        assert e.verify_block(st, 0) == 0
        _run(e)
    finally:
        e.shutdown()


def test_kv_values_depend_on_hash_and_layer():
    a = kv_values(np.array([1, 2], dtype=np.uint64), 2, 8)
    assert a.shape == (2, 2, 8)
    assert not np.array_equal(a[0], a[1]) and not np.array_equal(a[0, 0], a[0, 1])
    assert np.array_equal(a, kv_values(np.array([1, 2], dtype=np.uint64), 2, 8))


def test_promtext_parse_and_quantile():
    text = """# TYPE x counter
pegaflow_cache_tier_block_requests_total{tier="ram"} 5
pegaflow_cache_tier_block_requests_total{tier="rdma"} 3
other_metric 9
pegaflow_rdma_fetch_duration_seconds_bucket{le="0.001"} 2
pegaflow_rdma_fetch_duration_seconds_bucket{le="0.01"} 4
pegaflow_rdma_fetch_duration_seconds_bucket{le="+Inf"} 4
"""
    m = promtext.parse(text)
    assert promtext.get(m, "pegaflow_cache_tier_block_requests_total", tier="ram") == 5
    assert promtext.get(m, "pegaflow_cache_tier_block_requests_total", tier="miss") == 0
    assert not any(k.startswith("other_metric") for k in m)
    h = promtext.histogram(m, "pegaflow_rdma_fetch_duration_seconds")
    assert h[0] == (0.001, 2) and h[-1][0] == float("inf")
    assert promtext.quantile(h, 0.5) == pytest.approx(0.001)
    assert promtext.quantile(h, 0.75) == pytest.approx(0.0055)
    assert promtext.quantile([], 0.5) is None


def test_windowed_ratios():
    tl = [{"t": 0.0, "ram": 0, "ssd": 0, "remote": 0, "miss": 0},
          {"t": 1.0, "ram": 10, "ssd": 0, "remote": 0, "miss": 0},
          {"t": 3.0, "ram": 10, "ssd": 0, "remote": 10, "miss": 0}]
    w = report.windowed(tl, window_s=2.0)
    assert w[0] == (1.0, {"ram": 1.0, "ssd": 0.0, "remote": 0.0, "miss": 0.0})
    assert w[1][1]["remote"] == 1.0  # only the last 2 s: 10 remote


def test_workload_is_seeded_and_routes():
    def first(route, seed=5):
        wl = Workload(seed, 3, route=route)
        out = []
        for _ in range(12):
            rid, node, prompt, mt, cid = wl.next_request()
            out.append((rid, node, len(prompt), mt))
            wl.answered(cid, [1] * mt)
        return out

    assert first("round-robin") == first("round-robin")
    assert first("round-robin") != first("round-robin", seed=6)
    assert [n for _, n, _, _ in first("round-robin")] == [i % 3 for i in range(12)]
    sticky = first("sticky")
    by_conv = {}
    for rid, node, _, _ in sticky:
        by_conv.setdefault(rid.split("-")[0], set()).add(node)
    assert all(len(v) == 1 for v in by_conv.values())
    # later turns extend the conversation's context
    assert any(rid.endswith("-t2") for rid, _, _, _ in sticky)


def test_flag_parsing():
    assert cli.parse_when("30s") == ("t", 30.0)
    assert cli.parse_when("500ms") == ("t", 0.5)
    assert cli.parse_when("40%") == ("pct", 40.0)
    with pytest.raises(cli.Usage, match="bad time"):
        cli.parse_when("soon")
    with pytest.raises(cli.Usage, match="at most 100%"):
        cli.parse_when("140%")
    assert cli.parse_node_event("2@30s", 3, "--kill-node") == (2, "t", 30.0)
    with pytest.raises(cli.Usage, match="not one of 1..3"):
        cli.parse_node_event("4@30s", 3, "--kill-node")
    with pytest.raises(cli.Usage, match="NODE@TIME"):
        cli.parse_node_event("2", 3, "--kill-node")


def test_availability_follows_lives_and_prefixes():
    lv = efficiency.Lives()
    lv.start(1, 0.0)
    lv.start(2, 0.0)
    ho = efficiency.Holdings(lv)
    ho.hold(1, 1.0, ["a", "b"])
    ho.hold(2, 2.0, ["c"])
    assert ho.available(["a", "b", "c"], 0.5) == 0  # nothing saved yet
    assert ho.available(["a", "b", "c"], 1.5) == 2  # c not yet: the prefix stops
    assert ho.available(["a", "b", "c"], 2.5) == 3
    assert ho.available(["a", "x", "c"], 2.5) == 1
    lv.end(1, 3.0)  # node 1 killed: its blocks are gone
    assert ho.available(["a"], 3.5) == 0 and ho.available(["c"], 3.5) == 1
    lv.start(1, 4.0)  # restarted: the previous life's blocks stay gone
    assert ho.available(["a"], 4.5) == 0
    ho.hold(1, 5.0, ["a"])
    assert ho.available(["a"], 5.5) == 1
    assert lv.restarts(1) == [4.0] and lv.restarts(2) == []


def test_summary_efficiency_waits_and_restart_to_hit():
    lv = efficiency.Lives()
    lv.start(1, 0.0)
    lv.start(2, 0.0)
    ho = efficiency.Holdings(lv)
    ho.hold(2, 1.0, ["a", "b", "c", "d"])
    lv.end(1, 2.0)
    lv.start(1, 10.0)
    done = {
        1: [{"asked": ["a", "b"], "t_query": 1.5, "t_ready": 1.6, "loaded_blocks": 2,
             "ready_wait_s": 0.1, "load_wait_s": 0.2, "prefetched": True},
            {"asked": ["a", "b", "c", "d"], "t_query": 10.2, "t_ready": 10.5,
             "loaded_blocks": 3, "ready_wait_s": 0.3, "load_wait_s": 0.4, "prefetched": True},
            {"asked": ["z"], "t_query": 10.1, "t_ready": 10.1, "loaded_blocks": 0,
             "ready_wait_s": 0.0, "load_wait_s": 0.0, "prefetched": True}],
        2: [{"asked": ["a"], "t_query": 3.0, "t_ready": 3.0, "loaded_blocks": 1,
             "ready_wait_s": 0.0, "load_wait_s": 0.01, "prefetched": False},
            {"asked": ["a", "b"], "t_query": 3.5, "loaded_blocks": 0, "unreachable": True,
             "ready_wait_s": None, "load_wait_s": 0.0, "prefetched": False}],
    }
    s = efficiency.summarize(done, ho, lv)
    assert (s["available"], s["delivered"]) == (2 + 4 + 0 + 1, 2 + 3 + 0 + 1)
    assert s["efficiency"] == pytest.approx(6 / 7)
    assert s["nodes"][1]["available"] == 6 and s["nodes"][2]["efficiency"] == 1.0
    assert s["loading_then_nothing"] == 1 and s["unreachable_requests"] == 1
    assert s["restart_to_hit_s"] == {"n1": pytest.approx(0.5)}  # 10.5 - 10.0
    lw = s["load_wait_ms"]
    assert lw["ready_p50"] == pytest.approx(0.0) and lw["ready_p99"] == pytest.approx(300.0)
    assert lw["loaded_p50"] == pytest.approx(200.0) and lw["loaded_requests"] == 3
    pts = efficiency.windowed(done, 0.0, window_s=100.0)
    assert pts[-1][1] == pytest.approx(6 / 7)


def test_help_says_percent_once(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    out = capsys.readouterr().out
    assert "40%" in out and "%%" not in out


def test_availability_is_taken_when_the_server_answered_ready():
    lv = efficiency.Lives()
    lv.start(1, 0.0)
    ho = efficiency.Holdings(lv)
    ho.hold(1, 2.0, ["a", "b"])  # saved while the request was answered Loading
    done = {1: [{"asked": ["a", "b"], "t_query": 1.0, "t_ready": 3.0, "loaded_blocks": 2,
                 "ready_wait_s": 2.0, "load_wait_s": 2.1, "prefetched": True}]}
    s = efficiency.summarize(done, ho, lv)
    assert s["available"] == 2 and s["efficiency"] == 1.0
