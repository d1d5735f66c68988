#!/usr/bin/env bash
# Soft-RoCE in a qemu guest: runs a command where real rdma_rxe devices exist, on a host whose
# kernel has no RDMA support (our VMs).
#
#   ci/rxe-vm.sh [options] CMD [ARG...]   boot the guest, run CMD there, exit with CMD's status
#   ci/rxe-vm.sh [options] --shell        an interactive shell in the guest (serial console)
#   ci/rxe-vm.sh --prepare                only build the cached pieces (kernel, initramfs, probe)
#   ci/rxe-vm.sh --check                  exit 0 when the guest can run here, else 77 and why
#
# Options: --share DIR  also share host DIR read-write at the same path in the guest (repeat
#          for several; the guest's writes elsewhere vanish with it); --timeout SECS  whole run
#          (default $PF_RXE_VM_TIMEOUT or 900); --mem SIZE  guest memory (default 3G).
#
# The guest: Debian's 6.1 kernel (linux-image-amd64, fetched with `apt-get download` and
# unpacked under build/rxe-vm/, never installed), an initramfs of busybox-static and the
# modules below, the host's / shared read-only over virtio-9p with a tmpfs overlay on top (so
# host-built binaries and the host's rdma-core, librxe included, run unchanged), CMD run in
# the caller's directory with the caller's PF_* / PEGAFLOW_* environment. No network device
# reaches outside the guest (-nic none); inside it a veth pair veth0 10.77.0.1/24 <-> veth1
# 10.77.0.2/24 carries rxe0 (over veth0) and rxe1 (over veth1), a second pair veth2
# 10.77.1.1 <-> veth3 10.77.1.2 carries rxe2 and rxe3 (a second rail), all in the initial network
# namespace (the 6.1 rxe driver listens only there), with policy routing so that RoCEv2
# traffic between the two local addresses crosses the veth instead of short-cutting
# through lo. KVM is used only when a cached probe showed that this kernel boots with it,
# else TCG (software emulation).
#
# Exit status: CMD's; 77 with a SKIP line when the guest cannot run here (no qemu, no
# busybox-static, apt cannot fetch the kernel, the guest did not come up); 124 on timeout.
# Cache: build/rxe-vm/ (PF_RXE_VM_DIR); delete it to rebuild.
set -u

top=$(cd "$(dirname "$0")/.." && pwd)
dir=${PF_RXE_VM_DIR:-$top/build/rxe-vm}
MODS=(virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci 9pnet
      9pnet_virtio netfs fscache 9p overlay veth crc32_generic udp_tunnel ip6_udp_tunnel
      ib_core ib_uverbs rdma_rxe configfs ib_cm iw_cm rdma_cm rdma_ucm)
# loaded when the kernel package has them (the VLAN case of the guest: 802.1Q and its deps)
OPT_MODS=(llc stp garp mrp 8021q)

say() { echo "rxe-vm: $*" >&2; }
skip() { echo "SKIP: rxe-vm: $*"; exit 77; }

# ------------------------------------------------------------------ inside the guest (stage 2)
# Runs from the overlay root as PID 1 after switch_root: full host userland.
if [ "${1:-}" = --guest-stage2 ]; then
  job=$2
  export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
  mount -t proc proc /proc; mount -t sysfs sys /sys
  mount -t devtmpfs dev /dev; mkdir -p /dev/pts /dev/shm
  mount -t devpts devpts /dev/pts; mount -t tmpfs shm /dev/shm
  # /tmp stays the overlay's (the host's /tmp, writes kept in the guest): a checkout under
  # /tmp must stay visible. /run is fresh (netns mounts, no host state).
  mount -t tmpfs run /run
  mount -t configfs configfs /sys/kernel/config 2>/dev/null
  # the read-write shares (the job directory first), after the tmpfs mounts they may sit in
  for a in $(cat /proc/cmdline); do
    case $a in pfshare*=*)
      mkdir -p "${a#*=}"
      mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 "${a%%=*}" "${a#*=}" ||
        { echo "rxe-vm guest: 9p mount of ${a#*=} failed"; reboot -f; } ;;
    esac
  done
  stty -onlcr 2>/dev/null
  ulimit -l unlimited
  exec </dev/null
  fail() { echo "rxe-vm guest: $*"; echo 200 >"$job/rc"; sync; reboot -f; }
  ip link set lo up
  ip link add veth0 type veth peer name veth1 || fail "veth"
  # The GID choice's hard cases (docs/net.md "GID choice"): an IPv6 global address on each
  # veth and (where the kernel has 802.1Q) a VLAN device with its own IPv4 address on each
  # (8021q brings it up with the veth), in place before `rdma link add`; the 10.77.0.x
  # addresses only after it. The rxe GID tables then list the IPv6 and the VLAN's IPv4
  # entries ahead of the veth's IPv4 one, as mlx5 tables list SLAAC and VLAN addresses in
  # boot order, and the backend must still choose ::ffff:10.77.0.x RoCE v2 on the veth
  # (tests/integration/rxe_cases.sh gid_choice; the VLAN addresses are not routed here).
  ip -6 addr add 2001:db8:77::1/64 dev veth0 nodad && ip -6 addr add 2001:db8:77::2/64 dev veth1 nodad ||
    fail "IPv6 addresses"
  if ip link add link veth0 name veth0.77 type vlan id 77 2>/dev/null; then
    ip link add link veth1 name veth1.77 type vlan id 77 && ip addr add 10.78.0.1/24 dev veth0.77 &&
      ip addr add 10.78.0.2/24 dev veth1.77 || fail "VLAN devices"
  else
    echo "rxe-vm guest: no 802.1Q in this kernel: the VLAN GID case is not set up"
  fi
  ip link set veth0 up && ip link set veth1 up || fail "links up"
  rdma link add rxe0 type rxe netdev veth0 && rdma link add rxe1 type rxe netdev veth1 ||
    fail "rdma link add"
  ip addr add 10.77.0.1/24 dev veth0 && ip addr add 10.77.0.2/24 dev veth1 || fail "addresses"
  # Both addresses are local: without this, 10.77.0.1 -> 10.77.0.2 goes through lo, where no
  # rxe device listens. Packets arriving on a veth are delivered locally (pref 10); locally
  # generated ones from .1/.2 leave through their own veth (pref 20); the local table moves
  # behind them (pref 100).
  for i in 0 1; do sysctl -qw net.ipv4.conf.veth$i.accept_local=1 net.ipv4.conf.veth$i.rp_filter=0; done
  sysctl -qw net.ipv4.conf.all.rp_filter=0
  ip rule add pref 10 iif veth0 lookup local && ip rule add pref 10 iif veth1 lookup local &&
    ip rule add pref 100 lookup local && ip rule del pref 0 lookup local &&
    ip rule add pref 20 from 10.77.0.1 lookup 101 && ip rule add pref 20 from 10.77.0.2 lookup 102 &&
    ip route add 10.77.0.2 dev veth0 src 10.77.0.1 table 101 &&
    ip route add 10.77.0.1 dev veth1 src 10.77.0.2 table 102 || fail "policy routing"
  # A second rail per node for the rail_down case (tests/integration/test_rxe.sh): veth2
  # 10.77.1.1 (rxe2) <-> veth3 10.77.1.2 (rxe3), routed across the veth the same way.
  ip link add veth2 type veth peer name veth3 && ip link set veth2 up && ip link set veth3 up &&
    rdma link add rxe2 type rxe netdev veth2 && rdma link add rxe3 type rxe netdev veth3 &&
    ip addr add 10.77.1.1/24 dev veth2 && ip addr add 10.77.1.2/24 dev veth3 || fail "rail 2"
  for i in 2 3; do sysctl -qw net.ipv4.conf.veth$i.accept_local=1 net.ipv4.conf.veth$i.rp_filter=0; done
  ip rule add pref 10 iif veth2 lookup local && ip rule add pref 10 iif veth3 lookup local &&
    ip rule add pref 20 from 10.77.1.1 lookup 103 && ip rule add pref 20 from 10.77.1.2 lookup 104 &&
    ip route add 10.77.1.2 dev veth2 src 10.77.1.1 table 103 &&
    ip route add 10.77.1.1 dev veth3 src 10.77.1.2 table 104 || fail "policy routing (rail 2)"
  for _ in $(seq 1 100); do
    [ -e /sys/class/infiniband/rxe0/ports/1/state ] && [ -e /sys/class/infiniband/rxe1/ports/1/state ] &&
      [ -e /sys/class/infiniband/rxe3/ports/1/state ] &&
      grep -q ACTIVE /sys/class/infiniband/rxe2/ports/1/state &&
      grep -q ACTIVE /sys/class/infiniband/rxe3/ports/1/state &&
      grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state &&
      grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state && break
    sleep 0.1
  done
  grep -q ACTIVE /sys/class/infiniband/rxe1/ports/1/state || fail "rxe ports not ACTIVE"
  # the caller's environment and working directory
  set -a; . "$job/env"; set +a
  export PF_RXE_GUEST=1 HOME=/root
  cd "$(cat "$job/cwd")" || fail "no working directory"
  echo "rxe-vm guest: $(uname -r), $(nproc) CPUs, rxe0 (veth0 10.77.0.1) rxe1 (veth1 10.77.0.2) rxe2 (veth2 10.77.1.1) rxe3 (veth3 10.77.1.2) ready"
  if [ -e "$job/shell" ]; then
    setsid -c bash -i </dev/ttyS0 >/dev/ttyS0 2>&1
    rc=$?
  else
    bash "$job/cmd"
    rc=$?
  fi
  echo "$rc" >"$job/rc.tmp" && mv "$job/rc.tmp" "$job/rc"
  sync
  reboot -f
fi

# ------------------------------------------------------------------ host side
timeout_s=${PF_RXE_VM_TIMEOUT:-900}
mem=${PF_RXE_VM_MEM:-3G}
shares=()
mode=run
while [ $# -gt 0 ]; do
  case "$1" in
    --share) shares+=("$(cd "$2" && pwd)") || exit 2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --shell) mode=shell; shift ;;
    --prepare) mode=prepare; shift ;;
    --check) mode=check; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    --) shift; break ;;
    -*) say "unknown option $1"; exit 2 ;;
    *) break ;;
  esac
done
if [ "$mode" = run ] && [ $# -eq 0 ]; then say "no command (see --help)"; exit 2; fi

[ "$(id -u)" = 0 ] || skip "needs root (9p export of / with the host's permissions)"
QEMU=$(command -v qemu-system-x86_64) || skip "no qemu-system-x86_64 (apt-get install qemu-system-x86)"
BB=
for b in /bin/busybox /usr/bin/busybox; do
  if [ -x "$b" ] && LC_ALL=C file -L "$b" 2>/dev/null | grep -q 'statically linked'; then BB=$b; break; fi
  # without file(1): busybox-static's binary has no ELF interpreter
  if [ -x "$b" ] && ! grep -qa 'ld-linux' "$b"; then BB=$b; break; fi
done
[ -n "$BB" ] || skip "no static busybox (apt-get install busybox-static)"

mkdir -p "$dir" || skip "cannot create $dir"
exec 9>"$dir/.lock"
flock -w 600 9 || skip "another rxe-vm run held $dir/.lock for 10 minutes"

# Kernel: the newest linux-image-6.1.*-amd64 that apt knows, as linux-image-amd64 names it.
kernel() {
  [ -s "$dir/vmlinuz" ] && [ -s "$dir/kver" ] && [ -d "$dir/modules" ] && [ -e "$dir/modules/.opt" ] &&
    return 0
  local pkg tmp deb
  pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ { print $2; exit }')
  [ -n "$pkg" ] || skip "apt knows no linux-image-amd64 (run apt-get update; needs Debian's archive)"
  tmp=$(mktemp -d "$dir/.kernel.XXXXXX")
  say "fetching $pkg with apt-get download (cached in $dir)"
  if ! (cd "$tmp" && timeout 300 apt-get download -q -o APT::Sandbox::User=root "$pkg") >"$tmp/apt.log" 2>&1; then
    local why; why=$(tail -n 1 "$tmp/apt.log")
    rm -rf "$tmp"
    skip "apt-get download $pkg failed: $why"
  fi
  deb=$(ls "$tmp"/*.deb)
  dpkg -x "$deb" "$tmp/root" || { rm -rf "$tmp"; skip "dpkg -x $deb failed"; }
  local kver; kver=$(ls "$tmp/root/lib/modules" | head -n 1)
  mkdir -p "$tmp/modules"
  for m in "${MODS[@]}"; do
    local f; f=$(find "$tmp/root/lib/modules/$kver" -name "$m.ko" -o -name "$m.ko.xz" | head -n 1)
    [ -n "$f" ] || { rm -rf "$tmp"; skip "$pkg has no module $m"; }
    case $f in *.xz) xz -dc "$f" >"$tmp/modules/$m.ko" ;; *) cp "$f" "$tmp/modules/$m.ko" ;; esac
  done
  for m in "${OPT_MODS[@]}"; do
    local f; f=$(find "$tmp/root/lib/modules/$kver" -name "$m.ko" -o -name "$m.ko.xz" | head -n 1)
    case $f in "") say "$pkg has no module $m (optional)" ;;
      *.xz) xz -dc "$f" >"$tmp/modules/$m.ko" ;; *) cp "$f" "$tmp/modules/$m.ko" ;; esac
  done
  touch "$tmp/modules/.opt"
  rm -rf "$dir/modules"
  mv "$tmp/modules" "$dir/modules" && cp "$tmp/root/boot/vmlinuz-$kver" "$dir/vmlinuz.tmp" &&
    mv "$dir/vmlinuz.tmp" "$dir/vmlinuz" && echo "$kver" >"$dir/kver" || { rm -rf "$tmp"; skip "cannot write $dir"; }
  rm -rf "$tmp" "$dir/initrd.gz" "$dir/kvm-probe"
}

# Initramfs (stage 1): busybox, the modules, an init that mounts the host's / read-only over
# 9p under a tmpfs overlay and switch_roots into this script's stage 2.
initrd() {
  [ -s "$dir/initrd.gz" ] && [ "$dir/initrd.gz" -nt "$top/ci/rxe-vm.sh" ] && return 0
  local tmp; tmp=$(mktemp -d "$dir/.initrd.XXXXXX")
  mkdir -p "$tmp/bin" "$tmp/proc" "$tmp/sys" "$tmp/dev" "$tmp/host" "$tmp/ovl" "$tmp/newroot" "$tmp/job" "$tmp/mod"
  cp "$BB" "$tmp/bin/busybox"
  for a in sh mount umount insmod mkdir switch_root reboot echo cat sleep; do ln -s busybox "$tmp/bin/$a"; done
  cp "$dir"/modules/*.ko "$tmp/mod/"
  {
    echo '#!/bin/sh'
    echo 'export PATH=/bin'
    echo 'mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev'
    echo 'die() { echo "rxe-vm stage1: $*"; reboot -f; }'
    echo "for m in ${MODS[*]}; do insmod /mod/\$m.ko || die \"insmod \$m\"; done"
    echo "for m in ${OPT_MODS[*]}; do [ -e /mod/\$m.ko ] && insmod /mod/\$m.ko; done"
    echo 'for a in $(cat /proc/cmdline); do case $a in pfjob=*) job=${a#pfjob=} ;; pfstage2=*) stage2=${a#pfstage2=} ;; pfprobe=1) probe=1 ;; esac; done'
    echo '[ -n "$probe" ] && { echo PF-RXE-VM-PROBE-OK; reboot -f; }'
    echo 'mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,ro hostroot /host || die "9p mount of /"'
    echo 'mount -t tmpfs -o size=50% ovl /ovl && mkdir -p /ovl/up /ovl/work || die tmpfs'
    echo 'mount -t overlay -o lowerdir=/host,upperdir=/ovl/up,workdir=/ovl/work overlay /newroot || die overlay'
    echo 'umount /proc /sys /dev'
    echo 'exec switch_root /newroot /bin/bash "$stage2" --guest-stage2 "$job"'
  } >"$tmp/init"
  chmod +x "$tmp/init"
  (cd "$tmp" && find . -mindepth 1 | "$BB" cpio -o -H newc 2>/dev/null | gzip -1) >"$dir/initrd.gz.tmp" &&
    mv "$dir/initrd.gz.tmp" "$dir/initrd.gz" || { rm -rf "$tmp"; skip "cannot build the initramfs"; }
  rm -rf "$tmp"
}

base_args() { # accel
  echo -machine q35 -accel "$1" -cpu max -smp 2 -m "$mem" -nic none -nodefaults -no-reboot \
    -display none -kernel "$dir/vmlinuz" -initrd "$dir/initrd.gz"
}

# KVM on our VMs is a nested variant on which this kernel hangs at boot: use it only when a
# probe boot (stage 1 only, 30 s) printed its marker. Cached per kernel.
accel() {
  if [ -s "$dir/kvm-probe" ]; then cat "$dir/kvm-probe"; return; fi
  local a=tcg
  if [ -r /dev/kvm ] && [ -w /dev/kvm ] && [ -z "${PF_RXE_VM_NO_KVM:-}" ]; then
    local out
    # shellcheck disable=SC2046
    out=$(timeout -k 5 30 "$QEMU" $(base_args kvm) -serial stdio \
      -append "console=ttyS0 quiet loglevel=1 panic=-1 pfprobe=1" </dev/null 2>&1)
    grep -q PF-RXE-VM-PROBE-OK <<<"$out" && a=kvm
    say "KVM probe: $([ $a = kvm ] && echo boots || echo 'did not boot in 30 s'), using $a"
  fi
  echo "$a" >"$dir/kvm-probe"
  echo "$a"
}

kernel
initrd
acc=$(accel)
case $mode in
  prepare) say "ready in $dir: kernel $(cat "$dir/kver"), accelerator $acc"; exit 0 ;;
  check) echo "rxe-vm: can run (kernel $(cat "$dir/kver"), $acc)"; exit 0 ;;
esac

job=$(mktemp -d "$dir/job.XXXXXX")
trap 'rm -rf "$job"' EXIT
pwd >"$job/cwd"
# the caller's variables for the test (PF_*, PEGAFLOW_*, sanitizer options), quoted for sh
env | grep -E '^(PF_|PEGAFLOW_|ASAN_|LSAN_|UBSAN_|TSAN_)[A-Za-z0-9_]*=' | grep -v '^PF_RXE_VM' |
  while IFS='=' read -r k v; do printf "%s=%q\n" "$k" "$v"; done >"$job/env"
if [ "$mode" = shell ]; then
  touch "$job/shell"
else
  { printf 'exec'; printf ' %q' "$@"; echo; } >"$job/cmd"
fi
shares=("$job" "${shares[@]}")
dev_args=(-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap")
append="console=ttyS0 quiet loglevel=1 panic=-1 pfjob=$job pfstage2=$top/ci/rxe-vm.sh"
for i in "${!shares[@]}"; do
  dev_args+=(-virtfs "local,path=${shares[$i]},mount_tag=pfshare$i,security_model=none,multidevs=remap")
  append+=" pfshare$i=${shares[$i]}"
done
say "booting ($acc, $mem, timeout ${timeout_s}s): $*"
# shellcheck disable=SC2046
if [ "$mode" = shell ]; then
  timeout --foreground -k 5 "$timeout_s" "$QEMU" $(base_args "$acc") "${dev_args[@]}" -serial mon:stdio -append "$append"
  qrc=$?
else
  # --foreground: qemu stays in our process group, so a kill of the caller's group (the test
  # runner's timeout) reaches it
  timeout --foreground -k 5 "$timeout_s" "$QEMU" $(base_args "$acc") "${dev_args[@]}" -serial stdio \
    -append "$append" </dev/null 2>&1 | sed -u 's/\r$//'
  qrc=${PIPESTATUS[0]}
fi
if [ -s "$job/rc" ]; then
  rc=$(cat "$job/rc")
  [ "$rc" = 200 ] && skip "the guest could not set up soft-RoCE (see above)"
  exit "$rc"
fi
case $qrc in
  124|137) say "timed out after ${timeout_s}s"; exit 124 ;;
esac
skip "the guest ended (qemu exit $qrc) before the command finished: see the console output above"
