#!/usr/bin/env bash
# Runs p2p_e2e scenarios (tests/integration/p2p_e2e.c) in their topology; used by
# test_p2p.sh and test_p2p_faults.sh.
# P2P with real processes: MetaServer + nodes A, B (and C),
# each in its own network namespace, joined by veth pairs to a bridge in a hub namespace
# (a small star), each with its own routable --addr; the test client in a namespace of its
# own. Addresses exist only inside the namespaces created here; every namespace (and with
# it every veth) is deleted at exit, also on failure. Without root (or with
# PF_P2P_LOOPBACK=1) the nodes run on 127.0.0.1 (MetaServer), 127.0.0.2, .3, .4.
#
# Usage: p2p_netns.sh [scenario...]   (default: every scenario of p2p_e2e)
set -u
: "${PF_BIN:?}" "${PF_TESTBIN:?}"
export PF_BIN
export PF_TOP=${PF_TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
export PF_TEST_LOGDIR=${PF_TEST_LOGDIR:-$(mktemp -d "${TMPDIR:-/tmp}/pf-p2p.XXXXXX")}
echo "logs: $PF_TEST_LOGDIR"
# protected by default (docs/security.md): P2P nodes need a cluster token; a fresh one per
# run unless the auth scenario brings its own PKI and token (PF_P2P_SECURITY_DIR)
. "$PF_TOP/tests/integration/lib.sh"
if [ -z "${PF_P2P_SECURITY_DIR:-}" ]; then
  pf_cluster_token "$PF_TEST_LOGDIR" || { echo "FAIL: cannot write the cluster token"; exit 1; }
fi

id=$(( $$ % 100000 ))
hub=pfh$id
nss=()

cleanup() {
  local ns pid
  for ns in "${nss[@]}"; do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null; done
  done
  for ns in "${nss[@]}"; do ip netns del "$ns" 2>/dev/null; done
  nss=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# make_node TAG IP: namespace pf<TAG><id>, veth v<TAG><id> (inside) <-> h<TAG><id> (hub)
make_node() {
  local tag=$1 ip=$2 ns=pf$1$id
  ip netns add "$ns" || return 1
  nss+=("$ns")
  ip link add "v$tag$id" netns "$ns" type veth peer name "h$tag$id" netns "$hub" || return 1
  ip -n "$ns" addr add "$ip/24" dev "v$tag$id" || return 1
  ip -n "$ns" link set lo up && ip -n "$ns" link set "v$tag$id" up || return 1
  ip -n "$hub" link set "h$tag$id" master "br$id" && ip -n "$hub" link set "h$tag$id" up
}

setup_netns() {
  [ "$(id -u)" = 0 ] && command -v ip >/dev/null || return 1
  ip netns add "$hub" 2>/dev/null || return 1
  nss+=("$hub")
  ip -n "$hub" link add "br$id" type bridge && ip -n "$hub" link set "br$id" up || return 1
  make_node m 10.77.0.10 && make_node a 10.77.0.2 && make_node b 10.77.0.3 &&
    make_node c 10.77.0.4 && make_node t 10.77.0.100
}

mode=loopback
if [ -z "${PF_P2P_LOOPBACK:-}" ] && setup_netns; then
  mode=netns
  export PF_P2P_NS_MS=pfm$id PF_P2P_NS_A=pfa$id PF_P2P_NS_B=pfb$id PF_P2P_NS_C=pfc$id
  export PF_P2P_IP_MS=10.77.0.10 PF_P2P_IP_A=10.77.0.2 PF_P2P_IP_B=10.77.0.3 PF_P2P_IP_C=10.77.0.4
  export PF_P2P_IP_T=10.77.0.100
  export PF_P2P_NIC_A=va$id PF_P2P_NIC_B=vb$id PF_P2P_NIC_C=vc$id
  echo "topology: namespaces ${nss[*]}, bridge br$id in $hub, 10.77.0.0/24"
  ip netns exec "pft$id" "$PF_TESTBIN/p2p_e2e" "$@"
  rc=$?
else
  cleanup
  if [ -n "${PF_P2P_LOOPBACK:-}" ]; then
    echo "PF_P2P_LOOPBACK set: loopback addresses 127.0.0.1-4"
  else
    echo "no network namespaces (needs root and iproute2): loopback addresses 127.0.0.1-4"
  fi
  export PF_P2P_IP_MS=127.0.0.1 PF_P2P_IP_A=127.0.0.2 PF_P2P_IP_B=127.0.0.3 PF_P2P_IP_C=127.0.0.4
  export PF_P2P_IP_T=127.0.0.1
  "$PF_TESTBIN/p2p_e2e" "$@"
  rc=$?
fi
echo "mode: $mode, exit $rc"
exit $rc
