#!/usr/bin/env bash
# pegaflow-sim without root privileges (docs/simulation.md): the nodes on loopback addresses
# 127.0.0.2.. (no namespaces), state file under /tmp/pegaflow-sim-<uid>. As root the run
# drops to the unprivileged user nobody (setpriv); without setpriv it is skipped. Checks as
# test_sim.sh: it completes, tiers add up, remote hits, zero integrity failures, the JSON and
# SVG parse, nothing left behind. 240 requests with node 3 killed at 30% and restarted at 60%,
# as test_sim.sh: with 120 and 40% / 70% a TSan build's restarted node was registered again
# only after its last request (seed 338766857), so "a hit after its ready" could not hold.
set -u
. "$(dirname "$0")/lib.sh"
pf_tmpdir
SEED=${PF_SIM_SEED:-$((RANDOM * 32768 + RANDOM))}
echo "seed $SEED"
out=$(mktemp -d "${TMPDIR:-/tmp}/pf-sim-user.XXXXXX")
trap '_pf_cleanup; rm -rf "$out"' EXIT
as=()
if [ "$(id -u)" = 0 ]; then
  if ! command -v setpriv >/dev/null; then
    echo "SKIP: running as root and setpriv (util-linux) is absent: cannot drop privileges"
    exit 77
  fi
  # the checkout may sit where nobody cannot read (a clone in a 0700 mktemp directory):
  # nobody runs a copy of the package, the binaries and the library, as an installed user would
  # (the sim finds the vLLM stand-in its node drivers import beside the package, as in a tree)
  mkdir -p "$out/stage/bin" "$out/stage/lib" "$out/stage/python" "$out/stage/tests/python"
  cp -a "$PF_BIN/." "$out/stage/bin/"
  cp -a "$PF_LIB/libpegaflow.so" "$out/stage/lib/"
  cp -a "$PF_TOP/python/pegaflow" "$out/stage/python/"
  cp -a "$PF_TOP/tests/python/vllm_stub" "$out/stage/tests/python/"
  bin=$out/stage/bin lib=$out/stage/lib py=$out/stage/python
  chown -R 65534:65534 "$out"
  as=(setpriv --reuid=65534 --regid=65534 --clear-groups --)
  echo "running as nobody (uid 65534)"
else
  bin=$PF_BIN lib=$PF_LIB py=$PF_TOP/python
fi
"${as[@]}" env HOME="$out" PYTHONPATH="$py" /usr/bin/python3 -m pegaflow.sim \
  --bin "$bin" --lib "$lib/libpegaflow.so" --nodes 3 --requests 240 --rate 60 \
  --seed "$SEED" --kill-node 3@30% --restart-node 3@60% \
  --json "$out/run.json" --plot "$out/run.svg" >"$PF_TMP/run.log" 2>&1
rc=$?
cat "$PF_TMP/run.log"
[ $rc = 0 ] || pf_fail "pegaflow-sim exited with $rc"
grep -q "network: loopback addresses" "$PF_TMP/run.log" || pf_fail "not in loopback mode"
/usr/bin/python3 "$PF_TOP/tests/integration/sim_check.py" "$out/run.json" "$out/run.svg" \
  --want-remote --want-events kill,restart || pf_fail "report checks"
echo "PASS"
