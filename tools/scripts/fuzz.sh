#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (docs/security.md "Fuzzing and
# sanitizers").
#
#   tools/scripts/fuzz.sh --minutes N      every target N minutes (builds first)
#   tools/scripts/fuzz.sh --seconds N      every target N seconds (CI: 20 each)
#   options: --targets a,b   only these (names as in tests/fuzz/, e.g.
#                            descriptor_fuzz)
#            --build DIR     the ASan+UBSan build with the targets
#                            (default build-asan/; built unless --no-build)
#            --jobs N        N fuzzer processes per target (libFuzzer -fork)
#            --merge         afterwards, add the inputs that found new
#                            coverage to tests/fuzz/corpus/<target>/
#                            (minimised; review and commit them)
#
# Each target starts from its seeds (tests/fuzz/corpus/<target>/) and what
# earlier runs found (<build>/fuzz/corpus/<target>/), with its dictionary.
# A crash, a leak, a sanitizer report, an oracle failure, an input slower
# than 10 s or over 2 GiB fails the run: the input is kept in
# <build>/fuzz/artifacts/<target>/ and the command to reproduce it is
# printed. Exit status: 0 when every target ran clean, 1 otherwise.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
seconds=""
targets=""
build="${HSDP_ASAN_BUILD_DIR:-$ROOT/build-asan}"
do_build=1
jobs=1
merge=0
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) seconds=$(( $2 * 60 )); shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --targets) targets="${2//,/ }"; shift 2 ;;
    --build) build="$(cd "$2" && pwd)"; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --jobs) jobs="$2"; shift 2 ;;
    --merge) merge=1; shift ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "fuzz.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$seconds" ]; then
  echo "fuzz.sh: say how long: --minutes N or --seconds N" >&2
  exit 2
fi
if [ -z "$targets" ]; then
  targets="$(cd "$ROOT/tests/fuzz" && ls ./*_fuzz.cc | sed 's|^\./||; s|\.cc$||' | tr '\n' ' ')"
fi
if [ "$do_build" = 1 ]; then
  # shellcheck disable=SC2086
  HSDP_ASAN_BUILD_DIR="$build" "$ROOT/tools/scripts/sanitizer_build.sh" asan $targets
fi

failed=()
for t in $targets; do
  bin="$build/tests/fuzz/$t"
  seeds="$ROOT/tests/fuzz/corpus/$t"
  work="$build/fuzz/corpus/$t"
  artifacts="$build/fuzz/artifacts/$t"
  if [ ! -x "$bin" ]; then
    echo "fuzz.sh: $bin is not built (run without --no-build)" >&2
    failed+=("$t")
    continue
  fi
  if [ ! -d "$seeds" ] || [ -z "$(ls -A "$seeds")" ]; then
    echo "fuzz.sh: $t has no seeds in $seeds" >&2
    failed+=("$t")
    continue
  fi
  mkdir -p "$work" "$artifacts"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096
        -print_final_stats=1 -artifact_prefix="$artifacts/")
  [ -f "$ROOT/tests/fuzz/$t.dict" ] && args+=(-dict="$ROOT/tests/fuzz/$t.dict")
  [ "$jobs" -gt 1 ] && args+=(-fork="$jobs" -ignore_crashes=0)
  log="$build/fuzz/$t.log"
  echo "fuzz.sh: $t for ${seconds}s (log $log)"
  # New inputs go to the first folder (the build's); the seeds stay as they are.
  if "$bin" "${args[@]}" "$work" "$seeds" >"$log" 2>&1; then
    grep -aE "^stat::number_of_executed_units|^stat::new_units_added|cov: " "$log" | tail -3 |
      sed "s/^/  $t: /"
  else
    rc=$?
    failed+=("$t")
    echo "fuzz.sh: $t FAILED (exit $rc); the end of its log:" >&2
    tail -n 60 "$log" >&2
    for a in "$artifacts"/*; do
      [ -e "$a" ] || continue
      echo "fuzz.sh: input kept: $a" >&2
      echo "fuzz.sh: reproduce: $bin $a" >&2
    done
  fi
  if [ "$merge" = 1 ]; then
    "$bin" -merge=1 -max_len=4096 "$seeds" "$work" >>"$log" 2>&1 || true
    echo "fuzz.sh: $t: merged new coverage into $seeds (review and commit)"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: every target ran clean"
