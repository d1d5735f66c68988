#!/usr/bin/env bash
# The Redis password is a secret (issue 26 item 3, docs/security.md "Secrets"): a
# redis-server with --requirepass (a random password made for this run, on a free loopback
# port, never 6379) and MetaServers at --log-level trace that get it from the URL, from
# --redis-password-file and from PEGAFLOW_REDIS_PASSWORD, each registering and answering
# through Redis (heartbeat, insert, query); a wrong password (AUTH refused, logged without
# either password) and a URL plus a file at once (refused, one line, redacted); Redis killed
# under a running MetaServer (error paths log). Then every log of the run (MetaServers,
# meta_tool, redis-server) is grepped: the password never appears; /proc/PID/cmdline of a
# MetaServer given the URL no longer holds it.
set -u
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
: "${PF_BIN:?}" "${PF_TESTBIN:?}"
MS=$PF_BIN/pegaflow-metaserver
TOOL=$PF_TESTBIN/meta_tool
RS=$(command -v redis-server || echo /usr/bin/redis-server)
RC=$(command -v redis-cli || echo /usr/bin/redis-cli)
if [ ! -x "$RS" ] || [ ! -x "$RC" ]; then
  echo "SKIP: redis-server/redis-cli not installed (ci/install-deps.sh installs redis-server)"
  exit 77
fi
pf_tmpdir
PW=$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')
WRONG=$(head -c 18 /dev/urandom | od -An -tx1 | tr -d ' \n')
[ ${#PW} = 36 ] && [ ${#WRONG} = 36 ] || pf_fail "cannot make the passwords"
(umask 077; echo "$PW" >"$PF_TMP/redis-pw"; echo "$WRONG" >"$PF_TMP/wrong-pw")

free_port() {
  python3 -c 'import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close()
    if p != 6379: print(p); break'
}
# the password reaches redis-server through a 0600 config file, not its argv
(umask 077; echo "requirepass $PW" >"$PF_TMP/redis.conf")
start_redis() {
  pf_start redis "$RS" "$PF_TMP/redis.conf" --port "$RP" --bind 127.0.0.1 --dir "$PF_TMP" \
    --save '' --appendonly no --protected-mode yes
}
rping() { REDISCLI_AUTH=$PW "$RC" -p "$RP" PING 2>/dev/null | grep -qx PONG; }
for try in 1 2 3 4 5; do
  RP=$(free_port)
  start_redis
  pf_wait_for 10 rping && break
  pf_stop redis KILL >/dev/null 2>&1
done
rping || pf_fail "redis-server did not start"
[ "$("$RC" -p "$RP" PING 2>&1)" != PONG ] || pf_fail "redis-server answers without the password"

ms_start() { # NAME args...: a MetaServer on loopback at trace level; sets T_NAME
  local n=$1; shift
  pf_start "$n" "$MS" --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --log-level trace "$@"
  local p; p=$(pf_wait_port "$n" grpc) || pf_fail "$n did not start"
  pf_wait_log "$n" ': ready$' 20 || pf_fail "$n not ready"
  eval "T_$n=127.0.0.1:$p"
}
works() { # NAME: heartbeat + insert + query through Redis
  local t; t=$(eval echo "\$T_$1")
  $TOOL "$t" heartbeat "10.1.0.$2:50055" "0000000$2-0000-4000-8000-000000000000" >>"$PF_TMP/tool.log" 2>&1 ||
    pf_fail "$1: heartbeat failed: $(tail -1 "$PF_TMP/tool.log")"
  $TOOL "$t" insert ns "10.1.0.$2:50055" "0000000$2-0000-4000-8000-000000000000" @k$2:0-9 \
    >>"$PF_TMP/tool.log" 2>&1 || pf_fail "$1: insert failed"
  $TOOL "$t" query ns @k$2:0-9 >"$PF_TMP/q.out" 2>&1 || pf_fail "$1: query failed: $(cat "$PF_TMP/q.out")"
  cat "$PF_TMP/q.out" >>"$PF_TMP/tool.log"
  grep -qx "10.1.0.$2:50055 10" "$PF_TMP/q.out" || pf_fail "$1: query answered $(cat "$PF_TMP/q.out")"
  pf_log "$1: registered and found through the password-protected Redis"
}

# from the URL; then argv no longer shows it
ms_start url --store "redis://:$PW@127.0.0.1:$RP"
works url 1
pid=$PF_PID_url
! tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "$PW" || pf_fail "/proc/$pid/cmdline still holds the password"
! tr '\0' '\n' <"/proc/$pid/environ" | grep -qF "$PW" || pf_fail "the environment holds the password"
# from a file (user "default" named in the URL)
ms_start file --store "redis://default@127.0.0.1:$RP" --redis-password-file "$PF_TMP/redis-pw"
works file 2
grep -aq 'password from --redis-password-file/PEGAFLOW_REDIS_PASSWORD' "$PF_TMP/file.log" ||
  pf_fail "no start-up line about where the password came from"
# from the environment: used, then gone from the process's environment
export PEGAFLOW_REDIS_PASSWORD=$PW
ms_start env --store "redis://127.0.0.1:$RP"
unset PEGAFLOW_REDIS_PASSWORD
works env 3
! tr '\0' '\n' <"/proc/$PF_PID_env/environ" | grep -qF "$PW" ||
  pf_fail "PEGAFLOW_REDIS_PASSWORD is still in the MetaServer's environment"
# a wrong password: the store does not work, AUTH failures are logged (without passwords)
ms_start wrong --store "redis://127.0.0.1:$RP" --redis-password-file "$PF_TMP/wrong-pw"
out=$($TOOL "$T_wrong" query ns @k1:0-9 2>&1) && pf_fail "a wrong password worked: $out"
pf_wait_log wrong 'AUTH failed' 20 || pf_fail "no AUTH failure logged"
# both a URL password and a file: refused, one line, redacted
out=$("$MS" --store "redis://:$PW@127.0.0.1:$RP" --redis-password-file "$PF_TMP/redis-pw" 2>&1); rc=$?
echo "$out" >"$PF_TMP/both.log"
[ $rc -ne 0 ] || pf_fail "URL password + file accepted"
grep -q 'give it once' "$PF_TMP/both.log" || pf_fail "URL + file: '$out'"
# Redis gone under a running MetaServer: the error paths log
pf_stop redis KILL >/dev/null 2>&1
out=$($TOOL "$T_url" insert ns 10.1.0.1:50055 00000001-0000-4000-8000-000000000000 @z:0-9 2>&1) &&
  pf_fail "insert answered with Redis down: $out"
pf_wait_log url 'redis 127.0.0.1' 20 || pf_fail "no Redis error logged"
for n in url file env wrong; do pf_stop "$n" >/dev/null 2>&1; done

# the password never appears in any log of this run (the grep does find it where it is)
grep -qF "$PW" "$PF_TMP/redis-pw" || pf_fail "grep cannot find the password in its own file"
hits=$(grep -rlaF -e "$PW" -e "$WRONG" "$PF_TMP" --exclude=redis-pw --exclude=wrong-pw --exclude=redis.conf || true)
[ -z "$hits" ] || pf_fail "the Redis password appears in: $hits"
n=$(ls "$PF_TMP"/*.log | wc -l)
pf_log "no password in any of the $n logs ($(cd "$PF_TMP" && ls *.log | tr '\n' ' '))"
echo "redis secrets: all checks passed"
