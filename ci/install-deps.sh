#!/usr/bin/env bash
# Installs, with apt, only the Debian packages this project needs that are missing.
# Idempotent and quiet: prints one line when everything is present, the list it installs
# otherwise, and fails loudly (non-zero, apt's output shown) when apt fails.
# This is the one place where build and test dependencies are listed.
set -euo pipefail

PKGS=(
  build-essential pkg-config
  libibverbs-dev librdmacm-dev ibverbs-providers
  libnuma-dev
  libprotobuf-c-dev protobuf-c-compiler
  libgrpc-dev
  libmicrohttpd-dev
  libcmocka-dev
  lcov
  liburing-dev
  libxxhash-dev
  libcjson-dev
  libcurl4-openssl-dev
  libssl-dev
  python3-numpy python3-pytest python3-cbor2 python3-xxhash python3-yaml python3-prometheus-client
  python3-setuptools python3-wheel python3-venv dpkg-dev python3-grpcio
  iproute2 curl openssl
  qemu-system-x86 busybox-static tcpdump
  ibverbs-utils
  clang-format
  clang libclang-rt-dev
  libhiredis-dev redis-server
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "install-deps: missing packages (${missing[*]}) and not root; install them and retry" >&2
    exit 1
  fi
else
  SUDO=
fi

echo "install-deps: installing ${missing[*]}"
log=$(mktemp)
export DEBIAN_FRONTEND=noninteractive
if ! { $SUDO apt-get update -q >"$log" 2>&1 &&
       $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1; }; then
  cat "$log" >&2
  rm -f "$log"
  echo "install-deps: apt-get failed for: ${missing[*]}" >&2
  exit 1
fi
rm -f "$log"
echo "install-deps: done"
