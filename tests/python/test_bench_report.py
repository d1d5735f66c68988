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
