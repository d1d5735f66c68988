#!/usr/bin/env bash
# Says which optional hardware backends a build contains and fails when one whose packages
# are installed was not built: ci/check-backends.sh <build-dir>  (make check-backends).
# "Built" is read from the build itself (the backend's object in libpfcore.a), not from
# build/config.mk. Installed means: verbs, the Debian package libibverbs-dev; CUDA, nvcc
# and cuda_runtime.h under CUDA_HOME (the toolkit does not come from Debian). A backend
# left out on purpose (./configure --without-verbs / --without-cuda, recorded in
# CONFIGURE_ARGS) is not an error.
set -euo pipefail
O=${1:?build dir}
lib="$O/lib/libpfcore.a"
[ -f "$lib" ] || { echo "check-backends: $lib not found (build first)" >&2; exit 2; }
members=$(ar t "$lib")
built() { grep -qx "$1" <<<"$members"; }
yn() { if "$@"; then echo yes; else echo no; fi; }
cuda_built=$(yn built cuda.o)
verbs_built=$(yn built verbs.o)
echo "backends: cuda $cuda_built, verbs $verbs_built (sim GPU, TCP NIC and io_uring SSD are always built)"

args=${CONFIGURE_ARGS:-}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
verbs_pkg=no
if command -v dpkg-query >/dev/null 2>&1 &&
   dpkg-query -W -f='${Status}' libibverbs-dev 2>/dev/null | grep -q 'install ok installed'; then
  verbs_pkg=yes
fi
cuda_pkg=no
[ -x "$cuda_home/bin/nvcc" ] && [ -f "$cuda_home/include/cuda_runtime.h" ] && cuda_pkg=yes

rc=0
if [ "$verbs_pkg" = yes ] && [ "$verbs_built" = no ] && [[ " $args " != *" --without-verbs "* ]]; then
  echo "check-backends: libibverbs-dev is installed but hw/verbs was not built;" \
       "run ./configure to see why the probe fails (or ./configure --without-verbs to leave it out)" >&2
  rc=1
fi
if [ "$cuda_pkg" = yes ] && [ "$cuda_built" = no ] && [[ " $args " != *" --without-cuda "* ]]; then
  echo "check-backends: the CUDA toolkit is installed in $cuda_home but hw/cuda was not built;" \
       "run ./configure to see why the probe fails (or ./configure --without-cuda to leave it out)" >&2
  rc=1
fi
exit $rc
