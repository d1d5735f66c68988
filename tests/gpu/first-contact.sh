#!/usr/bin/env bash
# First contact with a GPU node (docs/gpu.md "First contact"). One prepared script for the
# first machine with a GPU; prints one line per check (PASS / FAIL / SKIP name: detail):
#   driver       nvidia-smi: driver version, the CUDA version it supports, GPU, compute mode
#   build        make all (log under <build dir>/test-logs/gpu/first-contact/)
#   server       pegaflow-server --gpu-backend cuda starts, opens the cuda backend
#   versions     the server's start log names the CUDA driver and runtime versions
#   torch, handle-format, register, save, save-fence, query, load, expandable-refusal
#                tests/gpu/first_contact.py: a real torch KV cache exported through the
#                connector's own code (python/pegaflow/device/cuda.py), registered, saved,
#                loaded into other blocks and compared byte for byte
#   bench        tests/gpu/bench.sh (the C GPU check and its benchmark table)
# Without a GPU (no nvidia-smi, or it lists none) or without torch with CUDA it prints a
# SKIP line with the reason and exits 77. Exit: 0 all passed, 1 a check failed, 77 skip.
# Environment: PF_GPU_DEVICE (default 0), PF_GPU_POOL (server --pool-size, default 2gb),
# PF_GPU_SEED (default: the time), PF_PYTHON (the python with torch, default python3),
# JOBS (make -j), PF_FIRST_CONTACT_NO_BENCH=1 skips bench.sh.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 1
dev=${PF_GPU_DEVICE:-0}
pool=${PF_GPU_POOL:-2gb}
seed=${PF_GPU_SEED:-$(date +%s)}
py=${PF_PYTHON:-python3}
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
nfail=0
spid=

say() { # status name detail
  echo "$1 $2: $3"
  [ "$1" = FAIL ] && nfail=$((nfail + 1))
  return 0
}
finish() {
  [ -n "$spid" ] && kill -KILL "$spid" 2>/dev/null
  if [ $nfail -gt 0 ]; then
    echo "first contact: $nfail check(s) FAILED (logs: ${logs:-none})"
    exit 1
  fi
  echo "first contact: all checks passed (seed $seed, logs: $logs)"
  exit 0
}

# driver ---------------------------------------------------------------------------------
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "SKIP driver: no GPU here (nvidia-smi not found)"
  exit 77
fi
if ! gpus=$(nvidia-smi -L 2>&1) || ! echo "$gpus" | grep -q '^GPU '; then
  echo "SKIP driver: no GPU here (nvidia-smi -L: $(echo "$gpus" | head -n 1))"
  exit 77
fi
q=$(nvidia-smi -i "$dev" --query-gpu=driver_version,name,compute_mode --format=csv,noheader 2>&1)
cudaver=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
drv=${q%%,*}
case "$q" in
  *Prohibited*)
    say FAIL driver "GPU $dev is in PROHIBITED compute mode ($q): no process can open it" ;;
  *Exclusive_Process*)
    say FAIL driver "GPU $dev is in EXCLUSIVE_PROCESS compute mode ($q): vLLM and the server cannot both open it; nvidia-smi -i $dev -c DEFAULT (or run MPS)" ;;
  *,*) say PASS driver "driver $drv (supports CUDA ${cudaver:-?}); GPU $dev:${q#*,}; $(echo "$gpus" | wc -l) GPU(s)" ;;
  *) say FAIL driver "nvidia-smi --query-gpu failed: $q" ;;
esac

# torch present? (before building: no torch = nothing to contact)
tv=$("$py" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -n 1)
case "$tv" in
  *" True") ;;
  *" False") echo "SKIP torch: $py has torch $tv: no CUDA (CPU-only build, or no usable GPU)"; exit 77 ;;
  *) echo "SKIP torch: $py cannot import torch ($tv); set PF_PYTHON to vLLM's python"; exit 77 ;;
esac

# build ----------------------------------------------------------------------------------
O=$(make --no-print-directory -s gpu-check-builddir 2>/dev/null | tail -n 1)
[ -n "$O" ] || O=build/rel
logs=$O/test-logs/gpu/first-contact
mkdir -p "$logs"
if make --no-print-directory -j"$jobs" all >"$logs/build.log" 2>&1; then
  say PASS build "make all ($O)"
else
  say FAIL build "make all failed (log: $logs/build.log): $(tail -n 1 "$logs/build.log")"
  finish
fi

# server ---------------------------------------------------------------------------------
srvlog=$logs/server.log
"$O/bin/pegaflow-server" --gpu-backend cuda --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
  --pool-size "$pool" --log-level info >"$srvlog" 2>&1 &
spid=$!
trap 'kill -KILL $spid 2>/dev/null' EXIT
port=
deadline=$((SECONDS + 120))
while :; do
  port=$(sed -n 's/.*gRPC listening on .* (port \([0-9][0-9]*\)).*/\1/p' "$srvlog" | head -n 1)
  [ -n "$port" ] && break
  if ! kill -0 "$spid" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
    say FAIL server "pegaflow-server --gpu-backend cuda did not start (log: $srvlog): $(grep -aE 'ERROR|WARN|error' "$srvlog" | tail -n 2 | tr '\n' ' ')"
    spid=
    finish
  fi
  sleep 0.2
done
if grep -q 'topology: .* backend cuda' "$srvlog"; then
  say PASS server "listening on 127.0.0.1:$port, $(grep -m1 -o 'topology: .*' "$srvlog")"
else
  say FAIL server "the server did not open the cuda backend (log: $srvlog)"
fi
vers=$(grep -aiE 'cuda (driver|runtime)|driver version|runtime version' "$srvlog" | head -n 2 |
  sed 's/^[^ ]* [A-Z]* *//' | tr '\n' ' ')
if [ -n "$vers" ]; then
  say PASS versions "server log: $vers"
else
  say FAIL versions "the server's start log names no CUDA driver/runtime version (log: $srvlog)"
fi

# the connector's own code against real torch --------------------------------------------
pylog=$logs/first_contact_py.log
env PYTHONPATH="$top/python${PYTHONPATH:+:$PYTHONPATH}" PEGAFLOW_LIB="$top/$O/lib/libpegaflow.so" \
  timeout -k 10 300 "$py" "$top/tests/gpu/first_contact.py" --server "127.0.0.1:$port" \
  --device "$dev" --seed "$seed" >"$pylog" 2>&1
rc=$?
grep -aE '^(PASS|FAIL|SKIP) ' "$pylog"
nf=$(grep -acE '^FAIL ' "$pylog")
nfail=$((nfail + nf))
if [ $rc -ne 0 ] && [ "$nf" -eq 0 ]; then
  say FAIL first_contact.py "exit $rc (log: $pylog): $(tail -n 1 "$pylog")"
fi

kill -TERM "$spid" 2>/dev/null
deadline=$((SECONDS + 30))
while kill -0 "$spid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
if kill -0 "$spid" 2>/dev/null; then
  say FAIL server-stop "pegaflow-server did not stop within 30 s of SIGTERM"
else
  wait "$spid"
  src=$?
  [ $src = 0 ] || say FAIL server-stop "pegaflow-server exited $src (log: $srvlog)"
fi
spid=
trap - EXIT

# bench ----------------------------------------------------------------------------------
if [ -n "${PF_FIRST_CONTACT_NO_BENCH:-}" ]; then
  say SKIP bench "PF_FIRST_CONTACT_NO_BENCH is set"
else
  blog=$logs/bench.log
  PF_GPU_DEVICE=$dev PF_GPU_POOL=$pool PF_GPU_SEED=$seed JOBS=$jobs \
    timeout -k 10 900 bash "$top/tests/gpu/bench.sh" --json "$logs/bench.json" >"$blog" 2>&1
  rc=$?
  case $rc in
    0) say PASS bench "tests/gpu/bench.sh passed (rows: $logs/bench.json, log: $blog)" ;;
    77) say SKIP bench "$(grep -a SKIP "$blog" | tail -n 1)" ;;
    *) say FAIL bench "tests/gpu/bench.sh exited $rc (log: $blog): $(grep -aE 'FAIL' "$blog" | tail -n 1)" ;;
  esac
fi
finish
