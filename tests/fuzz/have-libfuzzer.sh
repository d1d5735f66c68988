#!/usr/bin/env bash
# Exits 0 when clang can build a libFuzzer target with ASan + UBSan; otherwise prints why
# (one line with SKIP) and exits 1. Used by mk/fuzz.mk and tests/fuzz/run-target.sh.
set -u
if ! command -v clang >/dev/null 2>&1; then
  echo "SKIP: clang not installed (ci/install-deps.sh installs clang and libclang-rt-dev)"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
  'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }' >"$tmp/t.c"
if ! clang -fsanitize=fuzzer,address,undefined "$tmp/t.c" -o "$tmp/t" >"$tmp/log" 2>&1; then
  echo "SKIP: clang cannot link -fsanitize=fuzzer (libclang-rt-dev missing?): $(head -n 1 "$tmp/log")"
  exit 1
fi
exit 0
