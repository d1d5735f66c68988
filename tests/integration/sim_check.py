"""Checks a pegaflow-sim JSON report and that the run left nothing behind
(used by test_sim.sh and test_sim_unprivileged.sh).

Usage: sim_check.py REPORT.json [PLOT.svg] [--want-events kill,restart] [--want-remote]
                    [--min-efficiency X]

--min-efficiency: total.efficiency (delivered / available, docs/simulation.md "Efficiency")
must be at least X; with --want-events restart every restarted node must have had a hit
(restart_to_hit_s not null; its value is printed, not asserted) and, with --ssd on, must
have recovered blocks from its SSD file (restart_ssd.recovered_blocks > 0; what its SSD
delivered since is printed)."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
from pegaflow.sim import cluster  # noqa: E402

args = sys.argv[1:]
want_events = []
want_remote = "--want-remote" in args
if "--want-events" in args:
    want_events = args[args.index("--want-events") + 1].split(",")
min_eff = None
if "--min-efficiency" in args:
    min_eff = float(args[args.index("--min-efficiency") + 1])
files = [a for a in args if not a.startswith("--") and a not in ",".join(want_events)
         and (min_eff is None or a != args[args.index("--min-efficiency") + 1])]
doc = json.load(open(files[0]))
fails = []
t = doc["total"]
for k in ("requested", "ram", "ssd", "remote", "miss", "integrity_failures", "bytes_mismatched"):
    if k not in t:
        fails.append(f"total lacks {k}")
if t["ram"] + t["ssd"] + t["remote"] + t["miss"] != t["requested"]:
    fails.append(f"ram {t['ram']} + ssd {t['ssd']} + remote {t['remote']} + miss {t['miss']} "
                 f"!= requested {t['requested']}")
for r in doc["nodes"]:
    if r["ram"] + r["ssd"] + r["remote"] + r["miss"] != r["requested"]:
        fails.append(f"{r['node']}: tiers do not add up to requested {r['requested']}")
if t["requested"] <= 0:
    fails.append("no blocks requested")
if want_remote and t["remote"] <= 0:
    fails.append("no remote (P2P) hits")
if want_remote and t["verified_blocks"] <= 0:
    fails.append("no loaded block was verified")
if t["integrity_failures"] or t["bytes_mismatched"]:
    fails.append(f"integrity failures {t['integrity_failures']}, "
                 f"bytes mismatched {t['bytes_mismatched']}")
if t["requests"] != sum(r["requests"] for r in doc["nodes"]):
    fails.append("request counts do not add up")
for k in ("available", "delivered", "efficiency", "loading_then_nothing"):
    if k not in t:
        fails.append(f"total lacks {k}")
for k in ("load_wait_ms", "restart_to_hit_s"):
    if k not in doc:
        fails.append(f"report lacks {k}")
if t.get("delivered") != t.get("verified_blocks"):
    fails.append(f"delivered {t.get('delivered')} != loaded {t.get('verified_blocks')}")
if min_eff is not None and (t.get("efficiency") is None or t["efficiency"] < min_eff):
    fails.append(f"efficiency {t.get('efficiency')} below {min_eff} (available "
                 f"{t.get('available')}, delivered {t.get('delivered')})")
got = [e["what"].split()[0] for e in doc["events"]]
if "restart" in want_events:
    restarted = {e["what"].split()[1] for e in doc["events"] if e["what"].startswith("restart n")}
    for n in sorted(restarted):
        if doc.get("restart_to_hit_s", {}).get(n) is None:
            fails.append(f"restarted {n} had no hit after its ready")
        # issue 25: with SSD on, the restarted server recovers its previous life's records
        rs = doc.get("restart_ssd", {}).get(n)
        if doc.get("ssd") == "on" and (not rs or rs["recovered_blocks"] <= 0):
            fails.append(f"restarted {n} recovered nothing from its SSD file: {rs}")
for w in want_events:
    if w not in got:
        fails.append(f"event {w} not in {doc['events']}")
if len(files) > 1:
    root = ET.parse(files[1]).getroot()
    if not root.tag.endswith("svg") or not root.findall(".//{http://www.w3.org/2000/svg}polyline"):
        fails.append(f"{files[1]}: not an SVG with plotted lines")
# nothing left behind
if os.path.exists(doc["tmpdir"]):
    fails.append(f"temporary directory {doc['tmpdir']} still exists")
if doc.get("ssd_dir") and os.path.exists(doc["ssd_dir"]):
    fails.append(f"SSD directory {doc['ssd_dir']} still exists")
if os.path.exists(doc["state_file"]):
    fails.append(f"state file {doc['state_file']} still exists")
elif os.path.exists(os.path.dirname(doc["state_file"])):
    fails.append(f"state directory {os.path.dirname(doc['state_file'])} still exists")
pids = [doc["pids"]["metaserver"], *doc["pids"]["servers"], *doc["pids"]["nodes"]]
for pid in pids:
    if pid and os.path.exists(f"/proc/{pid}"):
        try:
            st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            st = "?"
        if st != "Z":
            fails.append(f"process {pid} still runs")
left = cluster.owned_shm(doc["shm_owners"])
if left:
    fails.append(f"shared memory left: {left}")
if doc["namespaces"] or doc["mode"] == "netns":
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [l.split()[0] for l in out.splitlines() if l.startswith("pfsim-")]
    if left:
        fails.append(f"namespaces left: {left}")
print(f"sim_check: mode {doc['mode']}, {t['requests']} requests, requested {t['requested']} "
      f"= ram {t['ram']} + ssd {t['ssd']} + remote {t['remote']} + miss {t['miss']}; "
      f"{t['verified_blocks']} loaded blocks verified, integrity failures "
      f"{t['integrity_failures']}; events {got}; efficiency {t.get('efficiency')} "
      f"(available {t.get('available')}, delivered {t.get('delivered')}); load wait ms "
      f"{doc.get('load_wait_ms')}; restart to first hit s {doc.get('restart_to_hit_s')}; "
      f"restart SSD {doc.get('restart_ssd')}")
for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
