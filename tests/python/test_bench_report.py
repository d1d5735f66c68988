"""bench/report.py: tabulates the benchmarks' JSON into one report (figure, baseline,
min/median/max ratio, target, met) and names the benchmarks that produced nothing."""
import json
import os
import subprocess
import sys

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_report_from_json(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "engine.json").write_text(json.dumps({
        "resident_blocks": 1000000, "bytes_per_block": 200.0,
        "throughput": [{"block_bytes": 65536, "save_gbs": 5.0, "save_baseline_gbs": 10.0,
                        "save_ratio": [0.4, 0.5, 0.6], "load_gbs": 9.5,
                        "load_baseline_gbs": 10.0, "load_ratio": [0.9, 0.95, 0.97]}],
        "query": [{"hashes": 4096, "p50_us": 300.0, "p99_us": 400.0, "p50_vs_health": 6.0,
                   "same_bytes_p50_us": 150.0, "p50_vs_same_bytes": 2.0}]}))
    (src / "ssd.json").write_text("not json")
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(TOP, "bench", "report.py"), "--from", str(src),
                        "--out", str(out), "--only", "engine,ssd"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "report.json").read_text())
    by = {x["path"]: x for x in doc["rows"]}
    save = by["save until queryable, 64 KiB blocks (integrity on)"]
    assert save["ratio"] == [0.4, 0.5, 0.6] and save["met"] is False
    assert by["load, 64 KiB blocks"]["met"] is True
    q = [x for x in doc["rows"] if x["path"].startswith("QueryPrefetch 4096")][0]
    assert q["ratio"] == [2.0, 2.0, 2.0] and q["met"] is False  # target <= 1.5
    assert "ssd" in doc["errors"]
    md = (out / "report.md").read_text()
    assert "| engine | save until queryable, 64 KiB blocks" in md
    assert "0.4 / 0.5 / 0.6" in md and "**no**" in md
    assert "`ssd`: no JSON" in md



def test_save_target_follows_the_block_size(tmp_path):
    """Issue 27 item 2: save until queryable >= 0.80 of the best copy at 64 KiB blocks,
    >= 0.85 at 512 KiB and 2 MiB: 0.82 meets the first and misses the others."""
    src = tmp_path / "in"
    src.mkdir()
    rows = [{"block_bytes": b, "save_gbs": 8.2, "save_baseline_gbs": 10.0,
             "save_ratio": [0.82, 0.82, 0.82], "load_gbs": 9.5, "load_baseline_gbs": 10.0,
             "load_ratio": [0.95, 0.95, 0.95]} for b in (65536, 524288, 2097152)]
    (src / "engine.json").write_text(json.dumps({"resident_blocks": 1000, "throughput": rows}))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(TOP, "bench", "report.py"), "--from", str(src),
                        "--out", str(out), "--only", "engine"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    by = {x["path"]: x for x in json.loads((out / "report.json").read_text())["rows"]}
    got = {k: (by[f"save until queryable, {k} KiB blocks (integrity on)"]["target"],
               by[f"save until queryable, {k} KiB blocks (integrity on)"]["met"])
           for k in (64, 512, 2048)}
    assert got == {64: (0.80, True), 512: (0.85, False), 2048: (0.85, False)}


def test_report_rows_of_the_newer_benchmarks(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "engine.json").write_text(json.dumps({
        "resident_blocks": 1000000, "bytes_per_block": 100.0,
        "bytes_per_block_32_layers": 2800.0, "throughput": [], "query": []}))
    (src / "ssd_server.json").write_text(json.dumps({
        "write": {"server_gbs": 1.0, "raw_gbs": 2.0, "ratio": [0.4, 0.5, 0.6]},
        "read": {"server_gbs": 1.9, "raw_gbs": 2.0, "ratio": [0.9, 0.95, 1.0]}}))
    (src / "connector.json").write_text(json.dumps({
        "requests": 8, "blocks": 8, "layers": 8, "connector_ms": 9.0, "direct_ms": 3.0,
        "ratio": [0.3, 0.33, 0.4], "overhead_us_per_step": 2000.0}))
    (src / "metaserver.json").write_text(json.dumps({
        "keys": 1000000,
        "rpc": {"rss_bytes_per_key": 100.0, "query_per_s": 9000, "empty_rtt_per_s": 20000,
                "query_vs_empty": [0.4, 0.45, 0.5]},
        "store": {"query_per_s": 90000, "query_per_s_spread": [80000, 90000, 95000],
                  "store_bytes_per_key": 96.0}}))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(TOP, "bench", "report.py"), "--from", str(src),
                        "--out", str(out), "--only", "engine,ssd_server,connector,metaserver,gpu"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "report.json").read_text())
    by = {x["path"]: x for x in doc["rows"]}
    m32 = by["metadata per block at 1000000, 32 per-layer slots"]
    assert m32["ratio"] == [2800.0] * 3 and m32["met"] is False  # target <= 640
    w = by["SSD through the server: save -> on SSD vs raw O_DIRECT write (depth 2)"]
    assert w["ratio"] == [0.4, 0.5, 0.6] and w["met"] is False
    rd = [x for x in doc["rows"] if x["path"].startswith("SSD through the server: evict")][0]
    assert rd["met"] is True
    c = [x for x in doc["rows"] if x["path"].startswith("Python connector")][0]
    assert c["ratio"] == [0.3, 0.33, 0.4] and c["target"] is None and c["met"] is None
    q = by["MetaServer in-process prefix queries/s at 1000000 keys"]
    assert q["ratio"] == [80000, 90000, 95000] and q["met"] is False
    e = [x for x in doc["rows"] if x["path"].startswith("MetaServer QueryPrefixBlocks")][0]
    assert e["ratio"] == [0.4, 0.45, 0.5]
    assert "gpu" in doc["errors"]  # no gpu.json: named, never left out
    assert "Not measured yet" not in (out / "report.md").read_text()


def test_merge_of_several_runs(tmp_path):
    """--merge: per path min / median / max of the runs' medians; met from the median."""
    docs = []
    for i, med in enumerate([0.5, 0.9, 0.7]):
        doc = {"meta": {"date": "d", "host": "h", "cpus": 2, "quick": True},
               "rows": [{"bench": "ssd", "path": "p", "figure": f"{med}", "baseline": "b",
                         "ratio": [med - 0.1, med, med + 0.1], "target": 0.8, "better": "ge",
                         "met": med >= 0.8, "note": ""}],
               "errors": {}}
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(doc))
        docs.append(str(path))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(TOP, "bench", "report.py"), "--out", str(out),
                        "--merge", *docs], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    row = json.loads((out / "report.json").read_text())["rows"][0]
    assert row["ratio"] == [0.5, 0.7, 0.9] and row["runs"] == 3
    assert row["met"] is False and row["figure"] == "0.7"
    assert "3 runs merged" in (out / "report.md").read_text()


def test_even_merge_is_a_true_median_and_nothing_fixed(tmp_path):
    """--merge of an even number of runs: the median is the mean of the two middle runs'
    medians; report.md lists only rows this run measured (no fixed before/after list)."""
    docs = []
    for i, med in enumerate([0.5, 0.9, 0.7, 0.6]):
        doc = {"meta": {"date": "d", "host": "h", "cpus": 2, "quick": True},
               "rows": [{"bench": "ssd", "path": "p", "figure": f"{med}", "baseline": "b",
                         "ratio": [med - 0.1, med, med + 0.1], "target": 0.66, "better": "ge",
                         "met": med >= 0.66, "note": ""}],
               "errors": {}}
        path = tmp_path / f"r{i}.json"
        path.write_text(json.dumps(doc))
        docs.append(str(path))
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(TOP, "bench", "report.py"), "--out", str(out),
                        "--merge", *docs], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    row = json.loads((out / "report.json").read_text())["rows"][0]
    assert row["ratio"][0] == 0.5 and row["ratio"][2] == 0.9
    assert abs(row["ratio"][1] - 0.65) < 1e-9 and row["met"] is False  # (0.6 + 0.7) / 2
    md = (out / "report.md").read_text()
    assert "Which change moved" not in md and "->" not in md


# ---- "How cost grows": the curves drawn as SVG next to report.md ----

sys.path.insert(0, os.path.join(TOP, "bench"))
import curves  # noqa: E402


def curve_fixture():
    return {
        "seconds": 123.0,
        "engine": {"block_bytes": 64, "iters": 50, "points": [
            {"blocks": 10000, "save_batch": 256, "save_p50_us": 90.0, "query1_p50_us": 40.0,
             "query_hashes": 4096, "query_p50_us": 700.0, "bytes_per_block": 180.0},
            {"blocks": 100000, "save_batch": 256, "save_p50_us": 95.0, "query1_p50_us": 41.0,
             "query_hashes": 4096, "query_p50_us": 760.0, "bytes_per_block": 150.0},
            {"blocks": 1000000, "save_batch": 256, "save_p50_us": 99.0, "query1_p50_us": 45.0,
             "query_hashes": 4096, "query_p50_us": 900.0, "bytes_per_block": 140.0}],
            "stopped_at": 10000000,
            "stopped_why": "memory: 10000000 blocks need ~9.9 GiB more"},
        "p2p": {"not_measured": "bench/p2p has no --concurrent", "seconds": 0.1},
        "metaserver": {
            "memory": [{"keys": 100000, "bytes_per_key": 120.0, "store_query_per_s": 90000,
                        "rpc_query_per_s": 9000},
                       {"keys": 1000000, "bytes_per_key": 110.0, "store_query_per_s": 85000,
                        "rpc_query_per_s": 8800}],
            "redis": [{"keys": 100000, "bytes_per_key": 300.0, "store_query_per_s": 9000,
                       "rpc_query_per_s": 3000}],
            "stopped": {"memory": "stopped at 10^7 keys: time: ~400 s needed",
                        "redis": "stopped at 10^6 keys: time: ~300 s needed"}}}


SSD_DEPTHS = {"block_bytes": 1 << 20, "write": {"raw_bytes_per_s": 2e9, "tier_bytes_per_s": 1.8e9,
                                                "ratio": 0.9},
              "read": {"raw_bytes_per_s": 2e9, "tier_bytes_per_s": 1.5e9, "ratio": 0.75},
              "depths": [{"depth": d, "tier_write_bytes_per_s": 1e8 * d,
                          "raw_write_bytes_per_s": 1.1e8 * d, "tier_read_bytes_per_s": 0.9e8 * d,
                          "raw_read_bytes_per_s": 1e8 * d} for d in (1, 2, 4, 8, 16, 32)]}


def run_report(tmp_path, only, extra=()):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, os.path.join(TOP, "bench", "report.py"), "--from",
                        str(tmp_path / "in"), "--out", str(out), "--only", only, *extra],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out


def test_curves_drawn_as_svg_next_to_the_report(tmp_path):
    import xml.etree.ElementTree as ET
    src = tmp_path / "in"
    src.mkdir()
    (src / "curves.json").write_text(json.dumps(curve_fixture()))
    (src / "ssd.json").write_text(json.dumps(SSD_DEPTHS))
    out = run_report(tmp_path, "ssd")
    md = (out / "report.md").read_text()
    want = {"curve_engine_latency.svg": 3, "curve_engine_memory.svg": 1,
            "curve_ssd_depth.svg": 4, "curve_meta_memory.svg": 2, "curve_meta_qps.svg": 3}
    for name, nseries in want.items():
        root = ET.parse(out / name).getroot()  # well-formed XML, or this raises
        assert root.tag == "{http://www.w3.org/2000/svg}svg"
        groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g")
                  if g.get("class") == "series"]
        assert len(groups) == nseries, name  # one series per curve drawn
        assert f"]({name})" in md  # linked from report.md
        texts = " ".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
        assert "(log scale)" in texts  # x is a count: log-x, labelled
    # every series of the memory chart has its measured points, in order
    root = ET.parse(out / "curve_engine_memory.svg").getroot()
    circles = list(root.iter("{http://www.w3.org/2000/svg}circle"))
    assert len(circles) == 3
    xs = [float(c.get("cx")) for c in circles]
    assert xs == sorted(xs) and xs[0] < xs[-1]
    assert "## How cost grows" in md and "The curves took 123 s" in md
    assert "stopped at 10000000 blocks: memory" in md
    assert "memory store: stopped at 10^7 keys" in md
    assert "redis store: stopped at 10^6 keys" in md
    assert "not measured: bench/p2p has no --concurrent" in md
    assert "curve_p2p_concurrent.svg" not in md and not (out / "curve_p2p_concurrent.svg").exists()
    doc = json.loads((out / "report.json").read_text())
    assert [c["file"] for c in doc["curves"]["charts"]] == list(want)


def test_p2p_concurrency_curve_from_runs(tmp_path):
    import xml.etree.ElementTree as ET
    src = tmp_path / "in"
    src.mkdir()
    fx = curve_fixture()
    fx["p2p"] = {"runs": {str(n): {"concurrent": n, "throughput": [
        {"block": 262144, "p2p_gbps": 1.0 * n, "raw_gbps": 2.0},
        {"block": 4194304, "p2p_gbps": 1.5 * n, "raw_gbps": 2.5}]} for n in (1, 2, 4)}}
    (src / "curves.json").write_text(json.dumps(fx))
    (src / "ssd.json").write_text(json.dumps({k: v for k, v in SSD_DEPTHS.items()
                                              if k != "depths"}))
    out = run_report(tmp_path, "ssd")
    root = ET.parse(out / "curve_p2p_concurrent.svg").getroot()
    groups = [g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("class") == "series"]
    assert [g.get("data-name") for g in groups] == ["P2P 256 KiB blocks", "P2P 4096 KiB blocks"]
    assert all(len(list(g.iter("{http://www.w3.org/2000/svg}circle"))) == 3 for g in groups)
    md = (out / "report.md").read_text()
    assert "| 4096 KiB | 4 | 6.00 | 2.50 |" in md
    # no depth figures in ssd.json: said, not drawn
    assert "SSD throughput at depth 1 to 32: not measured" in md


def test_p2p_without_concurrent_flag_is_detected():
    usage = ("usage: p2p [--size BYTES] [--blocks 256k,1m,4m] [--reps N] [--lat-reps N] "
             "[--json FILE]\n")
    assert not curves.p2p_has_concurrent(usage)
    assert curves.p2p_has_concurrent(usage.replace("[--json", "[--concurrent N] [--json"))
    assert curves.p2p_has_concurrent("bench/p2p: netns: operation not permitted\n")


def test_metaserver_curve_stops_where_memory_or_time_ends():
    last = {"keys": 10 ** 6, "seconds": 10.0, "bytes_per_key_all": 200.0}
    assert curves.meta_does_not_fit(10 ** 7, None, 100, 1 << 40) is None
    assert curves.meta_does_not_fit(10 ** 7, last, 1000, 1 << 40) is None
    why = curves.meta_does_not_fit(10 ** 8, last, 10 ** 6, 24 << 30)  # 30 GB > 20 GiB
    assert why.startswith("memory:")
    why = curves.meta_does_not_fit(10 ** 7, last, 50, 1 << 40)  # ~100 s > 50 s left
    assert why.startswith("time:")


def test_no_curves_without_curve_json_or_with_no_curves(tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "ssd.json").write_text(json.dumps(SSD_DEPTHS))
    out = run_report(tmp_path, "ssd")
    assert "How cost grows" not in (out / "report.md").read_text()
    assert not list(out.glob("*.svg"))
    (src / "curves.json").write_text(json.dumps(curve_fixture()))
    out = run_report(tmp_path, "ssd", ["--no-curves"])  # make bench CURVES=0
    assert "How cost grows" not in (out / "report.md").read_text()
    assert not list(out.glob("*.svg"))


def test_svg_chart_escapes_and_handles_no_points():
    import xml.etree.ElementTree as ET
    svg = curves.svg_chart("a < b & c", "keys", "B", [("x<y", [(1, None)])])
    root = ET.fromstring(svg)
    assert "no points measured" in "".join(t.text or "" for t in root.iter(
        "{http://www.w3.org/2000/svg}text"))
    svg = curves.svg_chart("t", "n", "y", [("s", [(10, 1.0), (1000, 2.0)])], logy=True)
    ET.fromstring(svg)


def test_merge_keeps_the_curves_of_the_run_that_drew_them(tmp_path):
    """--repeat N: only the first run draws curves; the merged report links its SVG files,
    copied next to the merged report.md."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "curves.json").write_text(json.dumps(curve_fixture()))
    (src / "ssd.json").write_text(json.dumps(SSD_DEPTHS))
    run1 = run_report(tmp_path, "ssd")
    run2 = tmp_path / "run2"
    r = subprocess.run([sys.executable, os.path.join(TOP, "bench", "report.py"), "--from",
                        str(src), "--out", str(run2), "--only", "ssd"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    doc2 = json.loads((run2 / "report.json").read_text())
    doc2["curves"] = None  # as a later run of --repeat, which skips the curves
    (run2 / "report.json").write_text(json.dumps(doc2))
    merged = tmp_path / "merged"
    r = subprocess.run([sys.executable, os.path.join(TOP, "bench", "report.py"), "--out",
                        str(merged), "--merge", str(run2 / "report.json"),
                        str(run1 / "report.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    md = (merged / "report.md").read_text()
    assert "## How cost grows" in md and "2 runs merged" in md
    for f in ("curve_engine_latency.svg", "curve_ssd_depth.svg"):
        assert (merged / f).read_bytes() == (run1 / f).read_bytes()


def test_metaserver_curve_runs_points_in_order_and_records_the_stop(tmp_path):
    """run_meta_curve against a stand-in bench/metaserver: points in order per store, the
    next point refused on memory (its estimate from the last point's bytes per key), a
    failing run recorded as the stop, never a crash."""
    bindir = tmp_path / "bin"
    (bindir / "bench").mkdir(parents=True)
    fake = bindir / "bench" / "metaserver"
    fake.write_text("""#!/usr/bin/env python3
import json, sys
a = dict(zip(sys.argv[1::2], sys.argv[2::2]))
keys = int(a["--keys"])
if a["--store"] == "redis" and keys > 1000:
    sys.exit(1)
doc = {"keys": keys, "rpc": {"rss_bytes_per_key": 10.0 ** 6, "query_per_s": 5000.0},
       "store": {"query_per_s": 90000.0, "store_bytes_per_key": 60.0}}
if a["--store"] == "redis":
    doc["redis"] = {"redis_rss_bytes_per_key": 250.0, "store_query_per_s": 2000.0,
                    "rpc_query_per_s": 1500.0, "metaserver_rss_bytes_per_key": 80.0}
json.dump(doc, open(a["--json"], "w"))
""")
    fake.chmod(0o755)
    out = tmp_path / "out"
    out.mkdir()
    p = {"meta_memory": [1000, 10 ** 7, 10 ** 8], "meta_redis": [1000, 3000, 10 ** 4],
         "meta_memory_budget": 600, "meta_redis_budget": 600, "meta_query_secs": "0.1"}
    # the stand-in is a plain python3: not under the sanitizer runtime tests/run.sh preloads
    # for libpegaflow (a TSan-preloaded interpreter exits on its own races)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    m = curves.run_meta_curve(str(bindir), str(out), env, p)
    assert [x["keys"] for x in m["memory"]] == [1000], m["stopped"]
    assert m["memory"][0]["bytes_per_key"] == 10.0 ** 6
    assert m["stopped"]["memory"].startswith("stopped at 10^7 keys: memory:")
    assert [x["keys"] for x in m["redis"]] == [1000]
    assert m["redis"][0] == {"keys": 1000, "bytes_per_key": 250.0, "store_query_per_s": 2000.0,
                             "rpc_query_per_s": 1500.0}
    assert m["stopped"]["redis"].startswith("stopped at 3x10^3 keys: exit 1")
