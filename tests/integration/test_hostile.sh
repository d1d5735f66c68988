#!/usr/bin/env bash
# Hostile-client scenarios (see tests/integration/hostile.c).
set -euo pipefail
export PF_TEST_LOGDIR=${PF_TEST_LOGDIR:-$(mktemp -d)}
exec "$PF_TESTBIN/hostile" "$@"
