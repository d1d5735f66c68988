#!/usr/bin/env python3
"""Checks a Grafana dashboard against a server's Prometheus exposition.

  dashboard_check.py DASHBOARD.json METRICS.txt [PROMETHEUS.yml SERVER_HTTP_PORT META_HTTP_PORT]

Every metric name a query of the dashboard mentions (panel targets, templating queries)
must be a family the server exposes (# TYPE lines) or a histogram's _bucket/_sum/_count
series; the dashboard must cover the pool, cache tiers, SSD, P2P, leases, RPC latency and
HLL reuse. With a Prometheus config: it parses, and scrapes /metrics on the servers' default
HTTP ports. Prints every problem and exits 1 if there is one."""
import json
import re
import sys

NAME = re.compile(r"\bpegaflow_[a-zA-Z0-9_]+")
AREAS = {
    "pool": "pegaflow_pool_used_bytes",
    "cache tiers": "pegaflow_cache_tier_block_requests_total",
    "SSD": "pegaflow_ssd_write_bytes_total",
    "P2P": "pegaflow_rdma_fetch_total",
    "transfer locks": "pegaflow_transfer_lock_active",
    "leases": "pegaflow_leases_active",
    "RPC latency": "pegaflow_rpc_duration_seconds_bucket",
    "HLL reuse": "pegaflow_hll_estimated_hit_rate",
}


def exposed(text):
    names = set()
    for line in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", line)
        if not m:
            continue
        names.add(m.group(1))
        if m.group(2) in ("histogram", "summary"):
            names.update(m.group(1) + s for s in ("_bucket", "_sum", "_count"))
    for line in text.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, 1)[0])
    return names


def queries(dash):
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((p.get("title", "?"), t.get("expr", "")))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if isinstance(q, dict):
            q = q.get("query", "")
        if isinstance(q, str):
            out.append(("variable " + v.get("name", "?"), q))
    return out


def main():
    dash = json.load(open(sys.argv[1]))
    have = exposed(open(sys.argv[2]).read())
    problems = []
    used = set()
    qs = queries(dash)
    if not qs:
        problems.append("the dashboard has no queries")
    for title, expr in qs:
        for n in NAME.findall(expr):
            used.add(n)
            if n not in have:
                problems.append(f"panel '{title}' queries {n}, which the server does not expose")
    for area, metric in AREAS.items():
        if metric not in used:
            problems.append(f"no panel for {area} (e.g. {metric})")
    if len(sys.argv) > 3:
        import yaml

        cfg = yaml.safe_load(open(sys.argv[3]))
        ports = {"pegaflow-server": sys.argv[4], "pegaflow-metaserver": sys.argv[5]}
        jobs = {j["job_name"]: j for j in cfg.get("scrape_configs", [])}
        for job, port in ports.items():
            j = jobs.get(job)
            if not j:
                problems.append(f"prometheus config has no job {job}")
                continue
            if j.get("metrics_path", "/metrics") != "/metrics":
                problems.append(f"job {job} scrapes {j['metrics_path']}, not /metrics")
            targets = [t for sc in j.get("static_configs", []) for t in sc.get("targets", [])]
            if not targets or any(not t.endswith(":" + port) for t in targets):
                problems.append(f"job {job} targets {targets} are not on the default port {port}")
    for p in problems:
        print("dashboard_check:", p)
    print(f"dashboard_check: {len(qs)} queries, {len(used)} metrics, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
