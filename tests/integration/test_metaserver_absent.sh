#!/usr/bin/env bash
# MetaServer absent: a node's registration calls never block or fail because of it. The
# simulated node (meta_node, the real client) points at a port where nothing listens and
# enqueues 20000 insert/remove commands as fast as it can: every call returns at once
# (queued, or dropped with -EAGAIN when the bounded queue is full, counted), the client
# keeps retrying its heartbeat in the background, a flush completes, and stop is prompt.
# Then a MetaServer appears on that port and the same node registers its blocks (resync).
# (A MetaServer that accepts connections but never answers is covered by the unit test
# test_client: test_hung_metaserver_never_blocks_callers.)
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
: "${PF_BIN:?}" "${PF_TESTBIN:?}"
MS=$PF_BIN/pegaflow-metaserver
TOOL=$PF_TESTBIN/meta_tool
NODE=$PF_TESTBIN/meta_node
pf_tmpdir

# a port with nothing behind it: start a MetaServer on port 0 and stop it
pf_start probe "$MS" --addr 127.0.0.1:0 --http-addr 127.0.0.1:0
PORT=$(pf_wait_port probe grpc) || pf_fail "metaserver did not start"
pf_stop probe || pf_fail "metaserver exited non-zero"
T=127.0.0.1:$PORT
pf_log "nothing listens on $T now"

out=$("$NODE" --target "$T" --advertise 127.0.0.9:50055 --blocks 4096 --storm 20000 2>"$PF_TMP/storm.log")
rc=$?
echo "$out"
[ $rc -eq 0 ] || pf_fail "storm exited $rc"
echo "$out" | grep -qE '^storm calls=20000 ok=[0-9]+ full=[0-9]+ other=0 ' ||
  pf_fail "unexpected storm result: $out"
echo "$out" | grep -qE '^flush rc=0 connected=0' || pf_fail "flush did not complete: $out"
grep -q "heartbeat failed" "$PF_TMP/storm.log" || pf_fail "no heartbeat attempt logged"

# the MetaServer appears: a node started before it registers once it is up
pf_start node "$NODE" --target "$T" --advertise 127.0.0.9:50055 --blocks 100
pf_wait_log node "heartbeat failed|unreachable" 20 || pf_fail "node did not try the absent MetaServer"
pf_start ms "$MS" --addr "$T" --http-addr 127.0.0.1:0 --node-stale-secs 2
pf_wait_port ms grpc >/dev/null || pf_fail "metaserver did not start on $T"
visible() { $TOOL "$T" query ns0 @blk:0-99 | grep -qx "127.0.0.9:50055 100"; }
pf_wait_for 40 visible || pf_fail "blocks not registered after the MetaServer appeared"
pf_log "registered after the MetaServer appeared: $($TOOL "$T" query ns0 @blk:0-99 | tr '\n' ' ')"
pf_stop node || pf_fail "node exited non-zero"
pf_stop ms || pf_fail "metaserver exited non-zero"
echo "PASS"
