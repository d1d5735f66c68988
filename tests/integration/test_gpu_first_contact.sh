#!/usr/bin/env bash
# First contact with a GPU (tests/gpu/first-contact.sh, docs/gpu.md "First contact"): a
# real torch KV cache through the connector's own code and a pegaflow-server with
# --gpu-backend cuda. Runs on hosts with a GPU and torch with CUDA, exits 77 with the
# reason elsewhere. The benchmark half (tests/gpu/bench.sh runs tests/gpu/run.sh, which
# test_gpu.sh already runs) is left to a direct run of first-contact.sh.
PF_FIRST_CONTACT_NO_BENCH=1 exec bash "$PF_TOP/tests/gpu/first-contact.sh"
