#!/usr/bin/env bash
# MetaServer with real processes: flag validation; malformed requests answered with clear
# errors while it keeps serving; two simulated nodes (meta_node, the real MetaServer client)
# visible through QueryPrefixBlocks with their addresses; a node that stops heartbeating is
# hidden after the stale period and visible again when it resumes; metrics; the MetaServer
# is killed and restarted and the nodes re-register (resync) with no new save; a node that
# stops is unregistered.
# PF_META_STORE=redis (test_metaserver_on_redis.sh): the same scenario with --store redis://
# on a redis-server started here on a free loopback port; a MetaServer restart then loses
# nothing (the entries are visible at once, no resync needed).
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
: "${PF_BIN:?}" "${PF_TESTBIN:?}"
MS=$PF_BIN/pegaflow-metaserver
TOOL=$PF_TESTBIN/meta_tool
NODE=$PF_TESTBIN/meta_node
pf_tmpdir

STORE_ARGS=()
if [ "${PF_META_STORE:-memory}" = redis ]; then
  RPORT=$(python3 -c 'import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p != 6379: print(p); break')
  mkdir -p "$PF_TMP/redis"
  pf_start redis redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$PF_TMP/redis" --save "" \
    --appendonly no --protected-mode no
  rping() { [ "$(redis-cli -p "$RPORT" PING 2>/dev/null)" = PONG ]; }
  pf_wait_for 10 rping || pf_fail "redis-server did not start on port $RPORT"
  STORE_ARGS=(--store "redis://127.0.0.1:$RPORT")
  pf_log "store: redis-server on 127.0.0.1:$RPORT"
fi

U1=11111111-1111-4111-8111-111111111111
U2=22222222-2222-4222-8222-222222222222

# ---------------------------------------------------------------- flag validation
for bad in "--ttl-minutes 0" "--sweep-interval-secs 0" "--node-stale-secs 120 --ttl-minutes 1"; do
  out=$($MS $bad --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 2>&1); rc=$?
  [ $rc -eq 2 ] || pf_fail "metaserver $bad: exit $rc, want 2 ($out)"
  pf_log "rejected: $bad -> $out"
done

# ---------------------------------------------------------------- start
start_ms() { # [grpc port] [http port] [stale secs]
  pf_start ms "$MS" --addr "127.0.0.1:${1:-0}" --http-addr "127.0.0.1:${2:-0}" \
    --node-stale-secs "${3:-2}" --ttl-minutes 1 --sweep-interval-secs 1 --log-level debug \
    "${STORE_ARGS[@]}"
  GPORT=$(pf_wait_port ms grpc) || pf_fail "metaserver did not start"
  HPORT=$(pf_wait_port ms http) || pf_fail "metaserver HTTP did not start"
  T=127.0.0.1:$GPORT
}
# the request checks run against a long stale period (no timing), the rest against 2 s
start_ms 0 0 60
pf_log "metaserver on $T (http $HPORT), stale after 60 s"

expect() { # expect "<regex>" CMD... : runs CMD, its output must match
  local re=$1; shift
  local out; out=$("$@" 2>&1)
  echo "$out" | grep -qE "$re" || pf_fail "'$*' printed '$out', want /$re/"
  pf_log "ok: ${*:3} -> $(echo "$out" | head -1)"
}

# ---------------------------------------------------------------- malformed requests
expect '^error INVALID_ARGUMENT: node_id: .not-a-uuid. is not a UUID' $TOOL $T heartbeat 10.0.0.1:1 not-a-uuid
expect '^error INVALID_ARGUMENT: node: must not be empty' $TOOL $T heartbeat "" $U1
expect '^error FAILED_PRECONDITION: unknown node' $TOOL $T insert ns 10.0.0.1:1 $U1 a
expect '^ok stale_after_secs=60' $TOOL $T heartbeat 10.0.0.1:1 $U1
expect '^error INVALID_ARGUMENT: namespace: must not be empty' $TOOL $T insert - 10.0.0.1:1 $U1 a
expect '^error INVALID_ARGUMENT: block_hashes\[1\]: empty hash' $TOOL $T insert ns 10.0.0.1:1 $U1 a - b
expect '^error INVALID_ARGUMENT: node_id' $TOOL $T insert ns 10.0.0.1:1 1234 a
expect '^ok status.ok=0 .*message=block_hashes cannot be empty' $TOOL $T insert ns 10.0.0.1:1 $U1
expect '^ok status.ok=0 .*message=block_hashes cannot be empty' $TOOL $T remove ns 10.0.0.1:1 $U1
expect '^error INVALID_ARGUMENT: block_hashes cannot be empty' $TOOL $T query ns
expect '^error INVALID_ARGUMENT: namespace: must not be empty' $TOOL $T query - a
expect '^error INVALID_ARGUMENT: block_hashes\[0\]: empty hash' $TOOL $T query ns -
expect '^error FAILED_PRECONDITION: stale node session' $TOOL $T heartbeat 10.0.0.1:1 $U2
expect '^error FAILED_PRECONDITION: stale node session' $TOOL $T insert ns 10.0.0.1:1 $U2 a
# the MetaServer kept serving through all of the above
expect '^ok status.ok=1 inserted=3 ' $TOOL $T insert ns 10.0.0.1:1 $U1 x y z
expect '^ok removed_owners=3' $TOOL $T unregister 10.0.0.1:1 $U1
curl -sf "http://127.0.0.1:$HPORT/health" | grep -qx ok || pf_fail "/health is not ok"
curl -sf "http://127.0.0.1:$HPORT/metrics" |
  grep -qE '^pegaflow_metaserver_rpc_requests_total\{method="insert_block_hashes",status="INVALID_ARGUMENT"\} 3$' ||
  pf_fail "rpc_requests_total{insert_block_hashes,INVALID_ARGUMENT} != 3"
curl -sf "http://127.0.0.1:$HPORT/metrics" |
  grep -qE '^pegaflow_metaserver_rpc_duration_seconds_count\{method="heartbeat_node",status="ok"\} 1$' ||
  pf_fail "rpc_duration_seconds{heartbeat_node,ok} count != 1"
pf_stop ms || pf_fail "metaserver exited non-zero on SIGTERM"
start_ms
pf_log "metaserver on $T (http $HPORT), stale after 2 s"

# ---------------------------------------------------------------- two nodes
A=127.0.0.2:50055
B=127.0.0.3:50055
pf_start nodeA "$NODE" --target $T --advertise $A --ns ns0 --blocks 64
pf_start nodeB "$NODE" --target $T --advertise $B --ns ns0 --blocks 32
AH=$(pf_wait_port nodeA http) || pf_fail "node A did not start"
pf_wait_port nodeB http >/dev/null || pf_fail "node B did not start"

q_has() { # q_has "<line>" : the query over blk-0..blk-99 lists this node line
  $TOOL $T query ns0 @blk:0-99 | grep -qx "$1"
}
q_lacks() { ! $TOOL $T query ns0 @blk:0-99 | grep -q "^$1 "; }
pf_wait_for 20 q_has "$A 64" || pf_fail "A's 64 blocks not visible"
pf_wait_for 20 q_has "$B 32" || pf_fail "B's 32 blocks not visible"
pf_log "query: $($TOOL $T query ns0 @blk:0-99 | tr '\n' ' ')"

# ---------------------------------------------------------------- metrics
metric() { curl -sf "http://127.0.0.1:$HPORT/metrics" | grep -E "^$1 " | awk '{print $2}'; }
metric_is() { [ "$(metric "$1")" = "$2" ]; }
pf_wait_for 10 metric_is pegaflow_metaserver_store_entries 64 || pf_fail "store_entries != 64"
pf_wait_for 10 metric_is pegaflow_metaserver_block_owners 96 || pf_fail "block_owners != 96"
pf_wait_for 10 metric_is 'pegaflow_metaserver_nodes\{state="active"\}' 2 || pf_fail "2 active nodes"
# the sweep runs every second and publishes the redundancy snapshot
pf_wait_for 10 metric_is 'pegaflow_metaserver_block_redundancy\{owners="2"\}' 32 ||
  pf_fail "redundancy{owners=2} != 32"
pf_wait_for 10 metric_is 'pegaflow_metaserver_block_redundancy\{owners="1"\}' 32 ||
  pf_fail "redundancy{owners=1} != 32"
metric_is pegaflow_metaserver_block_redundancy_avg 1.5 || pf_fail "redundancy avg != 1.5"

# ---------------------------------------------------------------- stale node
kill -STOP "$PF_PID_nodeB"
pf_log "node B stopped (SIGSTOP): no heartbeats"
pf_wait_for 20 q_lacks "$B" || pf_fail "B still visible after the stale period"
q_has "$A 64" || pf_fail "A hidden too"
pf_wait_for 10 metric_is 'pegaflow_metaserver_nodes\{state="stale"\}' 1 || pf_fail "1 stale node"
kill -CONT "$PF_PID_nodeB"
pf_wait_for 20 q_has "$B 32" || pf_fail "B not visible again after resuming"
pf_log "B hidden while silent, visible again after SIGCONT"

# ---------------------------------------------------------------- restart
pf_stop ms KILL >/dev/null 2>&1
pf_log "metaserver killed (SIGKILL); restarting on port $GPORT"
# a long stale period again: "visible at once" must not race the nodes' next heartbeat (with
# 2 s, a node whose last heartbeat before the kill was ~1 s old is hidden as stale by the time
# the restarted MetaServer answers on a loaded machine: TSan, 2026-12-02)
start_ms "$GPORT" "$HPORT" 60
if [ ${#STORE_ARGS[@]} -gt 0 ]; then
  # the registry is in Redis: nothing was lost, no resync is needed
  q_has "$A 64" || pf_fail "A's entries lost across a MetaServer restart on Redis"
  q_has "$B 32" || pf_fail "B's entries lost across a MetaServer restart on Redis"
  pf_log "after restart on Redis: $($TOOL $T query ns0 @blk:0-99 | tr '\n' ' ') at once"
else
pf_wait_for 30 q_has "$A 64" || pf_fail "A not re-registered after the restart"
pf_wait_for 30 q_has "$B 32" || pf_fail "B not re-registered after the restart"
resync=$(curl -sf "http://127.0.0.1:$AH/metrics" | grep -E '^pegaflow_metaserver_resync_blocks_total ' | awk '{print $2}')
[ "${resync%.*}" -ge 128 ] 2>/dev/null || pf_fail "node A resync_blocks_total=$resync, want >= 128"
grep -q "session reset" "$PF_TMP/nodeA.log" || grep -q "unreachable" "$PF_TMP/nodeA.log" ||
  pf_fail "node A never noticed the restart"
pf_log "after restart: $($TOOL $T query ns0 @blk:0-99 | tr '\n' ' ') (A resync_blocks_total=$resync)"
fi

# ---------------------------------------------------------------- stop = unregister
pf_stop nodeA || pf_fail "node A exited non-zero"
grep -q "unregistered from MetaServer" "$PF_TMP/nodeA.log" || pf_fail "A did not unregister"
q_lacks "$A" || pf_fail "A still listed after UnregisterNode"
q_has "$B 32" || pf_fail "B lost"
pf_stop nodeB || pf_fail "node B exited non-zero"
pf_stop ms || pf_fail "metaserver exited non-zero on SIGTERM"
grep -q "stopped" "$PF_TMP/ms.log" || pf_fail "metaserver did not log its clean stop"
pf_stop redis KILL >/dev/null 2>&1
echo "PASS"
