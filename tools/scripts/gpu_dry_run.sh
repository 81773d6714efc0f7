#!/usr/bin/env bash
# CI's dry run of the GPU chain (ctest gpu_bundle_dry_run; docs/gpu.md):
# collects the bundle from this build (CUDA on, whatever architectures CI
# builds for: the sm_90-only build is the same collection, see gpu.md), checks
# it (files, ldd, size), then runs every stage of run_gpu_tests.sh with
# --dry-run against it. Fails when any of it fails.
#   tools/scripts/gpu_dry_run.sh BUILD_DIR
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$(cd "${1:?usage: gpu_dry_run.sh BUILD_DIR}" && pwd)"
BUNDLE="$BUILD/gpu-bundle-dry"
export OUT="$BUILD/gpu-out-dry"
rm -rf "$OUT"
start=$(date +%s)
if ! "$ROOT/tools/scripts/gpu_bundle.sh" --no-build --build-dir "$BUILD" --out "$BUNDLE"; then
  echo "gpu_dry_run: collecting the bundle failed" >&2
  exit 1
fi
echo "gpu_dry_run: bundle collected in $(( $(date +%s) - start ))s"
failed=0
for stage in overlap probe core daemon torch bench; do
  if ! "$ROOT/tools/scripts/run_gpu_tests.sh" --stage "$stage" --dry-run --bundle "$BUNDLE"; then
    echo "gpu_dry_run: stage $stage failed its dry run" >&2
    failed=1
  fi
done
exit "$failed"
