#!/usr/bin/env bash
# The GPU check (tests/gpu/run.sh, docs/gpu.md): runs on hosts with a CUDA GPU, exits 77
# with the reason elsewhere.
exec bash "$PF_TOP/tests/gpu/run.sh"
