# Process helpers for integration scenarios (bash) used by test_server_cli.sh. Source it:
# . "$PF_TOP/tests/integration/proc.sh". See also lib.sh (pf_* helpers).
# Processes started with start_proc are killed when the script exits.
set -u
LOGDIR=${PF_TEST_LOGDIR:-$(mktemp -d)}
declare -a PF_PIDS=()
cleanup_procs() { for p in "${PF_PIDS[@]:-}"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done; }
trap cleanup_procs EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# start_proc NAME BINARY ARGS... : starts it with logs in $LOGDIR/NAME.log, waits (20 s) for
# the "ready" line and sets NAME_PID, NAME_GRPC, NAME_HTTP.
start_proc() {
  local name=$1 bin=$2; shift 2
  local log="$LOGDIR/$name.log"
  # a log left by an earlier process of the same name must not count as this one's "ready"
  # (the child truncates it only once it runs: a race that signalled a server before it
  # had blocked SIGTERM)
  rm -f "$log"
  "$PF_BIN/$bin" "$@" >"$log" 2>&1 &
  local pid=$!
  PF_PIDS+=("$pid")
  local deadline=$((SECONDS + 20))
  while ! grep -q ': ready$' "$log" 2>/dev/null; do
    if ! kill -0 "$pid" 2>/dev/null; then cat "$log" >&2; fail "$name exited during start-up"; fi
    [ $SECONDS -lt $deadline ] || { cat "$log" >&2; fail "$name not ready after 20 s"; }
    sleep 0.05
  done
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_GRPC" '%s' "$(grep -o 'gRPC listening on .* (port [0-9]*' "$log" | grep -o '[0-9]*$')"
  printf -v "${name}_HTTP" '%s' "$(grep -o 'HTTP listening on .* (port [0-9]*' "$log" | grep -o '[0-9]*$')"
}

# wait_exit PID TIMEOUT_S : sets EXIT_RC to the exit status (or "timeout"). Call it
# directly, not in $(...): only this shell can reap its children.
wait_exit() {
  local pid=$1 deadline=$((SECONDS + $2))
  EXIT_RC=timeout
  while [ $SECONDS -lt $deadline ]; do
    if ! kill -0 "$pid" 2>/dev/null || [ "$(ps -o stat= -p "$pid" 2>/dev/null | cut -c1)" = Z ]; then
      wait "$pid" 2>/dev/null
      EXIT_RC=$?
      return
    fi
    sleep 0.05
  done
}
