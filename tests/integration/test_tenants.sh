#!/usr/bin/env bash
# Tenants bound to credentials (see tests/integration/tenant_e2e.c).
set -euo pipefail
export PF_TEST_LOGDIR=${PF_TEST_LOGDIR:-$(mktemp -d)}
exec "$PF_TESTBIN/tenant_e2e" "$@"
