#!/usr/bin/env bash
# Test runner: tests/run.sh unit|integration|python|fuzz|all <build-dir>
# Runs every test with a timeout, keeps each log under <build-dir>/test-logs/, prints one
# line per test (PASS / FAIL / SKIP with the reason) and a summary per suite. Exit code 77
# from a test means "skipped" (hardware absent) and is never counted as passed.
# Exits non-zero when any test failed.
set -u
mode=${1:-all}
O=${2:?build dir}
top=$(cd "$(dirname "$0")/.." && pwd)
logs="$O/test-logs"
mkdir -p "$logs"
UNIT_TIMEOUT=${UNIT_TIMEOUT:-300}
INTEG_TIMEOUT=${INTEG_TIMEOUT:-600}
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-300}
total_fail=0
summary=()
failed_names=()

run_one() { # kind name timeout cmd...
  local kind=$1 name=$2 tmo=$3; shift 3
  local log="$logs/$kind/$name.log"
  mkdir -p "$(dirname "$log")"
  local t0=$(date +%s.%N)
  timeout --kill-after=10 "$tmo" "$@" >"$log" 2>&1
  local rc=$?
  local dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
  case $rc in
    0)
      local detail=$(grep -aoE '\[  PASSED  \] [0-9]+ test' "$log" | tail -1 | grep -oE '[0-9]+')
      printf '  PASS  %-48s %6ss%s\n' "$name" "$dt" "${detail:+  ($detail tests)}"
      pass=$((pass+1)) ;;
    77)
      local why=$(grep -a 'SKIP' "$log" | tail -1)
      [ -n "$why" ] || why=$(tail -n 1 "$log")
      printf '  SKIP  %-48s %s\n' "$name" "$why"
      skip=$((skip+1)) ;;
    124|137)
      printf '  FAIL  %-48s timed out after %ss (log: %s)\n' "$name" "$tmo" "$log"
      tail -n 40 "$log" | sed 's/^/        | /'
      failed_names+=("$kind: $name (timed out)${log:+: $(why_failed "$log")}")
      fail=$((fail+1)) ;;
    *)
      printf '  FAIL  %-48s exit %d after %ss (log: %s)\n' "$name" "$rc" "$dt" "$log"
      tail -n 40 "$log" | sed 's/^/        | /'
      local why; why=$(why_failed "$log")
      failed_names+=("$kind: $name${why:+: $why}")
      fail=$((fail+1)) ;;
  esac
}

# The first line of a failed test's log that says why (a PFT_CHECK's "FAIL file.c:N: ...",
# cmocka's "[  ERROR   ]", a script's "FAIL: ..."), trimmed: it goes into the summary's
# "failed:" line, which a truncated CI log still shows when the middle is cut.
why_failed() { # log
  local l
  l=$(grep -aoE 'FAIL [^ ]+\.(c|h):[0-9]+: .*' "$1" | head -n 1)
  [ -n "$l" ] || l=$(grep -aE '^\[  ERROR   \] --- |^\[   LINE   \] --- ' "$1" | head -n 2 | tr '\n' ' ')
  [ -n "$l" ] || l=$(grep -aoE 'FAIL: .*' "$1" | head -n 1)
  [ -n "$l" ] || l=$(grep -aoE ' ERROR .*' "$1" | head -n 1)
  printf '%s' "${l:0:240}"
}

suite_end() {
  summary+=("$(printf '%-12s %3d passed, %3d failed, %3d skipped' "$1:" "$pass" "$fail" "$skip")")
  total_fail=$((total_fail+fail))
}

if [ "$mode" = unit ] || [ "$mode" = all ]; then
  echo "== unit tests"
  pass=0 fail=0 skip=0
  while IFS= read -r t; do
    rel=${t#"$O/tests/unit/"}
    run_one unit "$rel" "$UNIT_TIMEOUT" "$t"
  done < <(find "$O/tests/unit" -type f -perm -u+x 2>/dev/null | sort)
  suite_end unit
fi

if [ "$mode" = integration ] || [ "$mode" = all ]; then
  echo "== integration tests"
  pass=0 fail=0 skip=0
  for t in "$top"/tests/integration/test_*.sh; do
    [ -e "$t" ] || continue
    case " ${PF_SKIP_TESTS:-} " in
      *" $(basename "$t" .sh) "*)
        printf '  SKIP  %-48s SKIP: named in PF_SKIP_TESTS\n' "$(basename "$t" .sh)"
        skip=$((skip+1)); continue ;;
    esac
    tmo=$INTEG_TIMEOUT
    # the rxe guest runs every verbs case under TCG emulation: 5-9 min on a 2-core VM
    [ "$(basename "$t")" = test_rxe.sh ] && tmo=${RXE_TEST_TIMEOUT:-900}
    run_one integration "$(basename "$t" .sh)" "$tmo" bash "$t"
  done
  suite_end integration
fi

if [ "$mode" = python ] || [ "$mode" = all ]; then
  echo "== python tests"
  pass=0 fail=0 skip=0
  if ls "$top"/tests/python/test_*.py >/dev/null 2>&1; then
    log="$logs/python/pytest.log"
    mkdir -p "$(dirname "$log")"
    # a sanitizer build of libpegaflow inside an uninstrumented python needs its runtime first
    san_env=()
    case "${PF_SAN:-}" in
      *address*) san_env=(LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)"
                          ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0:abort_on_error=1:log_path=$logs/python/san) ;;
      # reports go to files: pytest captures fd 2, so a report from the python process itself
      # would vanish with it when the sanitizer halts the run
      *thread*) san_env=(LD_PRELOAD="$(gcc -print-file-name=libtsan.so)"
                         TSAN_OPTIONS="${TSAN_OPTIONS:-}:log_path=$logs/python/san") ;;
    esac
    rm -f "$logs"/python/san.*
    (cd "$top" && env "${san_env[@]}" timeout --kill-after=10 "$INTEG_TIMEOUT" /usr/bin/python3 -m pytest -q -p no:cacheprovider \
       -rfEs tests/python) >"$log" 2>&1
    rc=$?
    line=$(grep -aE '[0-9]+ (passed|failed|skipped|error)' "$log" | tail -1)
    p=$(echo "$line" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+'); pass=${p:-0}
    f=$(echo "$line" | grep -oE '[0-9]+ (failed|error)' | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}'); fail=${f:-0}
    s=$(echo "$line" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+'); skip=${s:-0}
    if [ $rc -ne 0 ] && [ "$fail" -eq 0 ]; then fail=1; fi
    echo "  pytest: ${line:-no summary} (log: $log)"
    grep -aE '^SKIPPED' "$log" | sed 's/^/        /'
    if [ $rc -ne 0 ]; then
      # the names first: a long traceback must not push them out of a CI log's tail
      grep -aE '^(FAILED|ERROR) ' "$log" | sed 's/^/        /'
      while IFS= read -r t; do failed_names+=("python: $t"); done \
        < <(grep -aE '^(FAILED|ERROR) ' "$log" | awk '{print $2}')
      tail -n 60 "$log" | sed 's/^/        | /'
    fi
    for r in "$logs"/python/san.*; do
      [ -e "$r" ] || continue
      fail=$((fail + 1))
      echo "  sanitizer report from the python process: $r"
      head -n 40 "$r" | sed 's/^/        | /'
    done
  fi
  suite_end python
fi

if [ "$mode" = fuzz ] || [ "$mode" = all ]; then
  echo "== fuzz targets (committed corpus + ${FUZZ_TEST_SECONDS:-5}s each)"
  pass=0 fail=0 skip=0
  mkdir -p "$logs/fuzz"
  export PF_FUZZ_ARTIFACTS="$logs/fuzz"
  for t in "$top"/tests/fuzz/fuzz_*.c; do
    [ -e "$t" ] || continue
    n=$(basename "$t" .c)
    run_one fuzz "$n" "$FUZZ_TIMEOUT" bash "$top/tests/fuzz/run-target.sh" "${n#fuzz_}"
  done
  suite_end fuzz
fi

echo "== summary"
for s in "${summary[@]}"; do echo "  $s"; done
if [ $total_fail -ne 0 ]; then
  for n in "${failed_names[@]}"; do echo "  failed: $n"; done
  echo "FAILED: $total_fail test(s) failed"
  exit 1
fi
echo "OK"
