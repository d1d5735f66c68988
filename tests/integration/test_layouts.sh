#!/usr/bin/env bash
# Model layouts end to end (see tests/integration/layouts_e2e.c): MLA page-first replicas
# and layer-split shards, hybrid storage groups, and all of them through the SSD tier. The
# SSD scenario runs only where io_uring is usable (else it prints SKIP with the reason and
# the other scenarios still run).
set -euo pipefail
export PF_TEST_LOGDIR=${PF_TEST_LOGDIR:-$(mktemp -d)}
dir=$(mktemp -d "${TMPDIR:-/tmp}/pf-layouts-test.XXXXXX")
trap 'rm -rf "$dir"' EXIT
server="$PF_BIN/pegaflow-server"

# io_uring may be disabled on the host (kernel.io_uring_disabled, seccomp)
ssd=(--ssd-dir "$dir")
timeout 60 "$server" --gpu-backend sim --pool-size 16mb --sim-gpus 1 --addr 127.0.0.1:0 \
  --http-addr 127.0.0.1:0 --ssd-cache-path "$dir/probe.dat" --ssd-cache-capacity 1mb \
  >"$dir/probe.log" 2>&1 &
ppid=$!
for _ in $(seq 1 500); do
  grep -q ": ready" "$dir/probe.log" && break
  kill -0 $ppid 2>/dev/null || break
  sleep 0.02
done
if grep -q "io_uring is not usable" "$dir/probe.log"; then
  echo "SKIP (ssd scenario only): io_uring is not usable on this host"
  ssd=()
fi
kill -INT $ppid 2>/dev/null || true
wait $ppid || true
rm -f "$dir/probe.dat"

# not exec: the EXIT trap removes the SSD files
rc=0
"$PF_TESTBIN/layouts_e2e" "${ssd[@]}" "$@" || rc=$?
exit $rc
