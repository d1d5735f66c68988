#!/usr/bin/env bash
# MetaServer on a Redis Cluster with real processes: 3 redis-server masters on free loopback
# ports (never 6379), two MetaServer replicas (--store redis://...) on them, two simulated
# nodes (meta_node: the real MetaServer client) listing both replicas. Keys spread over all
# three masters; each replica sees what was registered through the other; a node that stops
# heartbeating is hidden and comes back; 2000 slots resharded under running replicas (they
# follow MOVED, answers unchanged); the node table's slot migrated by hand (heartbeats follow
# ASK to the importing master); one replica killed with SIGKILL: the nodes fail over
# to the other and discovery goes on; a Redis master killed: the MetaServer answers
# UNAVAILABLE (fast, no hang), the nodes degrade, and when the master is back everything
# recovers by itself (the nodes re-register what that master lost); a stopped node is
# unregistered. TTL expiry against Redis is in tests/unit/meta/test_store (fake clock).
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
: "${PF_BIN:?}" "${PF_TESTBIN:?}"
MS=$PF_BIN/pegaflow-metaserver
TOOL=$PF_TESTBIN/meta_tool
NODE=$PF_TESTBIN/meta_node
RS=$(command -v redis-server || echo /usr/bin/redis-server)
RC=$(command -v redis-cli || echo /usr/bin/redis-cli)
if [ ! -x "$RS" ] || [ ! -x "$RC" ]; then
  echo "SKIP: redis-server/redis-cli not installed (ci/install-deps.sh installs redis-server)"
  exit 77
fi
pf_tmpdir

free_port() {
  python3 -c 'import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p != 6379: print(p); break'
}

# ---------------------------------------------------------------- Redis Cluster
start_redis() { # start_redis INDEX (port in RP[INDEX], data in $PF_TMP/rINDEX)
  local i=$1 d=$PF_TMP/r$1
  mkdir -p "$d"
  pf_start "redis$i" "$RS" --port "${RP[$i]}" --bind 127.0.0.1 --dir "$d" --save "" \
    --appendonly no --cluster-enabled yes --cluster-config-file nodes.conf \
    --cluster-node-timeout 2000 --protected-mode no
}
rping() { [ "$("$RC" -p "$1" PING 2>/dev/null)" = PONG ]; }
RP=()
for i in 0 1 2; do
  for try in 1 2 3 4 5; do
    RP[$i]=$(free_port)
    start_redis "$i"
    pf_wait_for 10 rping "${RP[$i]}" && break
    pf_stop "redis$i" KILL >/dev/null 2>&1
  done
  rping "${RP[$i]}" || pf_fail "redis-server $i did not start"
done
"$RC" --cluster create "127.0.0.1:${RP[0]}" "127.0.0.1:${RP[1]}" "127.0.0.1:${RP[2]}" \
  --cluster-replicas 0 --cluster-yes >"$PF_TMP/cluster-create.out" 2>&1 ||
  pf_fail "redis-cli --cluster create failed: $(tail -3 "$PF_TMP/cluster-create.out")"
cluster_ok() {
  local p
  for p in "${RP[@]}"; do
    "$RC" -p "$p" CLUSTER INFO 2>/dev/null | grep -q '^cluster_state:ok' || return 1
  done
}
pf_wait_for 30 cluster_ok || pf_fail "cluster never reached cluster_state:ok"
pf_log "Redis Cluster: 3 masters on ports ${RP[*]}"
STORE="redis://127.0.0.1:${RP[0]},127.0.0.1:${RP[1]}"

# ---------------------------------------------------------------- flags
out=$($MS --store redis:/x --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 2>&1); rc=$?
[ $rc -eq 2 ] || pf_fail "--store redis:/x: exit $rc, want 2 ($out)"
out=$($MS --store rediss://127.0.0.1:1 --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 2>&1); rc=$?
[ $rc -ne 0 ] && echo "$out" | grep -q "TLS needs hiredis" || pf_fail "rediss:// accepted ($rc, $out)"

# ---------------------------------------------------------------- two replicas
start_ms() { # start_ms NAME
  pf_start "$1" "$MS" --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --store "$STORE" \
    --node-stale-secs 2 --ttl-minutes 1 --sweep-interval-secs 1
  local g h
  g=$(pf_wait_port "$1" grpc) || pf_fail "$1 did not start"
  h=$(pf_wait_port "$1" http) || pf_fail "$1 HTTP did not start"
  eval "T_$1=127.0.0.1:$g H_$1=$h"
}
start_ms ms1
start_ms ms2
pf_log "MetaServer replicas $T_ms1 and $T_ms2 on $STORE"
grep -q "store: Redis at redis://127.0.0.1:${RP[0]}" "$PF_TMP/ms1.log" || pf_fail "ms1 does not log its store"

A=127.0.0.2:50055
B=127.0.0.3:50055
pf_start nodeA "$NODE" --target "$T_ms1,$T_ms2" --advertise $A --ns ns0 --blocks 64
pf_start nodeB "$NODE" --target "$T_ms2,$T_ms1" --advertise $B --ns ns0 --blocks 32
pf_wait_port nodeA http >/dev/null || pf_fail "node A did not start"
pf_wait_port nodeB http >/dev/null || pf_fail "node B did not start"

q_has() { $TOOL "$1" query ns0 @blk:0-99 2>&1 | grep -qx "$2"; }
q_lacks() { local o; o=$($TOOL "$1" query ns0 @blk:0-99 2>&1) && ! echo "$o" | grep -q "^$2 "; }
for t in "$T_ms1" "$T_ms2"; do
  pf_wait_for 20 q_has "$t" "$A 64" || pf_fail "A's 64 blocks not visible through $t"
  pf_wait_for 20 q_has "$t" "$B 32" || pf_fail "B's 32 blocks not visible through $t"
done
pf_log "both replicas: $($TOOL "$T_ms2" query ns0 @blk:0-99 | tr '\n' ' ')"
# keys spread over every master (no single hash tag)
for p in "${RP[@]}"; do
  n=$("$RC" -p "$p" DBSIZE)
  [ "$n" -gt 3 ] || pf_fail "master on port $p holds $n keys; keys are not spread over slots"
  pf_log "master $p: $n keys"
done

# ---------------------------------------------------------------- metrics
metric() { curl -sf "http://127.0.0.1:$1/metrics" | grep -E "^$2 " | awk '{print $2}'; }
metric_is() { [ "$(metric "$1" "$2")" = "$3" ]; }
pf_wait_for 10 metric_is "$H_ms1" pegaflow_metaserver_store_entries 64 || pf_fail "store_entries != 64"
pf_wait_for 10 metric_is "$H_ms2" pegaflow_metaserver_block_owners 96 || pf_fail "block_owners != 96"
pf_wait_for 10 metric_is "$H_ms1" 'pegaflow_metaserver_nodes\{state="active"\}' 2 || pf_fail "2 active nodes"
rt=$(metric "$H_ms1" pegaflow_metaserver_redis_round_trips_total)
[ "${rt%.*}" -gt 0 ] 2>/dev/null || pf_fail "redis_round_trips_total=$rt"
curl -sf "http://127.0.0.1:$H_ms1/metrics" | grep -q '^pegaflow_metaserver_redis_round_trip_seconds_count ' ||
  pf_fail "no redis_round_trip_seconds histogram"

# ---------------------------------------------------------------- resharding: MOVED
id0=$("$RC" -p "${RP[0]}" CLUSTER MYID)
id1=$("$RC" -p "${RP[1]}" CLUSTER MYID)
"$RC" --cluster reshard "127.0.0.1:${RP[0]}" --cluster-from "$id0" --cluster-to "$id1" \
  --cluster-slots 2000 --cluster-yes >"$PF_TMP/reshard.out" 2>&1 ||
  pf_fail "reshard failed: $(tail -3 "$PF_TMP/reshard.out")"
pf_wait_for 30 cluster_ok || pf_fail "cluster not ok after resharding"
for t in "$T_ms1" "$T_ms2"; do
  pf_wait_for 20 q_has "$t" "$A 64" || pf_fail "A not visible through $t after resharding"
  q_has "$t" "$B 32" || pf_fail "B not visible through $t after resharding"
done
moved() { curl -sf "http://127.0.0.1:$1/metrics" | grep -E '^pegaflow_metaserver_redis_errors_total\{kind="moved"\} ' | awk '{print $2}'; }
m1=$(moved "$H_ms1"); m2=$(moved "$H_ms2")
[ "${m1%.*}" -gt 0 ] 2>/dev/null && [ "${m2%.*}" -gt 0 ] 2>/dev/null ||
  pf_fail "no MOVED followed after resharding (ms1 $m1, ms2 $m2)"
pf_log "2000 slots moved ${RP[0]} -> ${RP[1]}: replicas followed MOVED ($m1, $m2), answers unchanged"

# ---------------------------------------------------------------- slot migration: ASK
# pf:nodes (the node table) moves to another master by hand; while its slot is MIGRATING the
# old owner answers ASK and heartbeats must reach the new one (ASKING + the command).
slot=$("$RC" -p "${RP[0]}" CLUSTER KEYSLOT pf:nodes)
src= dst=
for p in "${RP[@]}"; do
  if [ "$("$RC" -p "$p" CLUSTER COUNTKEYSINSLOT "$slot")" -gt 0 ]; then src=$p; fi
done
[ -n "$src" ] || pf_fail "no master holds pf:nodes (slot $slot)"
for p in "${RP[@]}"; do [ "$p" != "$src" ] && dst=$p && break; done
srcid=$("$RC" -p "$src" CLUSTER MYID) dstid=$("$RC" -p "$dst" CLUSTER MYID)
"$RC" -p "$dst" CLUSTER SETSLOT "$slot" IMPORTING "$srcid" | grep -q OK || pf_fail "IMPORTING"
"$RC" -p "$src" CLUSTER SETSLOT "$slot" MIGRATING "$dstid" | grep -q OK || pf_fail "MIGRATING"
"$RC" -p "$src" MIGRATE 127.0.0.1 "$dst" pf:nodes 0 5000 | grep -q OK || pf_fail "MIGRATE pf:nodes"
asks() { curl -sf "http://127.0.0.1:$1/metrics" | grep -E '^pegaflow_metaserver_redis_errors_total\{kind="ask"\} ' | awk '{print $2}'; }
ask_seen() { local a; a=$(asks "$H_ms1"); [ "${a%.*}" -gt 0 ] 2>/dev/null; }
pf_wait_for 20 ask_seen || pf_fail "ms1 never followed an ASK (slot $slot migrating $src -> $dst)"
# ASKING first: the slot is not the importing master's own yet; --no-raw quotes the binary id
seenA() { printf 'ASKING\nHGET pf:nodes %s\n' "$A" | "$RC" --no-raw -p "$dst" | tail -1; }
v0=$(seenA)
echo "$v0" | grep -qE '^".*:[0-9]+"$' || pf_fail "A's node record is not on the importing master ($v0)"
changed() { [ "$(seenA)" != "$v0" ]; }
pf_wait_for 20 changed || pf_fail "A's heartbeats do not reach the importing master through ASK"
q_has "$T_ms2" "$A 64" || pf_fail "A not visible while the node table migrates"
for p in "${RP[@]}"; do "$RC" -p "$p" CLUSTER SETSLOT "$slot" NODE "$dstid" >/dev/null; done
pf_wait_for 30 cluster_ok || pf_fail "cluster not ok after the migration"
pf_wait_for 20 q_has "$T_ms1" "$B 32" || pf_fail "B not visible after the migration"
pf_log "node table slot $slot migrated $src -> $dst: heartbeats followed ASK ($(asks "$H_ms1") on ms1)"

# ---------------------------------------------------------------- stale node
kill -STOP "$PF_PID_nodeB"
pf_wait_for 20 q_lacks "$T_ms1" "$B" || pf_fail "B still visible after the stale period"
q_has "$T_ms2" "$A 64" || pf_fail "A hidden too"
kill -CONT "$PF_PID_nodeB"
pf_wait_for 20 q_has "$T_ms1" "$B 32" || pf_fail "B not visible again after resuming"
pf_log "B hidden while silent (both replicas agree), visible again after SIGCONT"

# ---------------------------------------------------------------- replica killed
pf_stop ms1 KILL >/dev/null 2>&1
pf_log "replica ms1 killed (SIGKILL)"
pf_wait_log nodeA "switching to $T_ms2" 20 || pf_fail "node A did not fail over to ms2"
kill -STOP "$PF_PID_nodeA"
pf_wait_for 20 q_lacks "$T_ms2" "$A" || pf_fail "A not hidden through ms2 while silent"
kill -CONT "$PF_PID_nodeA"
pf_wait_for 20 q_has "$T_ms2" "$A 64" || pf_fail "A not visible through ms2 after failover"
q_has "$T_ms2" "$B 32" || pf_fail "B lost after ms1 died"
pf_log "after ms1 died: $($TOOL "$T_ms2" query ns0 @blk:0-99 | tr '\n' ' ')"

# ---------------------------------------------------------------- Redis master killed
pf_stop redis2 KILL >/dev/null 2>&1
pf_log "Redis master on port ${RP[2]} killed (SIGKILL)"
unavailable() { $TOOL "$T_ms2" query ns0 @blk:0-99 2>&1 | grep -q '^error UNAVAILABLE'; }
pf_wait_for 30 unavailable || pf_fail "ms2 never answered UNAVAILABLE with a master down"
t0=$(date +%s%N)
unavailable || pf_fail "UNAVAILABLE not stable"
dt=$(( ($(date +%s%N) - t0) / 1000000 ))
pf_log "ms2 answers UNAVAILABLE ($dt ms for a query including the tool's start)"
curl -sf "http://127.0.0.1:$H_ms2/health" | grep -qx ok || pf_fail "ms2 /health while Redis is down"
pf_wait_log nodeA "unreachable|heartbeat failed" 20 || pf_fail "node A never noticed"
start_redis 2
pf_wait_for 10 rping "${RP[2]}" || pf_fail "redis master did not restart"
pf_wait_for 30 cluster_ok || pf_fail "cluster did not recover"
pf_log "master back (empty: no persistence), cluster ok"
pf_wait_for 40 q_has "$T_ms2" "$A 64" || pf_fail "A not fully visible after Redis recovered"
pf_wait_for 40 q_has "$T_ms2" "$B 32" || pf_fail "B not fully visible after Redis recovered"
pf_log "recovered: $($TOOL "$T_ms2" query ns0 @blk:0-99 | tr '\n' ' ')"

# ---------------------------------------------------------------- node death, unregister
pf_stop nodeB KILL >/dev/null 2>&1
pf_wait_for 20 q_lacks "$T_ms2" "$B" || pf_fail "dead node B still visible"
pf_stop nodeA || pf_fail "node A exited non-zero"
grep -q "unregistered from MetaServer" "$PF_TMP/nodeA.log" || pf_fail "A did not unregister"
q_lacks "$T_ms2" "$A" || pf_fail "A still listed after UnregisterNode"
pf_stop ms2 || pf_fail "ms2 exited non-zero on SIGTERM"
for i in 0 1 2; do pf_stop "redis$i" KILL >/dev/null 2>&1; done
echo "PASS"
