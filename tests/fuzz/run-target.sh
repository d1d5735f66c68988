#!/usr/bin/env bash
# Runs libFuzzer targets built by mk/fuzz.mk (build/fuzz/tests/fuzz/fuzz_<name>).
#   run-target.sh NAME                 one bounded run for tests/run.sh (suite "fuzz"): every
#                                      input of tests/fuzz/corpus/NAME (regression inputs
#                                      included), then FUZZ_TEST_SECONDS (5) of fuzzing. New
#                                      inputs go to a scratch dir, never into the committed
#                                      corpus. Exit 0, 77 (SKIP: no clang/libFuzzer) or
#                                      libFuzzer's code (crash input under the test log dir).
#   run-target.sh --long SECS NAME...  make fuzz: SECS per target on build/fuzz/corpus/NAME
#                                      (seeded from the committed corpus), crashes in
#                                      build/fuzz/crashes/NAME/
#   run-target.sh --merge 0 NAME...    make fuzz-merge: minimises committed + working corpus
#                                      into tests/fuzz/corpus/NAME (-merge=1); seed-* and
#                                      crash-* inputs are always kept
# Options every run gets: the target's dictionary tests/fuzz/NAME.dict when present,
# -timeout=60 (a hang is a failure), -rss_limit_mb=4096, -error_exitcode=1 (libFuzzer's
# default, 77, would read as SKIP), and -max_len=MAX from the first
# "max_len:" line of tests/fuzz/NAME.options when present.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
bindir=${PF_FUZZBIN:-$top/build/fuzz/tests/fuzz}

opts_for() { # name -> libFuzzer options
  local n=$1 o=(-timeout=60 -rss_limit_mb=4096 -error_exitcode=1 -print_final_stats=1)
  [ -f "$top/tests/fuzz/$n.dict" ] && o+=("-dict=$top/tests/fuzz/$n.dict")
  if [ -f "$top/tests/fuzz/$n.options" ]; then
    local ml=$(sed -n 's/^max_len: *//p' "$top/tests/fuzz/$n.options" | head -n 1)
    [ -n "$ml" ] && o+=("-max_len=$ml")
  fi
  echo "${o[@]}"
}

if [ "${1:-}" = --long ] || [ "${1:-}" = --merge ]; then
  mode=$1 secs=$2
  shift 2
  rc=0
  for n in "$@"; do
    bin="$bindir/fuzz_$n"
    [ -x "$bin" ] || { echo "fuzz: $bin not built" >&2; exit 1; }
    work="$top/build/fuzz/corpus/$n"
    mkdir -p "$work" "$top/tests/fuzz/corpus/$n"
    if [ "$mode" = --long ]; then
      crashes="$top/build/fuzz/crashes/$n"
      mkdir -p "$crashes"
      echo "== fuzz_$n: ${secs}s (corpus $work, crashes $crashes)"
      # shellcheck disable=SC2046
      "$bin" $(opts_for "$n") -max_total_time="$secs" -artifact_prefix="$crashes/" \
        "$work" "$top/tests/fuzz/corpus/$n" 2>&1 | grep -aE '^(#[0-9]+[[:space:]]+(DONE|INITED)|Done|==|SUMMARY|FUZZ CHECK|.*runtime error|stat::number_of_executed_units|Test unit written)'
      r=${PIPESTATUS[0]}
      [ "$r" -eq 0 ] || { echo "fuzz_$n: FAILED (exit $r); crash input in $crashes"; rc=1; }
    else
      out=$(mktemp -d)
      # shellcheck disable=SC2046
      "$bin" $(opts_for "$n") -merge=1 "$out" "$top/tests/fuzz/corpus/$n" "$work" >/dev/null 2>&1 ||
        { echo "fuzz_$n: merge failed" >&2; rm -rf "$out"; exit 1; }
      # named inputs (seed-*, crash-* regression inputs) are kept whatever coverage says;
      # the rest is replaced by the merge result (sha1 names)
      find "$top/tests/fuzz/corpus/$n" -maxdepth 1 -type f ! -name 'seed-*' ! -name 'crash-*' -delete
      for f in "$out"/*; do
        [ -e "$f" ] || continue
        dup=0
        for r in "$top/tests/fuzz/corpus/$n"/seed-* "$top/tests/fuzz/corpus/$n"/crash-*; do
          [ -e "$r" ] && cmp -s "$f" "$r" && dup=1 && break
        done
        [ $dup = 1 ] || cp "$f" "$top/tests/fuzz/corpus/$n/"
      done
      rm -rf "$out"
      echo "fuzz_$n: $(ls "$top/tests/fuzz/corpus/$n" | wc -l) inputs, $(cat "$top/tests/fuzz/corpus/$n"/* | wc -c) bytes"
    fi
  done
  exit $rc
fi

n=${1:?target name}
bin="$bindir/fuzz_$n"
if [ ! -x "$bin" ]; then
  why=$("$top/tests/fuzz/have-libfuzzer.sh") && why="SKIP: $bin not built (make fuzz-build)"
  echo "$why"
  exit 77
fi
corpus="$top/tests/fuzz/corpus/$n"
[ -d "$corpus" ] || { echo "no committed corpus $corpus"; exit 1; }
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
echo "fuzz_$n: $(ls "$corpus" | wc -l) committed inputs, then ${FUZZ_TEST_SECONDS:-5}s of fuzzing"
# shellcheck disable=SC2046
"$bin" $(opts_for "$n") -max_total_time="${FUZZ_TEST_SECONDS:-5}" \
  -artifact_prefix="${PF_FUZZ_ARTIFACTS:-$PWD}/fuzz_$n-" "$scratch" "$corpus"
