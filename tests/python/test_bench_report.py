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
    assert "Not measured yet" in md
