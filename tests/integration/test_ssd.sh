#!/usr/bin/env bash
# SSD tier scenarios (see tests/integration/ssd_e2e.c) and start-up errors, with SSD files
# in a temporary directory on the same file system as /tmp.
set -euo pipefail
export PF_TEST_LOGDIR=${PF_TEST_LOGDIR:-$(mktemp -d)}
dir=$(mktemp -d "${TMPDIR:-/tmp}/pf-ssd-test.XXXXXX")
trap 'rm -rf "$dir"' EXIT
server="$PF_BIN/pegaflow-server"
base=(--gpu-backend sim --pool-size 16mb --sim-gpus 1 --addr 127.0.0.1:0 --http-addr 127.0.0.1:0)

# expect_startup_error <log-substring>... -- <server args>
expect_startup_error() {
  local want=()
  while [ "$1" != "--" ]; do want+=("$1"); shift; done
  shift
  local log="$dir/startup.log" rc=0
  timeout 60 "$server" "${base[@]}" "$@" >"$log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
    echo "FAIL: server started (or hung, rc=$rc) with $*"; cat "$log"; exit 1
  fi
  for w in "${want[@]}"; do
    if ! grep -qF -- "$w" "$log"; then
      echo "FAIL: start-up log lacks '$w' for $*"; cat "$log"; exit 1
    fi
  done
  if grep -q "ready" "$log"; then echo "FAIL: server said ready with $*"; cat "$log"; exit 1; fi
  echo "  start-up error as expected: $(grep ERROR "$log" | tail -1 | cut -c26-)"
}

# io_uring may be disabled on the host (kernel.io_uring_disabled, seccomp): skip, never pass
timeout 60 "$server" "${base[@]}" --ssd-cache-path "$dir/probe.dat" --ssd-cache-capacity 1mb \
  >"$dir/probe.log" 2>&1 &
ppid=$!
for _ in $(seq 1 500); do
  grep -q ": ready" "$dir/probe.log" && break
  kill -0 $ppid 2>/dev/null || break
  sleep 0.02
done
if grep -q "io_uring is not usable" "$dir/probe.log"; then
  wait $ppid || true
  echo "SKIP: io_uring is not usable on this host: $(grep -o 'io_uring is not usable.*' "$dir/probe.log")"
  exit 77
fi
grep -q ": ready" "$dir/probe.log" || { echo "FAIL: server with an SSD cache did not start"; cat "$dir/probe.log"; kill -9 $ppid 2>/dev/null; exit 1; }
kill -INT $ppid
wait $ppid

echo "scenario startup-errors"
# capacity larger than the free space of the file system (default capacity is 512gb; ask more)
expect_startup_error "$dir/big.dat" "free space" -- --ssd-cache-path "$dir/big.dat" --ssd-cache-capacity 64tb
# several paths: directories of shard files; the error names the shard file
expect_startup_error "$dir/d1/shard-000000.dat" "free space" -- \
  --ssd-cache-path "$dir/d1" --ssd-cache-path "$dir/d2" --ssd-cache-capacity 64tb
# a path that cannot be created
expect_startup_error "/proc/pf-no-such-dir/cache.dat" "cannot" -- \
  --ssd-cache-path /proc/pf-no-such-dir/cache.dat --ssd-cache-capacity 1mb
touch "$dir/notadir"
expect_startup_error "$dir/notadir/cache.dat" -- --ssd-cache-path "$dir/notadir/cache.dat" --ssd-cache-capacity 1mb
# a capacity too small for its shards
expect_startup_error "--ssd-cache-capacity" -- --ssd-cache-path "$dir/d3" --ssd-cache-shards 4 --ssd-cache-capacity 1kb

# a file of another format version, or not ours: refused with one line naming the flag
# (never overwritten), or started empty with --ssd-reformat on
head -c 1048576 /dev/zero >"$dir/v2.dat"
printf 'PFSSDSB\0\002\0\0\0' | dd of="$dir/v2.dat" conv=notrunc status=none
expect_startup_error "$dir/v2.dat" "format version 2" "--ssd-reformat" -- \
  --ssd-cache-path "$dir/v2.dat" --ssd-cache-capacity 1mb
head -c 1048576 /dev/urandom >"$dir/foreign.dat"
cp "$dir/foreign.dat" "$dir/foreign.orig"
expect_startup_error "$dir/foreign.dat" "not a PegaFlow SSD cache file" "--ssd-reformat" -- \
  --ssd-cache-path "$dir/foreign.dat" --ssd-cache-capacity 1mb
cmp -s "$dir/foreign.dat" "$dir/foreign.orig" || { echo "FAIL: a refused file was modified"; exit 1; }
timeout 60 "$server" "${base[@]}" --ssd-cache-path "$dir/foreign.dat" --ssd-cache-capacity 1mb \
  --ssd-reformat on >"$dir/reformat.log" 2>&1 &
pid=$!
for _ in $(seq 1 500); do grep -q ": ready" "$dir/reformat.log" && break; sleep 0.02; done
grep -q ": ready" "$dir/reformat.log" && grep -q "starting it empty" "$dir/reformat.log" ||
  { echo "FAIL: --ssd-reformat on did not start empty"; cat "$dir/reformat.log"; kill -9 $pid; exit 1; }
kill -INT $pid
wait $pid
echo "  foreign files: refused (naming --ssd-reformat), started empty with --ssd-reformat on"

# directory layout: 2 paths x 2 shards -> shard-000000..3 in the two directories
timeout 60 "$server" "${base[@]}" --ssd-cache-path "$dir/p0" --ssd-cache-path "$dir/p1" \
  --ssd-cache-shards 2 --ssd-cache-capacity 8mb >"$dir/layout.log" 2>&1 &
pid=$!
for _ in $(seq 1 500); do grep -q ": ready" "$dir/layout.log" && break; sleep 0.02; done
grep -q ": ready" "$dir/layout.log" || { echo "FAIL: server with shard directories did not start"; cat "$dir/layout.log"; kill -9 $pid; exit 1; }
kill -INT $pid
wait $pid
for f in p0/shard-000000.dat p0/shard-000001.dat p1/shard-000002.dat p1/shard-000003.dat; do
  sz=$(stat -c %s "$dir/$f" 2>/dev/null || echo missing)
  [ "$sz" = 2097152 ] || { echo "FAIL: $f size $sz, want 2097152"; cat "$dir/layout.log"; exit 1; }
done
echo "  shard files: 2 paths x 2 shards of 2 MiB"

# not exec: the EXIT trap removes the SSD files
rc=0
"$PF_TESTBIN/ssd_e2e" "$dir" "$@" || rc=$?
exit $rc
