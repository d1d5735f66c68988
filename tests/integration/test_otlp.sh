#!/usr/bin/env bash
# OTLP metrics export in the three protocols, each to a small collector in Python
# (otlp_receiver.py: grpcio for gRPC, http.server for HTTP) that decodes what arrives by the
# published OTLP field numbers. A scripted workload (a seeded number of Health RPCs, then
# SIGTERM, whose final flush is the export checked) must arrive with its values:
#   grpc           the default (no flag, no OTEL_* variable), MetricsService/Export
#   http/protobuf  --metrics-otel-protocol (overriding OTEL_EXPORTER_OTLP_PROTOCOL), POST
#                  <base>/v1/metrics as application/x-protobuf
#   http/json      OTEL_EXPORTER_OTLP_PROTOCOL=http/json, POST /v1/metrics as application/json
# A node with TLS and a cluster token exports plaintext without the token. Unknown protocols
# (flag, or variable when exporting) are refused at start-up naming the source.
. "${PF_TOP:?PF_TOP must name the repository (make test sets it)}/tests/integration/lib.sh" || exit 1
set -u
pf_tmpdir
py=/usr/bin/python3
recv="$PF_TOP/tests/integration/otlp_receiver.py"
"$py" -c 'import grpc' 2>/dev/null || pf_fail "python3-grpcio is missing (ci/install-deps.sh installs it)"
seed=${PF_TEST_SEED:-$(date +%s)}
echo "seed $seed"
RANDOM=$seed

run_case() { # name receiver-mode base-path env-assignment|- flags...
  local name=$1 mode=$2 base=$3 envset=$4; shift 4
  local out="$PF_TMP/$name.jsonl" n=$((3 + RANDOM % 7)) port g i
  pf_start "recv_$name" "$py" "$recv" "$mode" "$out"
  pf_wait_log "recv_$name" 'listening on port [0-9]+' || pf_fail "$name: receiver did not start"
  port=$(grep -oE 'listening on port [0-9]+' "$PF_TMP/recv_$name.log" | grep -oE '[0-9]+$')
  local envargs=(-u OTEL_EXPORTER_OTLP_PROTOCOL -u OTEL_EXPORTER_OTLP_METRICS_PROTOCOL)
  [ "$envset" = - ] || envargs+=("$envset")
  pf_start "srv_$name" env "${envargs[@]}" "$PF_BIN/pegaflow-server" --gpu-backend sim \
    --pool-size 64mb --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
    --metrics-otel-endpoint "http://127.0.0.1:$port$base" --metrics-period-secs 3600 "$@"
  g=$(pf_wait_port "srv_$name" grpc) || pf_fail "$name: server did not start"
  for ((i = 0; i < n; i++)); do
    "$PF_BIN/pegaflow-cli" --addr "127.0.0.1:$g" health >/dev/null || pf_fail "$name: Health"
  done
  pf_stop "srv_$name" TERM || pf_fail "$name: server exit status after SIGTERM"
  pf_stop "recv_$name" KILL >/dev/null 2>&1
  echo "$name: $n Health call(s), $(wc -l <"$out" 2>/dev/null || echo 0) export(s) received"
  "$py" - "$out" "$n" "$mode" "$name" "$base" <<'P' || pf_fail "$name: the export does not carry the workload"
import json, sys
path, n, mode, name, base = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
lines = open(path).read().splitlines()
assert lines, "nothing arrived"
e = json.loads(lines[-1])  # the final flush at SIGTERM
want_ct = {"grpc": "application/grpc", "protobuf": "application/x-protobuf", "json": "application/json"}[name]
assert e["content_type"].startswith(want_ct), e["content_type"]
if mode == "grpc":
    assert e["path"] == "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export", e["path"]
else:
    assert e["path"] == base + "/v1/metrics", e["path"]
assert e["service"] == "pegaflow-server", e["service"]
assert not e.get("cluster_token"), "the cluster token was sent to the collector"
m = e["metrics"]
req = m["pegaflow_rpc_requests_total"]
assert req["kind"] == "sum" and req.get("monotonic") is True and req.get("temporality") == 2, req
pts = [p for p in req["points"] if p["attrs"] == {"method": "health", "status": "ok"}]
assert len(pts) == 1 and pts[0]["value"] == n, (pts, n)
dur = m["pegaflow_rpc_duration_seconds"]
assert dur["kind"] == "histogram" and dur.get("temporality") == 2, dur
hp = [p for p in dur["points"] if p["attrs"].get("method") == "health"]
assert len(hp) == 1, hp
hp = hp[0]
assert hp["count"] == n and sum(hp["bucket_counts"]) == n, hp
assert len(hp["bucket_counts"]) == len(hp["explicit_bounds"]) + 1, hp
assert hp["explicit_bounds"] == [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0], hp
assert 0 < hp["sum"] < 2.0 * n, hp
cap = m["pegaflow_pool_capacity_bytes"]
assert cap["kind"] == "gauge" and cap["points"][0]["value"] == 64 * 2**20, cap
assert m["pegaflow_leases_active"]["points"][0]["value"] == 0
print(f"ok: {name}: {len(m)} metrics, rpc_requests health={n}, duration count={hp['count']}")
P
}

run_case grpc grpc "" -
grep -q 'exporting metrics over OTLP/gRPC' "$PF_TMP/srv_grpc.log" || pf_fail "grpc is not the default"
# a node with TLS and a cluster token still exports plaintext, without the token: the
# collector is not a cluster member (docs/security.md)
. "$PF_TOP/tests/integration/certs.sh"
make_certs "$PF_TMP/pki" lo=127.0.0.1 || pf_fail "cannot make the test PKI"
PEGAFLOW_TLS_CA="$PF_TMP/pki/ca.crt" run_case grpc grpc "" - --tls-cert "$PF_TMP/pki/lo.crt" \
  --tls-key "$PF_TMP/pki/lo.key" --cluster-token-file "$PF_TMP/pki/token"
run_case protobuf http /otel OTEL_EXPORTER_OTLP_PROTOCOL=http/json --metrics-otel-protocol http/protobuf
run_case json http "" OTEL_EXPORTER_OTLP_PROTOCOL=http/json

# refusals name where the protocol came from
out=$("$PF_BIN/pegaflow-server" --metrics-otel-endpoint http://127.0.0.1:1 --metrics-otel-protocol http 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--metrics-otel-protocol: unknown OTLP protocol 'http'" <<<"$out" || pf_fail "bad flag: $rc $out"
out=$(OTEL_EXPORTER_OTLP_PROTOCOL=thrift "$PF_BIN/pegaflow-server" --metrics-otel-endpoint http://127.0.0.1:1 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "OTEL_EXPORTER_OTLP_PROTOCOL: unknown OTLP protocol 'thrift'" <<<"$out" || pf_fail "bad env: $rc $out"
out=$("$PF_BIN/pegaflow-server" --metrics-otel-endpoint https://127.0.0.1:1 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "TLS is not supported with OTLP/gRPC" <<<"$out" &&
  grep -q -- "--metrics-otel-protocol http/protobuf" <<<"$out" || pf_fail "https with grpc: $rc $out"
echo PASS
