#!/usr/bin/env bash
# First contact with an RDMA fabric (docs/net.md "First contact with an RDMA NIC"; sibling of
# tests/gpu/first-contact.sh). One prepared script for the first host with an RDMA NIC;
# prints one line per check (PASS / FAIL / SKIP name: detail):
#   devinfo   ibv_devinfo: every RDMA device, its ports' state, link layer, MTU, firmware
#   build     make all and the P2P end-to-end driver (log under <build>/test-logs/rdma-first-contact/)
#   nics      the two NICs the servers use (PF_RDMA_NICS=A,B; default the first two ACTIVE
#             devices, or the first one twice) and their IPv4 addresses (PF_RDMA_IPS=A,B;
#             default each device's net device address)
#   fetch     tests/integration/p2p_e2e basic with --net-backend verbs: a MetaServer and two
#             pegaflow-server nodes on those NICs; A saves seeded random KV, B fetches it with
#             RDMA READs (QueryPrefetch -> Ready), loads it and compares every byte
#   gid       the GID each server chose (its start log: "verbs NIC <dev>: ... GID[i] <gid>
#             (<type>)"), and that it is the RoCE v2 IPv4-mapped GID of the NIC's address
#             when the link layer is Ethernet
# Without an RDMA device (no ibv_devinfo, or it lists none) it prints a SKIP line with the
# reason and exits 77. Exit: 0 all passed, 1 a check failed, 77 skip.
# Environment: PF_RDMA_NICS, PF_RDMA_IPS (above), PF_BUILD (build dir, default build/rel),
# PF_TEST_SEED, JOBS (make -j), PF_FIRST_CONTACT_NO_BUILD=1 (use what PF_BUILD has).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 1
O=${PF_BUILD:-build/rel}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
nfail=0
say() { # status name detail
  echo "$1 $2: $3"
  [ "$1" = FAIL ] && nfail=$((nfail + 1))
  return 0
}
finish() {
  if [ $nfail -gt 0 ]; then
    echo "rdma first contact: $nfail check(s) FAILED (logs: $logs)"
    exit 1
  fi
  echo "rdma first contact: all checks passed (logs: $logs)"
  exit 0
}

# devinfo ---------------------------------------------------------------------------------
if ! command -v ibv_devinfo >/dev/null 2>&1; then
  echo "SKIP devinfo: no RDMA tools here (ibv_devinfo not found; apt-get install ibverbs-utils)"
  exit 77
fi
devs=$(ibv_devinfo -l 2>/dev/null | sed -n 's/^[[:space:]]\+//p' | grep -v ':' )
if [ -z "$devs" ]; then
  echo "SKIP devinfo: no RDMA device here (ibv_devinfo -l lists none)"
  exit 77
fi
active=
summary=
for d in $devs; do
  info=$(ibv_devinfo -d "$d" 2>&1)
  fw=$(echo "$info" | sed -n 's/.*fw_ver:[[:space:]]*//p' | head -n 1)
  st=$(echo "$info" | sed -n 's/.*state:[[:space:]]*\([A-Z_]*\).*/\1/p' | head -n 1)
  ll=$(echo "$info" | sed -n 's/.*link_layer:[[:space:]]*//p' | head -n 1)
  mtu=$(echo "$info" | sed -n 's/.*active_mtu:[[:space:]]*\([0-9]*\).*/\1/p' | head -n 1)
  summary="$summary${summary:+; }$d port 1 ${st:-?} ${ll:-?} MTU ${mtu:-?} fw ${fw:-?}"
  [ "$st" = PORT_ACTIVE ] && active="$active $d"
done
say PASS devinfo "$summary"
[ -n "$active" ] || { say FAIL devinfo "no device has an ACTIVE port 1"; logs=none; finish; }

# build -----------------------------------------------------------------------------------
logs=$O/test-logs/rdma-first-contact
mkdir -p "$logs" || exit 1
if [ -n "${PF_FIRST_CONTACT_NO_BUILD:-}" ]; then
  say PASS build "using $O as built (PF_FIRST_CONTACT_NO_BUILD)"
elif make --no-print-directory -j"$jobs" all "$O/tests/integration/p2p_e2e" >"$logs/build.log" 2>&1; then
  say PASS build "make all + p2p_e2e ($O)"
else
  say FAIL build "make failed (tail of $logs/build.log: $(tail -n 1 "$logs/build.log"))"
  finish
fi
for b in "$O/bin/pegaflow-server" "$O/bin/pegaflow-metaserver" "$O/tests/integration/p2p_e2e"; do
  [ -x "$b" ] || { say FAIL build "$b is missing"; finish; }
done

# nics ------------------------------------------------------------------------------------
ip_of() { # device -> the IPv4 address of its port 1 net device
  local nd
  for f in /sys/class/infiniband/"$1"/ports/1/gid_attrs/ndevs/*; do
    nd=$(cat "$f" 2>/dev/null) && [ -n "$nd" ] && break
  done
  [ -n "${nd:-}" ] || nd=$(ls /sys/class/infiniband/"$1"/device/net 2>/dev/null | head -n 1)
  [ -n "${nd:-}" ] && ip -4 -o addr show dev "$nd" scope global 2>/dev/null |
    awk '{print $4}' | cut -d/ -f1 | head -n 1
}
if [ -n "${PF_RDMA_NICS:-}" ]; then
  na=${PF_RDMA_NICS%%,*} nb=${PF_RDMA_NICS#*,}
else
  set -- $active
  na=$1 nb=${2:-$1}
fi
if [ -n "${PF_RDMA_IPS:-}" ]; then
  ipa=${PF_RDMA_IPS%%,*} ipb=${PF_RDMA_IPS#*,}
else
  ipa=$(ip_of "$na") ipb=$(ip_of "$nb")
fi
if [ -z "$ipa" ] || [ -z "$ipb" ]; then
  say FAIL nics "no IPv4 address on the net device of $na ($ipa) or $nb ($ipb): set PF_RDMA_IPS=A,B"
  finish
fi
[ "$na" = "$nb" ] && [ "$ipa" = "$ipb" ] && one=" (one NIC: both servers on it, the NIC loops back)"
say PASS nics "node A on $na ($ipa), node B on $nb ($ipb)${one:-}"

# fetch -----------------------------------------------------------------------------------
. "$top/tests/integration/lib.sh" && pf_cluster_token "$logs" || { say FAIL fetch "no cluster token"; finish; }
rm -f "$logs"/node-*.log
t0=$SECONDS
PF_BIN=$(cd "$O/bin" && pwd) PF_TEST_LOGDIR=$(cd "$logs" && pwd) PF_P2P_IP_MS=127.0.0.1 \
  PF_P2P_IP_A=$ipa PF_P2P_IP_B=$ipb PF_P2P_IP_C=127.0.0.4 \
  timeout -k 5 600 "$O/tests/integration/p2p_e2e" --net-backend verbs --nics "$na,$nb" basic \
  >"$logs/fetch.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -aq 'passed in' "$logs/fetch.log"; then
  say PASS fetch "B fetched A's seeded blocks over RDMA READs $na -> $nb and loaded them byte-exact ($((SECONDS - t0)) s; $logs/fetch.log)"
else
  say FAIL fetch "p2p_e2e basic exit $rc: $(grep -avE ' (INFO|DEBUG) ' "$logs/fetch.log" | tail -n 2 | tr '\n' ' ')"
fi

# gid -------------------------------------------------------------------------------------
for pair in "$na:$ipa" "$nb:$ipb"; do
  d=${pair%%:*} a=${pair#*:}
  line=$(grep -ahoE "verbs NIC $d: .* GID\[[0-9]+\] [^ ]+ \([^)]*\)" "$logs"/*.log 2>/dev/null |
    sed 's/ NUMA.*//' | sort -u | head -n 1)
  if [ -z "$line" ]; then
    say FAIL gid "no server log names the GID it chose on $d"
    continue
  fi
  gid=$(echo "$line" | sed -E 's/.*GID\[[0-9]+\] ([^ ]+) .*/\1/')
  idx=$(echo "$line" | sed -E 's/.*GID\[([0-9]+)\].*/\1/')
  typ=$(echo "$line" | sed -E 's/.*\(([^)]*)\)$/\1/')
  ll=$(cat /sys/class/infiniband/"$d"/ports/1/link_layer 2>/dev/null)
  if [ "$ll" = Ethernet ] && [ "$gid" != "::ffff:$a" ]; then
    say FAIL gid "$d chose GID[$idx] $gid ($typ), not ::ffff:$a (RoCE v2 of its address)"
  else
    say PASS gid "$d: GID[$idx] $gid ($typ), link layer ${ll:-?}"
  fi
done
finish
