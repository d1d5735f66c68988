#!/usr/bin/env bash
# Tenants bound to credentials (see tests/integration/tenant_e2e.c); first the start-up
# refusals of --tenants-file: exit 2 with one line naming the file (and the line).
set -euo pipefail
export PF_TEST_LOGDIR=${PF_TEST_LOGDIR:-$(mktemp -d)}
d=$(mktemp -d "$PF_TEST_LOGDIR/tenants-cli.XXXXXX")
trap 'rm -rf "$d"' EXIT
expect_exit2() { # expect_exit2 WANT FILE
  local out rc=0
  out=$("$PF_BIN/pegaflow-server" --gpu-backend sim --addr 127.0.0.1:0 --http-addr 127.0.0.1:0 \
    --tenants-file "$2" 2>&1) || rc=$?
  if [ "$rc" != 2 ] || [ "$(printf '%s\n' "$out" | wc -l)" != 1 ] || ! grep -qF -- "$1" <<<"$out"; then
    echo "FAIL: --tenants-file $2: exit $rc, output: $out (want exit 2, one line with '$1')"
    exit 1
  fi
  echo "  refused: $out"
}
expect_exit2 "--tenants-file: cannot open $d/missing" "$d/missing"
expect_exit2 "is not a regular file" "$d"
printf 'tenant=a token=0123456789abcdef namespaces=a\ntenant=b token=0123456789abcdef namespaces=b\n' >"$d/dup"
expect_exit2 "--tenants-file: $d/dup:2: tenant b has the same token as tenant a (line 1)" "$d/dup"
printf '# only comments\n' >"$d/empty"
expect_exit2 "--tenants-file: $d/empty: no tenant defined" "$d/empty"
exec "$PF_TESTBIN/tenant_e2e" "$@"
