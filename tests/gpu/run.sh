#!/usr/bin/env bash
# GPU check of the CUDA backend (docs/gpu.md). On a machine with a CUDA GPU it
#   1. builds the server and the check programs (make; SAN=... is honoured),
#   2. runs gpu_hal_check: the cuda backend through the HAL, no server,
#   3. starts pegaflow-server --gpu-backend cuda (ports 0) and runs gpu_kv_check against
#      it: split and contiguous layouts x direct and kernel transfer modes, every byte
#      compared, save/load GB/s next to pinned cudaMemcpy of the same bytes.
# Without the CUDA toolkit or a usable GPU it prints a SKIP line with the reason and
# exits 77. Exit status: 0 pass, 1 fail, 77 skip.
# Environment: PF_GPU_DEVICE (GPU to use, default 0), PF_GPU_POOL (server --pool-size,
# default 2gb), PF_GPU_SEED (default: the time), JOBS (make -j), SAN (sanitizer build).
# Logs: <build dir>/test-logs/gpu/.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 1
t_start=$SECONDS
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
dev=${PF_GPU_DEVICE:-0}
pool=${PF_GPU_POOL:-2gb}
seed=${PF_GPU_SEED:-$(date +%s)}

skip() {
  echo "SKIP: $*"
  exit 77
}
fail() {
  echo "FAIL: $*"
  exit 1
}
mk() { make --no-print-directory ${SAN:+SAN=$SAN} "$@"; }

# 1. was this tree configured with the CUDA toolkit?
mk build/config.mk >/dev/null || fail "./configure failed"
grep -q '^HAVE_CUDA := 1' build/config.mk ||
  skip "built without the CUDA toolkit (./configure found no nvcc and cuda_runtime.h under ${CUDA_HOME:-/usr/local/cuda})"
O=$(mk -s gpu-check-builddir | tail -n 1)
[ -n "$O" ] || fail "cannot tell the build directory"
logs=$O/test-logs/gpu
mkdir -p "$logs"

if [[ "${SAN:-}" == *address* ]]; then
  # the CUDA driver maps memory inside ASan's shadow gap
  export ASAN_OPTIONS=${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=0}
fi

# 2. is there a usable GPU? (cheap: the probe links only cudart)
if ! mk -j"$jobs" "$O/tests/gpu/gpu_probe" >"$logs/build-probe.log" 2>&1; then
  tail -n 30 "$logs/build-probe.log"
  fail "building gpu_probe failed (log: $logs/build-probe.log)"
fi
probe=$("$O/tests/gpu/gpu_probe")
rc=$?
if [ $rc = 77 ]; then
  echo "$probe"
  exit 77
fi
[ $rc = 0 ] || fail "gpu_probe exited $rc: $probe"
echo "$probe"
ngpu=$(echo "$probe" | sed -n 's/^gpus=\([0-9]*\).*/\1/p')

# 3. build the server, libpegaflow and the HAL check
echo "building (make -j$jobs all gpu_hal_check, log: $logs/build.log)"
if ! mk -j"$jobs" all "$O/tests/gpu/gpu_hal_check" >"$logs/build.log" 2>&1; then
  tail -n 40 "$logs/build.log"
  fail "build failed (log: $logs/build.log)"
fi

# With two or more GPUs the client side sees only GPU 1 (as its device 0): the server sees
# every GPU and must find the memory by UUID, not by index.
client_env=()
owner_opt=()
cdev=$dev
if [ "${ngpu:-1}" -ge 2 ] && [ -z "${CUDA_VISIBLE_DEVICES+x}" ] && [ -z "${PF_GPU_DEVICE+x}" ]; then
  client_env=(CUDA_VISIBLE_DEVICES=1)
  owner_opt=(--owner-visible 1)
  cdev=0
  echo "client side runs with CUDA_VISIBLE_DEVICES=1 (server: all $ngpu GPUs)"
fi

# 4. the backend through the HAL
echo "== gpu_hal_check (log: $logs/gpu_hal_check.log)"
timeout -k 10 150 "$O/tests/gpu/gpu_hal_check" --device "$dev" "${owner_opt[@]}" --seed "$seed" \
  2>&1 | tee "$logs/gpu_hal_check.log"
rc=${PIPESTATUS[0]}
[ $rc = 77 ] && exit 77
[ $rc = 0 ] || fail "gpu_hal_check exited $rc (log: $logs/gpu_hal_check.log)"

# 5. save/load through the server
if ! mk -j"$jobs" "$O/tests/gpu/gpu_kv_check" >"$logs/build-kv.log" 2>&1; then
  tail -n 20 "$logs/build-kv.log"
  fail "building gpu_kv_check failed: it needs the Engine client RPCs of libpegaflow (log: $logs/build-kv.log)"
fi
srvlog=$logs/server.log
echo "== pegaflow-server --gpu-backend cuda --pool-size $pool (log: $srvlog)"
"$O/bin/pegaflow-server" --gpu-backend cuda --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
  --pool-size "$pool" --log-level info >"$srvlog" 2>&1 &
spid=$!
trap 'kill -KILL $spid 2>/dev/null' EXIT
port=
deadline=$((SECONDS + 120))
while :; do
  port=$(sed -n 's/.*gRPC listening on .* (port \([0-9][0-9]*\)).*/\1/p' "$srvlog" | head -n 1)
  [ -n "$port" ] && break
  if ! kill -0 $spid 2>/dev/null; then
    tail -n 30 "$srvlog"
    fail "pegaflow-server exited during start-up (log: $srvlog)"
  fi
  if [ $SECONDS -ge $deadline ]; then
    tail -n 30 "$srvlog"
    fail "pegaflow-server did not listen within 120 s (log: $srvlog)"
  fi
  sleep 0.2
done
grep -q 'topology: .* backend cuda' "$srvlog" || fail "the server did not open the cuda backend"
grep -E 'topology:|  GPU [0-9]+:' "$srvlog" | sed 's/^[^ ]* [A-Z]* *server: /server: /'

echo "== gpu_kv_check (log: $logs/gpu_kv_check.log)"
env "${client_env[@]}" timeout -k 10 240 "$O/tests/gpu/gpu_kv_check" \
  --server "127.0.0.1:$port" --device "$cdev" --seed "$seed" 2>&1 | tee "$logs/gpu_kv_check.log"
rc=${PIPESTATUS[0]}

kill -TERM $spid 2>/dev/null
deadline=$((SECONDS + 30))
while kill -0 $spid 2>/dev/null && [ $SECONDS -lt $deadline ]; do
  sleep 0.1
done
if kill -0 $spid 2>/dev/null; then
  fail "pegaflow-server did not stop within 30 s of SIGTERM (log: $srvlog)"
fi
wait $spid
src=$?
trap - EXIT
[ $rc = 0 ] || fail "gpu_kv_check exited $rc (logs: $logs)"
[ $src = 0 ] || fail "pegaflow-server exited $src (log: $srvlog)"
echo "PASS: GPU check in $((SECONDS - t_start)) s (seed $seed)"
