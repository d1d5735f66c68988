#!/usr/bin/env bash
# pegaflow-sim end to end (docs/simulation.md): 3 nodes with SSD files, a few hundred requests
# through the real connector, node 2 killed at 30% and restarted at 60% of the requests. Checks: it
# completes; ram + ssd + remote + miss = requested (per node and in total); remote hits;
# zero integrity failures and mismatched bytes; the JSON and the SVG parse; nothing left
# (processes, namespaces, shared memory, files). Then the teardown paths, each with the
# cluster up (--keep): a crashed child (a server killed behind the simulator's back), Ctrl-C
# (SIGINT), and kill -9 of the simulator itself, whose leftovers the next run removes (and then
# works).
# As root the nodes run in network namespaces; otherwise on loopback addresses.
set -u
. "$(dirname "$0")/lib.sh"
pf_tmpdir
SEED=${PF_SIM_SEED:-$((RANDOM * 32768 + RANDOM))}
echo "seed $SEED"
export PYTHONPATH="$PF_TOP/python"
sim() { /usr/bin/python3 -m pegaflow.sim --bin "$PF_BIN" --lib "$PF_LIB/libpegaflow.so" "$@"; }
check() { /usr/bin/python3 "$PF_TOP/tests/integration/sim_check.py" "$@"; }

sim --nodes 3 --requests 240 --rate 60 --seed "$SEED" --kill-node 2@30% --restart-node 2@60% \
  --ssd on --ssd-capacity 64mb \
  --json "$PF_TMP/run.json" --plot "$PF_TMP/run.svg" >"$PF_TMP/run.log" 2>&1
rc=$?
cat "$PF_TMP/run.log"
[ $rc = 0 ] || pf_fail "pegaflow-sim exited with $rc"
grep -q "every loaded block matched what was saved" "$PF_TMP/run.log" ||
  pf_fail "no integrity verdict"
check "$PF_TMP/run.json" "$PF_TMP/run.svg" --want-remote --want-events kill,restart \
  --min-efficiency 0.95 || pf_fail "report checks"

# keep_run NAME: a small run that stays up; waits for "cluster kept up"; sets KPID, KTMP
keep_run() {
  pf_start "$1" /usr/bin/python3 -m pegaflow.sim --bin "$PF_BIN" --lib "$PF_LIB/libpegaflow.so" \
    --nodes 2 --requests 20 --rate 0 --seed "$SEED" --keep
  KPID=$(eval echo "\$PF_PID_$1")
  pf_wait_log "$1" "cluster kept up" 60 || pf_fail "$1: the cluster did not come up"
  KTMP=$(grep -ao 'logs in /[^ ]*' "$PF_TMP/$1.log" | head -1 | cut -d' ' -f3)
  [ -d "$KTMP" ] || pf_fail "$1: no temporary directory in the output"
  # every child the simulator recorded (its state file), to check they are gone later
  cp "$(/usr/bin/python3 -c 'from pegaflow.sim import cluster as c; print(c.state_path())')" \
    "$PF_TMP/$1.state" || pf_fail "$1: no state file"
  KSTATE=$PF_TMP/$1.state
  KCHILDREN=$(/usr/bin/python3 -c 'import json, sys
print(" ".join(str(p["pid"]) for p in json.load(open(sys.argv[1]))["procs"]))' "$KSTATE")
  [ -n "$KCHILDREN" ] || pf_fail "$1: no children in the state file"
}
# gone DIR: nothing of the run whose temporary directory was DIR is left
gone() {
  local pid st
  [ ! -e "$1" ] || { echo "left: $1"; return 1; }
  for pid in $KCHILDREN; do  # (a zombie not yet reaped by init is gone too)
    st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)
    [ -z "$st" ] || [ "$st" = Z ] || { echo "left: process $pid"; return 1; }
  done
  /usr/bin/python3 -c 'import json, sys; from pegaflow.sim import cluster as c
left = c.owned_shm(json.load(open(sys.argv[1]))["shm_pids"])
sys.exit(print("left:", left) or 1 if left else 0)' "$KSTATE" || return 1
  if [ "$(id -u)" = 0 ] && ip netns list 2>/dev/null | grep -q '^pfsim-'; then
    echo "left: namespaces $(ip netns list | grep '^pfsim-')"; return 1
  fi
  return 0
}
# gone_soon DIR: gone, within 10 s (killed processes take a moment to exit)
gone_soon() { pf_wait_for 10 gone "$1" >/dev/null || gone "$1"; }
wait_exit() {  # wait_exit PID SECS: exit status of our background child PID
  local end=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.1; done
  wait "$1"
}

# a child crash: node 1's server is killed by someone else -> the simulator tears down, exits 1
keep_run crash
# (its pid from the simulator's state file, which lists every child)
spid=$(/usr/bin/python3 -c 'import json; from pegaflow.sim import cluster as c
print(next(p["pid"] for p in json.load(open(c.state_path()))["procs"] if p["what"] == "server n1"))')
[ -n "$spid" ] || pf_fail "crash: no server process of node 1 in the state file"
kill -KILL $spid
wait_exit "$KPID" 60; rc=$?
[ $rc = 1 ] || pf_fail "crash: pegaflow-sim exited with $rc (want 1)"
grep -q "server n1 exited unexpectedly" "$PF_TMP/crash.log" || pf_fail "crash: not reported"
gone_soon "$KTMP" || pf_fail "crash: leftovers"

# Ctrl-C
keep_run sigint
kill -INT "$KPID"
wait_exit "$KPID" 60; rc=$?
[ $rc = 130 ] || pf_fail "sigint: pegaflow-sim exited with $rc (want 130)"
gone_soon "$KTMP" || pf_fail "sigint: leftovers"

# kill -9 of the simulator: the next run finds its state file and removes what is left
keep_run kill9
kill -KILL "$KPID"
wait "$KPID" 2>/dev/null
gone "$KTMP" >/dev/null && pf_fail "kill9: nothing seen left before the cleanup"
# (the next run: a small one, which must also work right after)
sim --nodes 2 --requests 10 --rate 0 --seed "$SEED" --json "$PF_TMP/next.json" \
  >"$PF_TMP/cleanup.log" 2>&1 || { cat "$PF_TMP/cleanup.log"; pf_fail "the next run failed"; }
cat "$PF_TMP/cleanup.log"
grep -q "cleaned up after a previous run (pid $KPID" "$PF_TMP/cleanup.log" ||
  pf_fail "kill9: the stale state was not found"
gone_soon "$KTMP" || pf_fail "kill9: leftovers after the cleanup"
check "$PF_TMP/next.json" || pf_fail "the run after the cleanup"
echo "PASS"
