#!/usr/bin/env bash
# Collects gcov data of a COVERAGE=1 build with lcov and prints line and branch coverage of
# our sources (src/, sim/, hw/). HTML goes to <build>/coverage/.
set -eu
O=${1:-build/cov}
info="$O/coverage.info"
lcov --quiet --capture --directory "$O/obj" --output-file "$info.raw" --rc lcov_branch_coverage=1 \
  --ignore-errors gcov,source >/dev/null 2>&1 || { echo "coverage: lcov capture failed" >&2; exit 1; }
lcov --quiet --extract "$info.raw" "$PWD/src/*" "$PWD/sim/*" "$PWD/hw/*" --output-file "$info" \
  --rc lcov_branch_coverage=1 >/dev/null 2>&1
if command -v genhtml >/dev/null; then
  genhtml --quiet --branch-coverage --output-directory "$O/coverage" "$info" >/dev/null 2>&1 || true
fi
echo "== coverage (src/, sim/, hw/)"
lcov --summary "$info" --rc lcov_branch_coverage=1 2>&1 | grep -E 'lines|branches|functions'
echo "HTML report: $O/coverage/index.html"
