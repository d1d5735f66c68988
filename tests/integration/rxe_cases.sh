#!/usr/bin/env bash
# The rxe guest's hard cases (run by tests/integration/test_rxe.sh inside the guest, where
# ci/rxe-vm.sh put an IPv6 global address and a VLAN device with its own IPv4 address on
# each veth before `rdma link add`, and the veths' 10.77.0.x only after it):
#   rxe_cases.sh gid_choice LOG      the rxe0 GID table (printed), and LOG (a verbs run on
#                                    rxe0) shows the backend chose ::ffff:10.77.0.1 RoCE v2
#                                    (the veth's own, not the VLAN's ::ffff:10.78.0.1)
#   rxe_cases.sh capture-start PCAP  tcpdump of RoCE v2 (UDP 4791) on veth1, the first 400
#                                    packets, returns once it listens (30 s deadline); its
#                                    pid in PCAP.pid, the capture in the guest's /tmp
#   rxe_cases.sh dscp PCAP           stops the capture; every RoCE packet carried TOS 0x6a
#                                    (traffic class 106 = DSCP 26, --rdma-traffic-class)
#   rxe_cases.sh memlock DIR         pegaflow-server as nobody: with RLIMIT_MEMLOCK 16 MiB a
#                                    64 MiB pool on rxe0 is refused by name; with 256 MiB it
#                                    starts and answers /health
#   rxe_cases.sh first_contact DIR   tests/gpu/first-contact-rdma.sh on rxe0/rxe1 (devinfo, a
#                                    P2P fetch byte-exact, the GIDs chosen); output in DIR
# Needs PF_BIN (the directory of pegaflow-server). Exit 0 when the case holds.
set -u
case=${1:?case}

fail() { echo "FAIL: $*"; exit 1; }

case $case in
gid_choice)
  log=${2:?log}
  d=/sys/class/infiniband/rxe0/ports/1
  # the table has gid_tbl_len (1024 on rxe) entries: one grep over all, then the few set ones
  grep -H -v '^0000:0000:0000:0000:0000:0000:0000:0000$' "$d"/gids/* 2>/dev/null |
    while IFS=: read -r f v; do
      i=${f##*/}
      echo "rxe0 GID[$i] $v $(cat "$d/gid_attrs/types/$i" 2>/dev/null) $(cat "$d/gid_attrs/ndevs/$i" 2>/dev/null)"
    done
  grep -aoE 'verbs NIC rxe0: .* GID\[[0-9]+\] [^ ]+ \([^)]*\)' "$log" | sed 's/ NUMA.*//' | sort -u
  grep -aqE 'verbs NIC rxe0: .* GID\[[0-9]+\] ::ffff:10\.77\.0\.1 \(RoCE v2\)' "$log" ||
    fail "rxe0 did not choose ::ffff:10.77.0.1 RoCE v2"
  echo "chose ::ffff:10.77.0.1 RoCE v2 among the IPv6 global and VLAN entries"
  ;;
capture-start)
  pcap=${2:?pcap}
  command -v tcpdump >/dev/null || fail "no tcpdump (ci/install-deps.sh installs it)"
  # the first 400 packets, into the guest's tmpfs: a capture of every packet written through
  # the 9p share slowed the emulated guest's READs tenfold
  cap=/tmp/pf-rxe-${pcap##*/}
  echo "$cap" >"$pcap.where"
  tcpdump -i veth1 -n -s 96 -c 400 -w "$cap" 'udp port 4791' 2>"$pcap.err" &
  echo $! >"$pcap.pid"
  end=$((SECONDS + 30))
  until grep -q 'listening on' "$pcap.err" 2>/dev/null; do
    kill -0 "$(cat "$pcap.pid")" 2>/dev/null || fail "tcpdump exited: $(cat "$pcap.err")"
    [ $SECONDS -lt $end ] || fail "tcpdump not listening after 30 s"
    sleep 0.2
  done
  ;;
dscp)
  pcap=${2:?pcap}
  pid=$(cat "$pcap.pid")
  kill -INT "$pid" 2>/dev/null
  end=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    [ $SECONDS -lt $end ] || fail "tcpdump did not stop"
    sleep 0.2
  done
  cap=$pcap
  [ -s "$pcap.where" ] && cap=$(cat "$pcap.where")
  tcpdump -r "$cap" -n -v 2>/dev/null >"$pcap.txt"
  total=$(grep -c 'proto UDP' "$pcap.txt")
  ok=$(grep 'proto UDP' "$pcap.txt" | grep -c 'tos 0x6a')
  echo "RoCE v2 packets on veth1: $total, with TOS 0x6a (DSCP 26): $ok"
  grep 'proto UDP' "$pcap.txt" | grep -v 'tos 0x6a' | head -n 3
  [ "$total" -gt 0 ] || fail "no RoCE v2 packet captured"
  [ "$ok" -eq "$total" ] || fail "$((total - ok)) RoCE packet(s) without DSCP 26"
  ;;
memlock)
  out=${2:?dir}
  : "${PF_BIN:?}"
  # --insecure-cluster: nobody cannot read the run's 0600 token file, and this case is
  # about the memlock check (the guest's network reaches nothing but the guest)
  args=(--gpu-backend sim --net-backend verbs --nics rxe0 --metaserver-addr http://127.0.0.1:9
        --insecure-cluster --addr 10.77.0.1:50199 --pool-size 64mb --http-addr 127.0.0.1:19391)
  # nobody cannot reach a checkout inside a 0700 directory (a fresh clone in mktemp -d):
  # run a staged copy of the binary from a directory nobody may enter
  stage=$(mktemp -d /tmp/pf-memlock.XXXXXX) || fail "mktemp"
  chmod 755 "$stage" && install -m 755 "$PF_BIN/pegaflow-server" "$stage/" ||
    fail "cannot stage pegaflow-server in $stage"
  run_as_nobody() { # memlock-KiB; execs: call it in a subshell (or with &), its pid is the server's
    exec setpriv --reuid=nobody --regid=nogroup --clear-groups bash -c \
      'ulimit -l "$1" || exit 90; shift; exec "$@"' _ "$1" "$stage/pegaflow-server" "${args[@]}"
  }
  (run_as_nobody 16384) >"$out/memlock-refused.log" 2>&1
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 90 ] || fail "started (or could not set the limit) with 16 MiB: exit $rc"
  grep -a 'RLIMIT_MEMLOCK' "$out/memlock-refused.log" | head -n 1
  grep -aq 'RLIMIT_MEMLOCK.*ulimit -l' "$out/memlock-refused.log" ||
    fail "the refusal does not say what to raise (log: $out/memlock-refused.log)"
  run_as_nobody 262144 >"$out/memlock-ok.log" 2>&1 &
  pid=$!
  end=$((SECONDS + 180))
  until curl -fs -m 5 http://127.0.0.1:19391/health >/dev/null 2>&1; do
    kill -0 $pid 2>/dev/null || fail "exited with a 256 MiB limit (log: $out/memlock-ok.log)"
    [ $SECONDS -lt $end ] || { kill $pid; fail "no /health within 180 s"; }
    sleep 0.5
  done
  grep -aq 'verbs NIC rxe0' "$out/memlock-ok.log" || { kill $pid; fail "no verbs NIC in the log"; }
  echo "as nobody with RLIMIT_MEMLOCK 256 MiB: started on rxe0 and healthy"
  kill -TERM $pid
  wait $pid || fail "exit $? after SIGTERM (log: $out/memlock-ok.log)"
  rm -rf "$stage"
  ;;
first_contact)
  # tests/gpu/first-contact-rdma.sh on rxe0 (node A, 10.77.0.1) and rxe1 (node B, 10.77.0.2):
  # ibv_devinfo, one P2P fetch byte-exact, the GIDs chosen. Its build directory is PF_BIN's
  # parent (already built on the host); logs under that build's test-logs/.
  out=${2:?dir}
  b=$(cd "$PF_BIN/.." && pwd)
  PF_BUILD=$b PF_FIRST_CONTACT_NO_BUILD=1 PF_RDMA_NICS=rxe0,rxe1 \
    bash "$(dirname "$0")/../gpu/first-contact-rdma.sh" >"$out/first-contact-rdma.txt" 2>&1
  rc=$?
  cat "$out/first-contact-rdma.txt"
  [ $rc -eq 0 ] || fail "first-contact-rdma.sh exit $rc"
  ;;
*) fail "unknown case $case" ;;
esac
