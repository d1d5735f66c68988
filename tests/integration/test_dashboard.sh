#!/usr/bin/env bash
# examples/metrics: every metric the Grafana dashboard queries is one pegaflow-server
# exposes (a server with the SSD tier and P2P enabled, so every family is registered), the
# dashboard covers pool, cache tiers, SSD, P2P, leases, RPC latency and HLL reuse, and the
# Prometheus config scrapes /metrics on the servers' default HTTP ports (read from --help).
# The checker itself must reject a dashboard that queries a metric nobody exposes.
. "${PF_TOP:?PF_TOP must name the repository (make test sets it)}/tests/integration/proc.sh" || exit 1
ex="$PF_TOP/examples/metrics"
check="$PF_TOP/tests/integration/dashboard_check.py"
tmp=$(mktemp -d)
trap 'cleanup_procs; rm -rf "$tmp"' EXIT
. "$PF_TOP/tests/integration/lib.sh"
pf_cluster_token "$tmp" || fail "cannot write the cluster token" # P2P needs one (docs/security.md)

start_proc meta pegaflow-metaserver --addr 127.0.0.1:0 --http-addr 127.0.0.1:0
start_proc srv pegaflow-server --gpu-backend sim --pool-size 64mb --addr 127.0.0.2:0 \
  --http-addr 127.0.0.1:0 --net-backend tcp --nics 127.0.0.2 \
  --metaserver-addr "http://127.0.0.1:$meta_GRPC" --cluster-token-file "$PF_CLUSTER_TOKEN_FILE" \
  --ssd-cache-path "$tmp/ssd.dat" --ssd-cache-capacity 64mb
"$PF_BIN/pegaflow-cli" --addr "127.0.0.2:$srv_GRPC" health >/dev/null || fail "Health"
curl -fsS "http://127.0.0.1:$srv_HTTP/metrics" >"$tmp/metrics.txt" || fail "GET /metrics"

port_of() { "$PF_BIN/$1" --help | grep -- '--http-addr' | grep -o 'default: [^)]*' | grep -o '[0-9]*$'; }
sport=$(port_of pegaflow-server) mport=$(port_of pegaflow-metaserver)
[ -n "$sport" ] && [ -n "$mport" ] || fail "no --http-addr default in --help"
/usr/bin/python3 "$check" "$ex/grafana-pegaflow.json" "$tmp/metrics.txt" "$ex/prometheus.yml" "$sport" "$mport" ||
  fail "examples/metrics does not match what the server exposes"

# the checker is not vacuous: an unknown metric, a missing area, a wrong port are refused
/usr/bin/python3 - "$ex/grafana-pegaflow.json" "$tmp/bad.json" <<'P'
import json, sys
d = json.load(open(sys.argv[1]))
d["panels"].append({"title": "bogus", "targets": [{"expr": "rate(pegaflow_no_such_metric_total[5m])"}]})
json.dump(d, open(sys.argv[2], "w"))
P
out=$(/usr/bin/python3 "$check" "$tmp/bad.json" "$tmp/metrics.txt" 2>&1) && fail "checker accepted pegaflow_no_such_metric_total"
echo "$out" | grep -q "pegaflow_no_such_metric_total, which the server does not expose" || fail "checker said: $out"
echo '{"panels": [{"title": "pool", "targets": [{"expr": "pegaflow_pool_used_bytes"}]}]}' >"$tmp/small.json"
out=$(/usr/bin/python3 "$check" "$tmp/small.json" "$tmp/metrics.txt" 2>&1) && fail "checker accepted a dashboard without SSD/P2P panels"
echo "$out" | grep -q "no panel for SSD" || fail "checker said: $out"
out=$(/usr/bin/python3 "$check" "$ex/grafana-pegaflow.json" "$tmp/metrics.txt" "$ex/prometheus.yml" 1234 "$mport" 2>&1) &&
  fail "checker accepted targets on the wrong port"
echo "examples/metrics dashboard and scrape config match the server"
