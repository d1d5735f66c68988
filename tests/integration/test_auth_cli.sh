#!/usr/bin/env bash
# Security flags as processes (docs/security.md): every bad security flag exits 2 with one
# line naming it (both binaries); one start-up warning per listener reachable from the
# network without authentication, none on loopback or when authenticated; --local-rpcs
# resolution; the Unix-socket --local-addr serves libpegaflow (pegaflow-cli); TLS on
# loopback: libpegaflow needs PEGAFLOW_TLS_CA (and a client certificate under mutual TLS);
# the admin token on the HTTP POST endpoints. The network-wide checks are in test_auth.sh.
. "${PF_TOP:?PF_TOP must name the repository (make test sets it)}/tests/integration/proc.sh" || exit 1
. "$PF_TOP/tests/integration/certs.sh"
pki="$LOGDIR/pki"
make_certs "$pki" lo=127.0.0.1 || fail "cannot make the test PKI"
S=(--gpu-backend sim --pool-size 32mb --sim-gpus 1)
L=(--addr 127.0.0.1:0 --http-addr 127.0.0.1:0)

bad() { # binary expected-substring args...
  local bin=$1 want=$2; shift 2
  local out rc
  out=$("$PF_BIN/$bin" "$@" 2>&1); rc=$?
  [ $rc -eq 2 ] || fail "$bin '$*' exited $rc (want 2): $out"
  [ "$(echo "$out" | wc -l)" -eq 1 ] || fail "$bin '$*' printed more than one line: $out"
  echo "$out" | grep -q -- "$want" || fail "$bin '$*' said '$out', want '$want'"
}
printf '\n' >"$pki/empty-token"
for bin in pegaflow-server pegaflow-metaserver; do
  bad $bin "--tls-cert: TLS needs --tls-cert and --tls-key together" --tls-cert "$pki/lo.crt"
  bad $bin "--tls-key: TLS needs --tls-cert and --tls-key together" --tls-key "$pki/lo.key"
  bad $bin "--tls-ca: needs --tls-cert and --tls-key" --tls-ca "$pki/ca.crt"
  bad $bin "--tls-cert: cannot open /nonexistent.crt" --tls-cert /nonexistent.crt --tls-key "$pki/lo.key"
  bad $bin "--tls-key: $pki/lo.crt holds no PRIVATE KEY" --tls-cert "$pki/lo.crt" --tls-key "$pki/lo.crt"
  bad $bin "--tls-cert: $pki/token is not a PEM file" --tls-cert "$pki/token" --tls-key "$pki/lo.key"
  bad $bin "--cluster-token-file: $pki/empty-token is empty" --cluster-token-file "$pki/empty-token"
  bad $bin "--cluster-token-file: cannot open /nonexistent" --cluster-token-file /nonexistent
done
bad pegaflow-server "--admin-token-file: cannot open /nonexistent" --admin-token-file /nonexistent
bad pegaflow-server "--local-addr: '127.0.0.1:1' is not unix:PATH" --local-addr 127.0.0.1:1
bad pegaflow-server "--local-rpcs: 'some' is not auto, host or any" --local-rpcs some

# warnings: one per open listener reachable from other hosts. 0.0.0.0 only inside a private
# network namespace (nothing else can reach it) when we may make one.
NS=()
if [ "$(id -u)" = 0 ] && unshare --net true 2>/dev/null; then NS=(unshare --net); fi
warns() { # log -> number of "reachable from the network without authentication" lines
  grep -c 'reachable from the network without authentication' "$1"
}
run_until_ready() { # name binary args...: starts, waits for ready, stops
  local name=$1 bin=$2; shift 2
  local log="$LOGDIR/$name.log"
  rm -f "$log" # an earlier run's "ready" must not count (see start_proc)
  "${NS[@]}" "$PF_BIN/$bin" "$@" >"$log" 2>&1 &
  local pid=$! deadline=$((SECONDS + 20))
  PF_PIDS+=("$pid")
  until grep -q ': ready$' "$log" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; fail "$name exited during start-up"; }
    [ $SECONDS -lt $deadline ] || fail "$name not ready"
    sleep 0.05
  done
  kill -TERM "$pid"
  wait_exit "$pid" 15
  [ "$EXIT_RC" = 0 ] || fail "$name exit $EXIT_RC"
}
W=(--addr 0.0.0.0:0 --http-addr 0.0.0.0:0)
run_until_ready open pegaflow-server "${S[@]}" "${W[@]}"
[ "$(warns "$LOGDIR/open.log")" = 1 ] || fail "open server: want 1 warning: $(cat "$LOGDIR/open.log")"
grep -q 'WARN .*gRPC on 0.0.0.0:0 is reachable' "$LOGDIR/open.log" || fail "no gRPC warning"
# HTTP POST is local-only without an admin token (protected by default): said, not warned
grep -q 'INFO .*HTTP POST .*callers on this host only' "$LOGDIR/open.log" || fail "no HTTP POST line"
# protected by default: auto keeps the worker RPCs on this host even with nothing configured
grep -q 'worker RPCs from this host (or the cluster token)' "$LOGDIR/open.log" ||
  fail "--local-rpcs auto without security"
run_until_ready lo pegaflow-server "${S[@]}" "${L[@]}"
[ "$(warns "$LOGDIR/lo.log")" = 0 ] || fail "loopback server warned"
run_until_ready tok pegaflow-server "${S[@]}" "${W[@]}" --cluster-token-file "$pki/token" \
  --admin-token-file "$pki/admin-token"
[ "$(warns "$LOGDIR/tok.log")" = 0 ] || fail "authenticated server warned: $(cat "$LOGDIR/tok.log")"
grep -q 'worker RPCs from this host (or the cluster token)' "$LOGDIR/tok.log" ||
  fail "--local-rpcs auto with a token"
run_until_ready any pegaflow-server "${S[@]}" "${L[@]}" --cluster-token-file "$pki/token" \
  --local-rpcs any
grep -q 'worker RPCs from anyone' "$LOGDIR/any.log" || fail "--local-rpcs any"
grep -q 'WARN .*--local-rpcs any' "$LOGDIR/any.log" && fail "--local-rpcs any on loopback warned"
run_until_ready anyw pegaflow-server "${S[@]}" "${W[@]}" --cluster-token-file "$pki/token" \
  --admin-token-file "$pki/admin-token" --local-rpcs any
grep -q 'WARN .*--local-rpcs any: the worker RPCs .* answer every caller that reaches it, with or without the cluster token' \
  "$LOGDIR/anyw.log" || fail "--local-rpcs any with a token on a reachable address: no warning"
run_until_ready tlsonly pegaflow-server "${S[@]}" "${W[@]}" --tls-cert "$pki/lo.crt" \
  --tls-key "$pki/lo.key" --admin-token-file "$pki/admin-token"
[ "$(warns "$LOGDIR/tlsonly.log")" = 1 ] || fail "TLS without a CA authenticates nobody: want 1 warning"
# a reachable MetaServer without a token refuses to start; --insecure-cluster opens it, warned
bad pegaflow-metaserver "needs a cluster token" "${W[@]}"
run_until_ready mopen pegaflow-metaserver "${W[@]}" --insecure-cluster
[ "$(warns "$LOGDIR/mopen.log")" = 1 ] || fail "open MetaServer: want 1 warning"
grep -q 'WARN .*--insecure-cluster: this MetaServer' "$LOGDIR/mopen.log" || fail "no --insecure-cluster warning"
run_until_ready mtls pegaflow-metaserver "${W[@]}" --tls-cert "$pki/lo.crt" --tls-key "$pki/lo.key" \
  --tls-ca "$pki/ca.crt"
[ "$(warns "$LOGDIR/mtls.log")" = 0 ] || fail "mutual-TLS MetaServer warned"

# the Unix socket listener, with TLS and a token on the TCP one
sock="$LOGDIR/pf.sock"
start_proc tls pegaflow-server "${S[@]}" "${L[@]}" --tls-cert "$pki/lo.crt" --tls-key "$pki/lo.key" \
  --tls-ca "$pki/ca.crt" --cluster-token-file "$pki/token" --admin-token-file "$pki/admin-token" \
  --local-addr "unix:$sock"
grep -q "gRPC local listener on unix:$sock" "$LOGDIR/tls.log" || fail "no local listener log"
grep -q "mutual TLS" "$LOGDIR/tls.log" || fail "no mutual TLS log"
out=$("$PF_BIN/pegaflow-cli" --addr "unix:$sock" health 2>&1) || fail "health over the unix socket: $out"
[ "$out" = ok ] || fail "health over the unix socket said '$out'"
cli() { "$PF_BIN/pegaflow-cli" --timeout-ms 3000 --addr "127.0.0.1:$tls_GRPC" "$@" 2>&1; }
out=$(cli health) && fail "plaintext health on a TLS port succeeded"
out=$(PEGAFLOW_TLS_CA="$pki/ca.crt" cli health) && fail "health without a client certificate succeeded"
out=$(PEGAFLOW_TLS_CA="$pki/ca.crt" PEGAFLOW_TLS_CERT="$pki/rogue.crt" PEGAFLOW_TLS_KEY="$pki/rogue.key" \
  cli health) && fail "health with another CA's certificate succeeded"
# the call that must succeed gets a long deadline: a TLS handshake under TSan on a loaded
# 2-core VM took more than 3 s (the refusals above fail fast or at their deadline)
out=$(PEGAFLOW_TLS_CA="$pki/ca.crt" PEGAFLOW_TLS_CERT="$pki/lo.crt" PEGAFLOW_TLS_KEY="$pki/lo.key" \
  "$PF_BIN/pegaflow-cli" --timeout-ms 30000 --addr "127.0.0.1:$tls_GRPC" health 2>&1) ||
  fail "mutual-TLS health: $out"
[ "$out" = ok ] || fail "mutual-TLS health said '$out'"
out=$(PEGAFLOW_TLS_CA=/nonexistent.pem cli health); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "PEGAFLOW_TLS_CA: cannot open /nonexistent.pem" ||
  fail "unreadable PEGAFLOW_TLS_CA: rc=$rc $out"
out=$(PEGAFLOW_TOKEN_FILE="$pki/empty-token" "$PF_BIN/pegaflow-cli" --addr "unix:$sock" health 2>&1) &&
  fail "an empty PEGAFLOW_TOKEN_FILE was accepted"
# the wrong token is refused even on the Unix socket
out=$(PEGAFLOW_TOKEN_FILE="$pki/wrong-token" "$PF_BIN/pegaflow-cli" --addr "unix:$sock" health 2>&1) &&
  fail "a wrong token was accepted: $out"
echo "$out" | grep -q "wrong cluster token" || fail "wrong token: $out"
# HTTP: POST needs the admin token, GET does not
h="http://127.0.0.1:$tls_HTTP"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST "$h/cache/memory/cleanup")
[ "$code" = 401 ] || fail "POST without token -> $code"
curl -s -D - -o /dev/null -X POST "$h/instances/cleanup" | grep -qi '^WWW-Authenticate: Bearer' ||
  fail "401 without WWW-Authenticate: Bearer"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $(cat "$pki/wrong-token")" "$h/cache/memory/cleanup")
[ "$code" = 401 ] || fail "POST with a wrong token -> $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Basic $(cat "$pki/admin-token")" "$h/cache/memory/cleanup")
[ "$code" = 401 ] || fail "POST with another scheme -> $code"
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "Authorization: Bearer $(cat "$pki/admin-token")" "$h/cache/memory/cleanup")
[ "$code" = 200 ] || fail "POST with the admin token -> $code"
for p in /health /metrics /instances; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$h$p")
  [ "$code" = 200 ] || fail "GET $p -> $code"
done
# method classes over loopback (a local caller) on the mutual-TLS node, with auth_tool
T="$PF_TESTBIN/auth_tool"
K=(--ca "$pki/ca.crt" --cert "$pki/lo.crt" --key "$pki/lo.key")
at() { "$T" "$@" --timeout-ms 30000 2>/dev/null | cut -d' ' -f1; }
[ "$(at "127.0.0.1:$tls_GRPC" Health "${K[@]}")" = OK ] || fail "Health without the token"
[ "$(at "127.0.0.1:$tls_GRPC" Session "${K[@]}")" = OK ] || fail "Session from loopback without the token"
[ "$(at "127.0.0.1:$tls_GRPC" RdmaHandshake "${K[@]}")" = UNAUTHENTICATED ] ||
  fail "RdmaHandshake without the token"
[ "$(at "127.0.0.1:$tls_GRPC" QueryBlocksForTransfer "${K[@]}")" = UNAUTHENTICATED ] ||
  fail "QueryBlocksForTransfer without the token"
[ "$(at "127.0.0.1:$tls_GRPC" QueryBlocksForTransfer "${K[@]}" --token "$(cat "$pki/token")")" = FAILED_PRECONDITION ] ||
  fail "QueryBlocksForTransfer with the token (no --nics: FAILED_PRECONDITION)"
# the MetaServer: mutual TLS and the token, every wrong credential refused
start_proc ms pegaflow-metaserver "${L[@]}" --tls-cert "$pki/lo.crt" --tls-key "$pki/lo.key" \
  --tls-ca "$pki/ca.crt" --cluster-token-file "$pki/token"
M="127.0.0.1:$ms_GRPC"
tok=$(cat "$pki/token")
[ "$(at "$M" meta.QueryPrefixBlocks "${K[@]}" --token "$tok")" = INVALID_ARGUMENT ] ||
  fail "MetaServer with mTLS + token: want the handler's INVALID_ARGUMENT (no hashes)"
[ "$(at "$M" meta.QueryPrefixBlocks "${K[@]}")" = UNAUTHENTICATED ] || fail "MetaServer, no token"
[ "$(at "$M" meta.HeartbeatNode "${K[@]}" --token "$(cat "$pki/wrong-token")")" = UNAUTHENTICATED ] ||
  fail "MetaServer, wrong token"
[ "$(at "$M" meta.QueryPrefixBlocks --ca "$pki/ca.crt" --cert "$pki/rogue.crt" --key "$pki/rogue.key" --token "$tok")" = UNAVAILABLE ] ||
  fail "MetaServer, certificate of another CA"
[ "$(at "$M" meta.QueryPrefixBlocks --ca "$pki/ca.crt" --token "$tok")" = UNAVAILABLE ] ||
  fail "MetaServer, no client certificate"
[ "$(at "$M" meta.QueryPrefixBlocks --token "$tok")" = UNAVAILABLE ] || fail "MetaServer, plaintext"
[ "$(at "$M" meta.QueryPrefixBlocks --ca "$pki/rogue-ca.crt" --cert "$pki/lo.crt" --key "$pki/lo.key" --token "$tok")" = UNAVAILABLE ] ||
  fail "a MetaServer certificate from another CA was trusted"
kill -TERM "$ms_PID"
wait_exit "$ms_PID" 15
[ "$EXIT_RC" = 0 ] || fail "MetaServer exit $EXIT_RC"

# Shutdown over the Unix socket (a local caller) works
"$PF_BIN/pegaflow-cli" --addr "unix:$sock" shutdown >/dev/null || fail "Shutdown over the unix socket"
wait_exit "$tls_PID" 15
[ "$EXIT_RC" = 0 ] || fail "exit after Shutdown: $EXIT_RC"
echo "auth cli: all checks passed"
