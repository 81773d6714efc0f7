#!/usr/bin/env bash
# The README's test command: installs what is missing (Debian packages; the
# Python environment with torch 2.15.0 in build/venv, downloaded once per
# machine), builds, and runs every test through ctest (C++ unit and
# integration tests, CLI smoke tests, the soak, the compose cluster, the
# Python suite and torch's own suite), then the hardening step
# (tools/scripts/run_hardening.sh: the C++ tests under ASan+UBSan and TSan in
# clang builds, each fuzz target for a bounded time; docs/security.md).
#
#   tools/scripts/run_tests.sh            everything (what CI runs)
#   tools/scripts/run_tests.sh -R regex   only those ctest tests, no hardening step
# HSDP_HARDENING=0 skips the hardening step.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
start=$SECONDS
"$ROOT/tools/scripts/build.sh"
echo "run_tests: set-up and build took $(( SECONDS - start )) s"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
status=0
# The sanitizer builds of the hardening step compile in SCHED_IDLE (and the
# idle I/O class) while the main tests run: most of those tests wait on
# daemons, containers and the network, and the compiler takes only the CPU
# they leave; a test's own threads always go first (the CPU engine's
# SCHED_IDLE slices share with it). One compiler at a time: caches and
# memory bandwidth are shared even when the CPU is not, and a run with
# several idle-class compilers beside the tests took about twice as long in
# its Python and torch suites. Its output: build/hardening-build.log; the
# hardening step builds again whatever it did not finish (and shows errors).
prebuild_pid=""
if [ $# -eq 0 ] && [ "${HSDP_HARDENING:-1}" != 0 ]; then
  HSDP_JOBS=1 setsid chrt --idle 0 ionice -c 3 "$ROOT/tools/scripts/run_hardening.sh" build \
    >"$BUILD_DIR/hardening-build.log" 2>&1 &
  prebuild_pid=$!
  trap '[ -n "$prebuild_pid" ] && kill -- "-$prebuild_pid" 2>/dev/null; true' EXIT
fi
# The whole ctest output also goes to build/ctest-main.log (and the
# sanitizer stages' to build-asan/ctest-asan.log, build-tsan/ctest-tsan.log),
# so the failures can be repeated at the very end.
set +e
start=$SECONDS
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 1200 "$@") 2>&1 | tee "$BUILD_DIR/ctest-main.log"
status=${PIPESTATUS[0]}
set -e
echo "run_tests: the main tests ran in $(( SECONDS - start )) s"
if [ -n "$prebuild_pid" ]; then
  start=$SECONDS
  wait "$prebuild_pid" ||
    echo "run_tests: the background sanitizer builds failed (see $BUILD_DIR/hardening-build.log)"
  prebuild_pid=""
  echo "run_tests: waited $(( SECONDS - start )) s for the background sanitizer builds"
fi
logs=("$BUILD_DIR/ctest-main.log")
if [ $# -eq 0 ] && [ "${HSDP_HARDENING:-1}" != 0 ]; then
  "$ROOT/tools/scripts/run_hardening.sh" || status=1
  logs+=("${HSDP_ASAN_BUILD_DIR:-$ROOT/build-asan}/ctest-asan.log"
         "${HSDP_TSAN_BUILD_DIR:-$ROOT/build-tsan}/ctest-tsan.log")
fi
# Each stage's failures again, at the very end (a CI log's tail shows them).
"$ROOT/tools/scripts/ctest_failures.sh" "${logs[@]}" || true
exit $status
