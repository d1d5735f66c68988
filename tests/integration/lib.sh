# Shared helpers for integration scenarios (source it). Generic: start a process with its
# log, wait for a log line or a condition with a deadline, stop processes, clean up.
#
#   pf_tmpdir                          -> $PF_TMP (removed at exit)
#   pf_start NAME CMD...               starts CMD in the background, log $PF_TMP/NAME.log;
#                                      sets PF_PID_<NAME>
#   pf_wait_port NAME grpc|http [SECS] prints the port from "gRPC|HTTP listening on ... (port N)"
#   pf_wait_log NAME REGEX [SECS]      waits until the log has a line matching REGEX
#   pf_wait_for SECS CMD...            retries CMD (every 0.1 s) until it succeeds
#   pf_stop NAME [SIG]                 signals (default TERM), waits up to 15 s, then KILLs;
#                                      returns the exit status
#   pf_fail MSG                        prints FAIL and the logs' tails, exits 1
#   pf_cluster_token DIR               writes a fresh random cluster token to DIR/cluster-token
#                                      (0600) and exports PF_CLUSTER_TOKEN_FILE (for the
#                                      servers' --cluster-token-file) and PEGAFLOW_TOKEN_FILE
#                                      (libpegaflow clients send it): protected-default
#                                      nodes (P2P, worker RPCs from another namespace) need it;
#                                      also DIR/admin-token, exported as PF_ADMIN_TOKEN_FILE
#                                      (p2p_cluster.h's servers take it, pft_http sends it) so
#                                      a test's POST from outside a node's namespace is served
# Every process started with pf_start is killed at exit.

PF_TMP=${PF_TMP:-}
_pf_names=()

pf_tmpdir() {
  PF_TMP=$(mktemp -d "${TMPDIR:-/tmp}/pf-it.XXXXXX")
  trap _pf_cleanup EXIT
}

_pf_cleanup() {
  local n pid
  for n in "${_pf_names[@]}"; do
    pid=$(eval echo "\${PF_PID_$n:-}")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  [ -n "$PF_TMP" ] && [ -z "${PF_KEEP_TMP:-}" ] && rm -rf "$PF_TMP"
}

# One helper for every test that starts P2P nodes or calls worker RPCs across namespaces
# (docs/security.md, protected by default): a token per run, never a fixed string.
pf_cluster_token() {
  local dir=${1:?dir} f
  f="$dir/cluster-token"
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$f" && echo >>"$f") ||
    return 1
  (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$dir/admin-token" &&
    echo >>"$dir/admin-token") || return 1
  export PF_CLUSTER_TOKEN_FILE=$f PEGAFLOW_TOKEN_FILE=$f PF_ADMIN_TOKEN_FILE=$dir/admin-token
}

pf_log() { echo "[$(date +%H:%M:%S.%N | cut -c1-12)] $*"; }

pf_fail() {
  echo "FAIL: $*"
  local f
  for f in "$PF_TMP"/*.log; do
    [ -e "$f" ] || continue
    echo "---- tail of $(basename "$f")"
    tail -n 25 "$f"
  done
  exit 1
}

pf_start() {
  local name=$1; shift
  # truncate here, not in the background child: a restart must never see the old log
  : >"$PF_TMP/$name.log"
  "$@" >>"$PF_TMP/$name.log" 2>&1 &
  eval "PF_PID_$name=$!"
  _pf_names+=("$name")
}

pf_wait_log() {
  local name=$1 re=$2 secs=${3:-20}
  local end=$((SECONDS + secs))
  while [ $SECONDS -lt $end ]; do
    grep -aqE "$re" "$PF_TMP/$name.log" 2>/dev/null && return 0
    local pid; pid=$(eval echo "\${PF_PID_$name:-}")
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      grep -aqE "$re" "$PF_TMP/$name.log" 2>/dev/null && return 0
      echo "$name exited before logging /$re/" >&2
      return 1
    fi
    sleep 0.05
  done
  echo "timed out after ${secs}s waiting for /$re/ in $name.log" >&2
  return 1
}

pf_wait_port() {
  local name=$1 kind=$2 secs=${3:-20} label
  case $kind in grpc) label=gRPC ;; http) label=HTTP ;; *) label=$kind ;; esac
  pf_wait_log "$name" "$label listening on .*\(port [0-9]+\)" "$secs" || return 1
  grep -aoE "$label listening on .*\(port [0-9]+\)" "$PF_TMP/$name.log" | tail -1 |
    grep -oE 'port [0-9]+' | grep -oE '[0-9]+'
}

pf_wait_for() {
  local secs=$1; shift
  local end=$((SECONDS + secs))
  while [ $SECONDS -lt $end ]; do
    "$@" && return 0
    sleep 0.1
  done
  "$@"
}

pf_stop() {
  local name=$1 sig=${2:-TERM}
  local pid; pid=$(eval echo "\${PF_PID_$name:-}")
  [ -n "$pid" ] || return 0
  kill -"$sig" "$pid" 2>/dev/null
  local end=$((SECONDS + 15))
  while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $end ]; do sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null
    echo "$name did not stop within 15 s after SIG$sig" >&2
  fi
  local rc=0
  wait "$pid" 2>/dev/null || rc=$?
  eval "PF_PID_$name="
  return $rc
}

# pf_python_san_env DIR: sets the array PF_PY_SAN_ENV to what an uninstrumented python needs
# before it loads a sanitizer build of libpegaflow (PF_SAN): the runtime preloaded and reports
# written to DIR/san.* (check them with pf_python_san_check DIR). Empty without PF_SAN.
pf_python_san_env() {
  PF_PY_SAN_ENV=()
  case "${PF_SAN:-}" in
    *address*) PF_PY_SAN_ENV=(LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
                              ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0:abort_on_error=1:log_path=$1/san) ;;
    *thread*) PF_PY_SAN_ENV=(LD_PRELOAD="$(gcc -print-file-name=libtsan.so)"
                             TSAN_OPTIONS="${TSAN_OPTIONS:-}:log_path=$1/san") ;;
  esac
}

# pf_python_san_check DIR: fails the test when the python process wrote a sanitizer report.
pf_python_san_check() {
  local r
  for r in "$1"/san.*; do
    [ -e "$r" ] || continue
    head -n 40 "$r" | sed 's/^/        | /'
    pf_fail "sanitizer report from the python process: $r"
  done
}
