#!/usr/bin/env bash
# GPU benchmark (docs/gpu.md "Benchmark"): one prepared script for a machine with a CUDA GPU.
# It runs the GPU check (tests/gpu/run.sh: build, gpu_hal_check, a pegaflow-server with
# --gpu-backend cuda and gpu_kv_check; every byte compared) and turns its two tables into
# benchmark rows:
#   * save (D2H) and load (H2D) through the server, split and contiguous layouts, direct and
#     kernel transfer modes, against pinned cudaMemcpy of the same byte count;
#   * HAL copies of 64 KiB blocks: the copy kernel against one DMA per block (direct mode,
#     scattered blocks: nothing merges), and direct sequential copies (merged into large
#     DMAs) against pinned cudaMemcpy.
# Without a GPU or the CUDA toolkit it prints the SKIP line with the reason and exits 77.
# Usage: tests/gpu/bench.sh [--quick] [--json FILE]   (exit 0 ok, 1 fail, 77 skip)
# Environment: as tests/gpu/run.sh (PF_GPU_DEVICE, PF_GPU_POOL, PF_GPU_SEED, JOBS).
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
json=
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) shift ;; # the GPU check's sizes are already small; accepted for bench/report.py
    --json) json=$2; shift 2 ;;
    *) echo "usage: tests/gpu/bench.sh [--quick] [--json FILE]"; exit 2 ;;
  esac
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
bash "$top/tests/gpu/run.sh" 2>&1 | tee "$out"
rc=${PIPESTATUS[0]}
[ "$rc" = 0 ] || exit "$rc"
O=$(make -C "$top" --no-print-directory -s gpu-check-builddir | tail -n 1)
logs=$top/$O/test-logs/gpu
[ -d "$logs" ] || logs=$O/test-logs/gpu
/usr/bin/python3 - "$logs/gpu_kv_check.log" "$logs/gpu_hal_check.log" "${json:-/dev/stdout}" <<'EOF'
import json, re, sys

kv, hal, dst = sys.argv[1:4]
rows = []
num = r"([0-9.]+)"
text = open(kv).read()
m = re.search(r"cudaMemcpy pinned\s+" + num + r"\s+" + num + r" GB/s\s+" + num + " GB/s", text)
if not m:
    sys.exit("bench.sh: no cudaMemcpy line in " + kv)
base_d2h, base_h2d = float(m.group(2)), float(m.group(3))
for case, mib, s, l in re.findall(r"^(\S+-(?:direct|kernel))\s+" + num + r"\s+" + num +
                                  r" GB/s\s+" + num + " GB/s", text, re.M):
    s, l = float(s), float(l)
    rows.append({"path": f"save (D2H) through the server, {case}", "gbs": s,
                 "baseline": "cudaMemcpy pinned", "baseline_gbs": base_d2h,
                 "ratio": s / base_d2h if base_d2h else None, "target": 0.85})
    rows.append({"path": f"load (H2D) through the server, {case}", "gbs": l,
                 "baseline": "cudaMemcpy pinned", "baseline_gbs": base_h2d,
                 "ratio": l / base_h2d if base_h2d else None, "target": 0.90})
text = open(hal).read()
m = re.search(r"cudaMemcpy pinned\s+" + num + r"\s+" + num, text)
hb = (float(m.group(1)), float(m.group(2))) if m else (0.0, 0.0)
hal_rows = {(mode, kind): (float(d), float(h)) for mode, kind, d, h in
            re.findall(r"^(direct|kernel) (sequential|scattered) \(\d+ descs\)\s+" + num +
                       r"\s+" + num, text, re.M)}
for i, d in enumerate(("D2H", "H2D")):
    k, dma = hal_rows.get(("kernel", "scattered")), hal_rows.get(("direct", "scattered"))
    if k and dma:
        rows.append({"path": f"HAL {d}: copy kernel vs one DMA per 64 KiB block", "gbs": k[i],
                     "baseline": "one cudaMemcpyAsync per block", "baseline_gbs": dma[i],
                     "ratio": k[i] / dma[i] if dma[i] else None, "target": None})
    seq = hal_rows.get(("direct", "sequential"))
    if seq and hb[i]:
        rows.append({"path": f"HAL {d}: direct, sequential blocks (merged) vs cudaMemcpy",
                     "gbs": seq[i], "baseline": "cudaMemcpy pinned", "baseline_gbs": hb[i],
                     "ratio": seq[i] / hb[i], "target": 0.95})
doc = {"bench": "gpu", "rows": rows,
       "method": "tests/gpu/run.sh: every byte compared; baselines best of 3 cudaMemcpy of a "
                 "cudaHostAlloc buffer of the same size (not interleaved)"}
with open(dst, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
for r in rows:
    print(f"{r['path']:<60} {r['gbs']:8.2f} GB/s  {r['baseline']} {r['baseline_gbs']:.2f}  "
          f"ratio {r['ratio'] if r['ratio'] is None else round(r['ratio'], 3)}")
print("method: " + doc["method"])
EOF
