#!/usr/bin/env bash
# Builds the connector wheel with libpegaflow.so inside (make wheel), offline, with
# Debian's setuptools and wheel (python3-setuptools, python3-wheel; no pip, no index):
#   ci/mkwheel.sh <build-dir> <out-dir>
# The package tree python/ is copied to <out-dir>/wheel-src, the library into its
# pegaflow/lib/ (where pegaflow.client._lib looks right after $PEGAFLOW_LIB), and the
# wheel is tagged for this platform (py3-none-linux_<machine>) since it carries a .so.
set -euo pipefail
O=${1:?build dir} out=${2:?out dir}
py=${PYTHON:-/usr/bin/python3} # Debian's, whose setuptools and wheel ci/install-deps.sh installs
top=$(cd "$(dirname "$0")/.." && pwd)
lib="$O/lib/libpegaflow.so"
[ -f "$lib" ] || { echo "mkwheel: $lib not found (make first)" >&2; exit 1; }
for m in setuptools wheel; do
  "$py" -c "import $m" 2>/dev/null ||
    { echo "mkwheel: the python module '$m' is missing: run ci/install-deps.sh (python3-$m)" >&2; exit 1; }
done
out=$(mkdir -p "$out" && cd "$out" && pwd)
src="$out/wheel-src"
rm -rf "$src"
mkdir -p "$src"
(cd "$top/python" && tar --exclude=build --exclude='*.egg-info' --exclude=__pycache__ -cf - .) |
  tar -C "$src" -xf -
install -m 755 "$lib" "$src/pegaflow/lib/libpegaflow.so"
strip --strip-unneeded "$src/pegaflow/lib/libpegaflow.so"
cat >"$src/setup.cfg" <<C
[bdist_wheel]
python_tag = py3
plat_name = linux_$(uname -m)
C
rm -f "$out"/pegaflow_c-*.whl "$out/wheel-name"
log="$out/wheel-build.log"
if ! (cd "$src" && "$py" -c '
import sys
from setuptools import build_meta
out, name_file = sys.argv[1], sys.argv[2]  # build_wheel rewrites sys.argv
name = build_meta.build_wheel(out)
open(name_file, "w").write(name)' "$out" "$out/wheel-name") >"$log" 2>&1; then
  cat "$log" >&2
  echo "mkwheel: building the wheel failed (log above)" >&2
  exit 1
fi
whl=$(cat "$out/wheel-name")
"$py" - "$out/$whl" <<'P'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
if "pegaflow/lib/libpegaflow.so" not in names:
    sys.exit(f"mkwheel: {sys.argv[1]} lacks pegaflow/lib/libpegaflow.so")
P
echo "wheel: $out/$whl"
