#!/usr/bin/env bash
# Engine end-to-end scenarios (see tests/integration/engine_e2e.c).
set -euo pipefail
export PF_TEST_LOGDIR=${PF_TEST_LOGDIR:-$(mktemp -d)}
exec "$PF_TESTBIN/engine_e2e" "$@"
