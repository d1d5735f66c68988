#!/usr/bin/env bash
# pegaflow-server and pegaflow-metaserver as processes: Health over gRPC (libpegaflow via
# pegaflow-cli), /health over HTTP, Shutdown/SIGINT/SIGTERM exit 0, every bad flag exits 2
# with one line naming the flag, --help lists every documented flag, busy ports fail.
. "${PF_TOP:?PF_TOP must name the repository (make test sets it)}/tests/integration/proc.sh" || exit 1
S=(--gpu-backend sim --pool-size 64mb --addr 127.0.0.1:0 --http-addr 127.0.0.1:0)

start_proc srv pegaflow-server "${S[@]}"
out=$("$PF_BIN/pegaflow-cli" --addr "127.0.0.1:$srv_GRPC" health) || fail "Health failed: $out"
[ "$out" = ok ] || fail "Health said '$out'"
body=$(curl -fsS "http://127.0.0.1:$srv_HTTP/health") || fail "curl /health"
[ "$body" = ok ] || fail "/health body '$body'"
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "http://127.0.0.1:$srv_HTTP/health")
[ "$code" = 405 ] || fail "DELETE /health -> $code"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$srv_HTTP/nope")
[ "$code" = 404 ] || fail "GET /nope -> $code"
curl -fsS "http://127.0.0.1:$srv_HTTP/metrics" | grep -q '^pegaflow_rpc_requests_total{method="health",status="ok"} 1$' ||
  fail "/metrics does not count the Health call"
# a second server on the same port is an error, not a silent SO_REUSEPORT share
out=$("$PF_BIN/pegaflow-server" --gpu-backend sim --pool-size 16mb --addr "127.0.0.1:$srv_GRPC" \
  --http-addr 127.0.0.1:0 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q -- "--addr: cannot bind 127.0.0.1:$srv_GRPC" ||
  fail "busy gRPC port: rc=$rc out=$out"
# every metric family the server exposes is documented in docs/metrics.md
for m in $(curl -fsS "http://127.0.0.1:$srv_HTTP/metrics" | awk '/^# TYPE/ {print $3}'); do
  grep -q -- "\`$m\`" "$PF_TOP/docs/metrics.md" || fail "metric $m is not documented in docs/metrics.md"
done
"$PF_BIN/pegaflow-cli" --addr "127.0.0.1:$srv_GRPC" shutdown >/dev/null || fail "Shutdown RPC"
wait_exit "$srv_PID" 15
rc=$EXIT_RC
[ "$rc" = 0 ] || fail "exit after Shutdown RPC: $rc"
grep -q 'Shutdown requested over gRPC' "$LOGDIR/srv.log" || fail "no shutdown log line"

for sig in INT TERM; do
  start_proc sig pegaflow-server "${S[@]}"
  kill -"$sig" "$sig_PID"
  wait_exit "$sig_PID" 15
  rc=$EXIT_RC
  [ "$rc" = 0 ] || fail "exit after SIG$sig: $rc"
done

# Health on a dead server: UNAVAILABLE, quickly, no hang
out=$("$PF_BIN/pegaflow-cli" --timeout-ms 3000 --addr 127.0.0.1:1 health 2>&1) && fail "health on port 1 succeeded"
echo "$out" | grep -q '(14)' || fail "dead server: $out"
out=$("$PF_BIN/pegaflow-cli" --timeout-ms abc health 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q "needs a positive number" || fail "cli --timeout-ms abc: $rc $out"

bad() { # expected-substring args...
  local want=$1; shift
  local out rc
  out=$("$PF_BIN/pegaflow-server" "$@" 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "'$*' exited $rc (want 2): $out"
  [ "$(echo "$out" | wc -l)" -eq 1 ] || fail "'$*' printed more than one line: $out"
  echo "$out" | grep -q -- "$want" || fail "'$*' said '$out', want '$want'"
}
bad "--pool-size: invalid size '12xb'" --pool-size 12xb
bad "--addr: 'nohost' is not host:port" --addr nohost
bad "--addr: cannot resolve host" --addr no-such-host.invalid:1
bad "--log-level: unknown log level 'loud'" --log-level loud
bad "--bogus: unknown flag" --bogus
bad "--devices: 'x'" --devices x
bad "--nics without --metaserver-addr: P2P needs --nics and --metaserver-addr together" --nics eth0
bad "--metaserver-addr without --nics: P2P needs" --metaserver-addr http://10.0.0.1:50056
bad "--addr: 127.0.0.1:50055 is not routable" --nics eth0 --metaserver-addr http://127.0.0.1:50056
bad "--fault-spec: fault injection is refused unless --enable-debug" --fault-spec gpu.d2h:error=EIO
bad "--fault-spec: fault spec: unknown op" --enable-debug --fault-spec nope:error=EIO
bad "--gpu-backend: unknown backend 'tpu'" --gpu-backend tpu
bad "--gpu-copy-batch: unknown mode 'maybe' (auto, on, off)" --gpu-copy-batch maybe
bad "--metric-hll-bucket-bits" --metric-hll-bucket-bits 99
bad "--ssd-write-queue-depth" --ssd-write-queue-depth 0
out=$(PEGAFLOW_FAULTS=gpu.d2h:error=EIO "$PF_BIN/pegaflow-server" 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q PEGAFLOW_FAULTS || fail "PEGAFLOW_FAULTS without --enable-debug: $rc $out"

# a pool the machine cannot hold: one clear line naming --pool-size, no crash
out=$("$PF_BIN/pegaflow-server" --gpu-backend sim --pool-size 64tb --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q -- "--pool-size 64tb exceeds the memory available" || fail "huge pool: $rc $out"

# --help documents every flag of seeds/server.md; --version prints the client version
help=$("$PF_BIN/pegaflow-server" --help) || fail "--help exit code"
for f in $(echo "$help" | grep -o -- '^  --[a-z0-9-]*' | tr -d ' '); do
  [ "$f" = --help ] || [ "$f" = --version ] || grep -q -- "\`$f\`" "$PF_TOP/docs/server.md" ||
    fail "flag $f is not documented in docs/server.md"
done
for f in addr devices pool-size hint-value-size use-hugepages enable-lfu-admission \
  disable-numa-affinity blockwise-alloc log-level http-addr enable-prometheus \
  metrics-otel-endpoint metrics-period-secs ssd-cache-path ssd-cache-capacity \
  ssd-write-queue-depth ssd-prefetch-queue-depth ssd-write-inflight ssd-prefetch-inflight \
  max-prefetch-blocks nics metaserver-addr transfer-lock-timeout-secs metaserver-queue-depth \
  gpu-backend gpu-copy-batch net-backend rpc-threads fault-spec enable-debug; do
  echo "$help" | grep -q -- "--$f " || fail "--help does not list --$f"
done
[ "$("$PF_BIN/pegaflow-server" --version)" = "$("$PF_BIN/pegaflow-cli" version)" ] || fail "--version"

# the metaserver: defaults, /health, clean stop, bad flags
start_proc meta pegaflow-metaserver --addr 127.0.0.1:0 --http-addr 127.0.0.1:0
[ "$(curl -fsS "http://127.0.0.1:$meta_HTTP/health")" = ok ] || fail "metaserver /health"
kill -TERM "$meta_PID"
wait_exit "$meta_PID" 15
rc=$EXIT_RC
[ "$rc" = 0 ] || fail "metaserver exit after SIGTERM: $rc"
"$PF_BIN/pegaflow-metaserver" --help | grep -q -- '--ttl-minutes <MINUTES>.*(default: 120)' || fail "metaserver --help"
"$PF_BIN/pegaflow-metaserver" --help | grep -q -- '--addr <HOST:PORT>.*(default: 127.0.0.1:50056)' || fail "metaserver --addr default"
out=$("$PF_BIN/pegaflow-metaserver" --ttl-minutes 0 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--ttl-minutes" || fail "metaserver --ttl-minutes 0: $rc $out"
out=$("$PF_BIN/pegaflow-metaserver" --log-level loud 2>&1); rc=$?
[ $rc -eq 2 ] && echo "$out" | grep -q -- "--log-level" || fail "metaserver bad log level: $rc $out"
echo "server and metaserver CLI behave as documented"
