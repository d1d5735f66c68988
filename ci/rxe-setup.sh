#!/usr/bin/env bash
# Soft-RoCE for CI: creates an rxe RDMA device over a network interface (a veth, or the main
# interface) so the verbs backend and the verbs scenarios run without RDMA hardware.
#
#   ci/rxe-setup.sh NETDEV [NAME]   create NAME (default rxe_NETDEV) over NETDEV; prints NAME
#   ci/rxe-setup.sh --check         exit 0 when this kernel can create rxe devices, else 77
#   ci/rxe-setup.sh --delete NAME   remove an rxe device made by this script
#
# Exit status: 0 done (an existing rxe device over NETDEV is reused), 77 not possible on this
# kernel (no RDMA core / no rdma_rxe module: the verbs tests are then skipped, never passed),
# 2 usage, 1 any other failure. Needs root and iproute2's `rdma` tool.
# Afterwards:  PF_VERBS_NIC=NAME build/rel/tests/unit/net/test_verbs_dev
set -u

say() { echo "rxe-setup: $*" >&2; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }

# 0 when rdma_rxe is (or can be made) available; otherwise prints why and returns 77.
kernel_ok() {
  if ! command -v rdma >/dev/null 2>&1; then
    say "the 'rdma' tool (iproute2) is missing: apt-get install -y --no-install-recommends iproute2"
    return 77
  fi
  if [ ! -d /sys/module/rdma_rxe ]; then
    local why="no /sys/module/rdma_rxe"
    if command -v modprobe >/dev/null 2>&1; then
      if ! out=$(modprobe rdma_rxe 2>&1); then
        why="$why; modprobe rdma_rxe: ${out:-failed}"
      fi
    else
      why="$why; no modprobe (kernel without loadable modules?)"
    fi
    if [ ! -d /sys/module/rdma_rxe ]; then
      say "this kernel ($(uname -r)) cannot create soft-RoCE devices: $why"
      say "verbs tests will be skipped (exit 77); use a kernel with CONFIG_RDMA_RXE, or mlx5 hardware"
      return 77
    fi
  fi
  if ! rdma link show >/dev/null 2>&1; then
    say "'rdma link show' fails: the kernel RDMA core (ib_core) is not usable here"
    return 77
  fi
  return 0
}

[ $# -ge 1 ] || usage
case "$1" in
  -h|--help) usage ;;
  --check)
    kernel_ok
    exit $? ;;
  --delete)
    [ $# -eq 2 ] || usage
    kernel_ok || exit $?
    if rdma link delete "$2"; then say "deleted $2"; exit 0; fi
    exit 1 ;;
esac

netdev=$1
name=${2:-rxe_$netdev}
if [ "$(id -u)" != 0 ]; then
  say "must run as root (rdma link add needs CAP_NET_ADMIN)"
  exit 1
fi
kernel_ok || exit $?
if ! ip link show dev "$netdev" >/dev/null 2>&1; then
  say "no network interface '$netdev'"
  exit 1
fi
# Reuse an rxe device that already sits on this netdev.
existing=$(rdma link show 2>/dev/null | awk -v nd="$netdev" '
  { for (i = 1; i < NF; i++) if ($i == "netdev" && $(i + 1) == nd) { split($2, a, "/"); print a[1]; exit } }')
if [ -n "$existing" ]; then
  say "rxe device $existing already exists over $netdev"
  echo "$existing"
  exit 0
fi
if ! rdma link add "$name" type rxe netdev "$netdev"; then
  say "rdma link add $name type rxe netdev $netdev failed"
  exit 1
fi
# wait (bounded) for the device to appear to user space
for _ in $(seq 1 50); do
  [ -d "/sys/class/infiniband/$name" ] && break
  sleep 0.1
done
if [ ! -d "/sys/class/infiniband/$name" ]; then
  say "$name was added but /sys/class/infiniband/$name did not appear"
  exit 1
fi
say "rxe device $name over $netdev is ready; PF_VERBS_NIC=$name selects it in test_verbs_dev"
echo "$name"
