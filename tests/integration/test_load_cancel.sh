#!/usr/bin/env bash
# Safe load cancellation against the real server (see tests/integration/load_cancel.c).
set -euo pipefail
export PF_TEST_LOGDIR=${PF_TEST_LOGDIR:-$(mktemp -d)}
exec "$PF_TESTBIN/load_cancel" "$@"
