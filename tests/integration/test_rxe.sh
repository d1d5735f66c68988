#!/usr/bin/env bash
# Real RDMA verbs over soft-RoCE: boots the rxe guest (ci/rxe-vm.sh) and runs there, against
# real rdma_rxe devices rxe0 (veth0, 10.77.0.1) and rxe1 (veth1, 10.77.0.2):
#   verbs_fake     net/test_verbs (the backend against the fake HCA; sanity of the build)
#   verbs_loop     net/test_verbs_dev on rxe0 alone (QPs looped on one device)
#   verbs_cross    net/test_verbs_dev holder rxe0, requester rxe1: registration, QP bring-up,
#                  READs of every size class byte-exact, SGE limits, remote errors, flushes,
#                  QP invalidation mid-READ, all across the veth
#   p2p            p2p_e2e with --net-backend verbs --nics rxe0,rxe1 (node A on rxe0, B on
#                  rxe1, MetaServer on 127.0.0.1): the same scenario code as on the TCP fabric
#                  (PF_RXE_SCENARIOS, default: basic kill metaserver corrupt evict)
#   gid_choice     rxe0's GID table lists an IPv6 global and a VLAN IPv4 address before
#                  10.77.0.1 (ci/rxe-vm.sh): the backend chose ::ffff:10.77.0.1 RoCE v2
#   dscp           tcpdump on veth1 (UDP 4791) during verbs_cross: every RoCE packet has
#                  TOS 0x6a (--rdma-traffic-class 106 = DSCP 26)
#   memlock_nonroot pegaflow-server as nobody: refused by name under a 16 MiB
#                  RLIMIT_MEMLOCK (64 MiB pool), healthy under 256 MiB
#   rail_down      p2p_e2e rail_down: nodes with two rails each (A rxe0+rxe2, B rxe1+rxe3);
#                  B's rail 1 (veth3) taken down under the live connection: the next fetch's
#                  READs on it fail and are re-posted on rail 0, byte-exact, the rail counted
#                  dead (pegaflow_rdma_rail_failures_total{nic="rxe3"}), no new handshake
#   first_contact  only with PF_RXE_FIRST_CONTACT=1 (about 70 s more: with it the whole test
#                  took 9.4 min under TCG on a loaded VM, inside the 800 s guest budget
#                  (PF_RXE_TIMEOUT) but too long for every make test): tests/gpu/first-contact-rdma.sh on
#                  rxe0/rxe1, as on a first RDMA host: ibv_devinfo, one P2P fetch byte-exact
#                  (p2p_e2e basic), the GIDs chosen are the RoCE v2 IPv4-mapped ones
# (rxe_cases.sh holds gid_choice, dscp, memlock_nonroot and first_contact)
# Logs: $PF_RXE_LOGS (default <build>/test-logs/rxe/), shared read-write with the guest.
# Exits 77 with a SKIP line where the guest cannot run (ci/rxe-vm.sh says why), in sanitizer
# variants (the emulated guest is too slow for them within the test budget) and with PF_RXE=0.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)

if [ -z "${PF_RXE_GUEST:-}" ]; then
  : "${PF_BIN:?}" "${PF_TESTBIN:?}"
  if [ -n "${PF_SAN:-}" ]; then
    echo "SKIP: rxe guest runs only in the rel variant (SAN=$PF_SAN would not fit the budget under emulation)"
    exit 77
  fi
  if [ "${PF_RXE:-1}" = 0 ]; then echo "SKIP: PF_RXE=0"; exit 77; fi
  O=$(dirname "$PF_BIN")
  for b in "$O/tests/unit/net/test_verbs_dev" "$O/tests/unit/net/test_verbs" "$PF_TESTBIN/p2p_e2e"; do
    [ -x "$b" ] || { echo "FAIL: $b is not built (make test-build)"; exit 1; }
  done
  export PF_RXE_LOGS=${PF_RXE_LOGS:-$O/test-logs/rxe}
  rm -rf "$PF_RXE_LOGS"
  mkdir -p "$PF_RXE_LOGS"
  echo "logs: $PF_RXE_LOGS"
  exec "$top/ci/rxe-vm.sh" --share "$PF_RXE_LOGS" --timeout "${PF_RXE_TIMEOUT:-800}" bash "$0" "$@"
fi

# ------------------------------------------------------------------ inside the guest
O=$(dirname "$PF_BIN")
logs=$PF_RXE_LOGS
fails=0
step() { # name timeout cmd...
  local name=$1 tmo=$2; shift 2
  local t0=$SECONDS
  timeout -k 5 "$tmo" "$@" >"$logs/$name.log" 2>&1
  local rc=$? dt=$((SECONDS - t0))
  local n; n=$(grep -aoE '\[  PASSED  \] [0-9]+ test' "$logs/$name.log" | grep -oE '[0-9]+' | tail -1)
  case $rc in
    0) echo "  PASS  $name  ${dt}s${n:+  ($n tests)}" ;;
    *) echo "  FAIL  $name  exit $rc after ${dt}s (log: $logs/$name.log)"
       grep -avE ' (INFO|DEBUG) ' "$logs/$name.log" | tail -n 40 | sed 's/^/        | /'
       fails=$((fails + 1)) ;;
  esac
}

rdma link show
cases="$top/tests/integration/rxe_cases.sh"
step verbs_fake 120 "$O/tests/unit/net/test_verbs"
step verbs_loop 240 env PF_VERBS_NIC=rxe0 "$O/tests/unit/net/test_verbs_dev"
step gid_choice 60 bash "$cases" gid_choice "$logs/verbs_loop.log"
sed 's/^/        /' "$logs/gid_choice.log"
step capture_start 40 bash "$cases" capture-start "$logs/roce.pcap"
step verbs_cross 240 env PF_VERBS_NIC=rxe0 PF_VERBS_NIC_B=rxe1 "$O/tests/unit/net/test_verbs_dev"
step dscp 60 bash "$cases" dscp "$logs/roce.pcap"
sed 's/^/        /' "$logs/dscp.log"
step memlock_nonroot 300 bash "$cases" memlock "$logs"
sed 's/^/        /' "$logs/memlock_nonroot.log"
mkdir -p "$logs/p2p"
# P2P nodes need a cluster token (protected by default, docs/security.md): one per run
. "$(dirname "$0")/lib.sh" && pf_cluster_token "$logs/p2p" || { echo "FAIL: no cluster token"; exit 1; }
# shellcheck disable=SC2086
step p2p 360 env PF_TEST_LOGDIR="$logs/p2p" PF_P2P_IP_MS=127.0.0.1 PF_P2P_IP_A=10.77.0.1 \
  PF_P2P_IP_B=10.77.0.2 PF_P2P_IP_C=127.0.0.4 \
  "$PF_TESTBIN/p2p_e2e" --net-backend verbs --nics rxe0,rxe1 ${PF_RXE_SCENARIOS:-basic kill metaserver corrupt evict}
grep -aE '^scenario |passed in' "$logs/p2p.log" | sed 's/^/        /'
# two rails per node (rxe0+rxe2 for A, rxe1+rxe3 for B); B's rail 1 (veth3) goes down under
# a live connection: P2P continues on rail 0, byte-exact, the rail counted dead
mkdir -p "$logs/rail_down"
step rail_down 300 env PF_TEST_LOGDIR="$logs/rail_down" PF_P2P_IP_MS=127.0.0.1 PF_P2P_IP_A=10.77.0.1 \
  PF_P2P_IP_B=10.77.0.2 PF_P2P_IP_C=127.0.0.4 PF_P2P_NIC_A=rxe0,rxe2 PF_P2P_NIC_B=rxe1,rxe3 \
  PF_P2P_RAIL_DOWN="ip link set veth3 down" PF_P2P_RAIL_UP="ip link set veth3 up" PF_P2P_RAIL_NIC=rxe3 \
  "$PF_TESTBIN/p2p_e2e" --net-backend verbs rail_down
grep -aE '^scenario |passed in|rail-[0-9]|taken down' "$logs/rail_down.log" | sed 's/^/        /'
if [ "${PF_RXE_FIRST_CONTACT:-0}" = 1 ]; then
  step first_contact 180 bash "$cases" first_contact "$logs"
  grep -aE '^(PASS|FAIL|SKIP) ' "$logs/first-contact-rdma.txt" 2>/dev/null | sed 's/^/        /'
fi
rdma statistic show link rxe1/1 2>/dev/null | head -n 3
[ $fails -eq 0 ] && echo "rxe: all passed" || echo "rxe: $fails step(s) failed"
[ $fails -eq 0 ]
