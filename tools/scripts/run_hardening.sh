#!/usr/bin/env bash
# CI's second step (.ci/run): the C++ tests and hsdpd under sanitizers, and
# the fuzz targets, each in its own clang build (docs/security.md "Fuzzing,
# sanitizers and the soak" says what is covered, what is left out and why):
#
#   1. build-asan/ (ASan + UBSan, libFuzzer coverage): every C++ test, hsdpd,
#      hsdpctl, hsdp-bench and the fuzz targets. ctest runs the C++ unit,
#      integration and CLI tests (the daemons they start are ASan builds
#      too), the soak for 60 s, each fuzz target for HSDP_FUZZ_SECONDS (20)
#      seconds, and the self-tests that plant one bug of each kind.
#   2. build-tsan/ (TSan): the data-plane, job, engine, cluster and client
#      tests (TSAN_TESTS below), the daemons they start, and the self-test.
#
# A sanitizer report from any process, a daemon a test started included,
# fails the step: every report goes to <build>/sanitizer-logs/ (log_path),
# which must be empty at the end; they are printed when not.
#
#   tools/scripts/run_hardening.sh            both
#   tools/scripts/run_hardening.sh asan|tsan  one of them
#   tools/scripts/run_hardening.sh build      only build both (run_tests.sh
#                                             does it in the background while
#                                             the main tests run)
# Extra arguments after the mode go to ctest (e.g. -R kv_store).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
modes="${1:-asan tsan}"
[ $# -gt 0 ] && shift
ctest_args=("$@")
ASAN_DIR="${HSDP_ASAN_BUILD_DIR:-$ROOT/build-asan}"
TSAN_DIR="${HSDP_TSAN_BUILD_DIR:-$ROOT/build-tsan}"

# ctest selections. Not here: the Python and torch suites (the extension is
# not built with sanitizers), the network-namespace and compose tests (they
# run in the first CI step and test deployment, not memory or threads), GPU
# tests (no GPU in CI).
ASAN_EXCLUDE_LABELS='netns|docker|python|torch_suite|gpu'
# Not under sanitizers: the test that runs hsdpd out of file descriptors on
# purpose. The sanitizer runtimes need fds themselves (UBSan's vptr check
# probes memory through a pipe, the symbolizer needs a socket pair), so at
# EMFILE UBSan reports a false "invalid vptr" and stops the daemon.
# Nor the observer's cost per operation: a speed bound, which the sanitizer's
# instrumentation (and its slower allocator) makes meaningless.
ASAN_EXCLUDE_TESTS='OutOfFileDescriptorsDoesNotSpinAndRecovers|PerOperationCost'
# The TSan subset: the tests whose code runs on several threads at once.
TSAN_TESTS=(
  validate_test group_test cross_node_test                          # data plane
  session_manager_test cluster_session_test                        # jobs
  cpu_engine_test hierarchical_engine_test gloo_transport_test      # engines
  nccl_engine_test nccl_cross_node_test nccl_abort_test nccl_shared_device_test
  kv_store_test coordinator_test cluster_member_test gloo_store_test  # cluster
  etcd_client_test                                                  # etcd (keep-alives, watches)
  job_id_test                                                       # client
  daemon_integration_test collectives_integration_test ring_integration_test
  cluster_membership_test cluster_kv_test cluster_datapath_test     # daemons together
)

status=0
report_logs() {  # report_logs DIR: prints the sanitizer reports, fails if any
  local dir="$1" found=0
  for f in "$dir"/*; do
    [ -e "$f" ] || continue
    found=1
    echo "=== sanitizer report: $f" >&2
    cat "$f" >&2
  done
  return $found
}

run_asan() {
  local start=$SECONDS
  "$ROOT/tools/scripts/sanitizer_build.sh" asan
  echo "run_hardening: build-asan built in $(( SECONDS - start )) s"
  local logs="$ASAN_DIR/sanitizer-logs"
  rm -rf "$logs" "$ASAN_DIR/fuzz/artifacts" "$ASAN_DIR/ctest-asan.log"
  mkdir -p "$logs"
  start=$SECONDS
  (cd "$ASAN_DIR" &&
   ASAN_OPTIONS="log_path=$logs/asan" UBSAN_OPTIONS="log_path=$logs/ubsan" \
   LSAN_OPTIONS="log_path=$logs/lsan" \
   ctest --output-on-failure --timeout 1200 -LE "$ASAN_EXCLUDE_LABELS" -E "$ASAN_EXCLUDE_TESTS" \
     "${ctest_args[@]}" 2>&1 | tee "$ASAN_DIR/ctest-asan.log"; exit "${PIPESTATUS[0]}") ||
    status=1
  echo "run_hardening: build-asan tests ran in $(( SECONDS - start )) s"
  report_logs "$logs" || status=1
}

build_tsan() {
  "$ROOT/tools/scripts/sanitizer_build.sh" tsan "${TSAN_TESTS[@]}" sanitizer_self_test hsdpd hsdpctl
}

run_tsan() {
  local start=$SECONDS
  build_tsan
  echo "run_hardening: build-tsan built in $(( SECONDS - start )) s"
  local logs="$TSAN_DIR/sanitizer-logs"
  rm -rf "$logs" "$TSAN_DIR/ctest-tsan.log"
  mkdir -p "$logs"
  local regex
  regex="^($(IFS='|'; echo "${TSAN_TESTS[*]}")|sanitizers)\\."
  start=$SECONDS
  (cd "$TSAN_DIR" &&
   TSAN_OPTIONS="log_path=$logs/tsan" \
   ctest --output-on-failure --timeout 1200 -R "$regex" "${ctest_args[@]}" 2>&1 |
     tee "$TSAN_DIR/ctest-tsan.log"; exit "${PIPESTATUS[0]}") || status=1
  echo "run_hardening: build-tsan tests ran in $(( SECONDS - start )) s"
  report_logs "$logs" || status=1
}

for m in $modes; do
  case "$m" in
    asan) run_asan ;;
    tsan) run_tsan ;;
    build) "$ROOT/tools/scripts/sanitizer_build.sh" asan && build_tsan; exit $? ;;
    *) echo "run_hardening.sh: unknown mode $m (asan or tsan)" >&2; exit 2 ;;
  esac
done
[ $status -eq 0 ] && echo "run_hardening: clean" || echo "run_hardening: FAILED" >&2
exit $status
