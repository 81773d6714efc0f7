#!/usr/bin/env bash
# Builds hsdpd here with CUDA for sm_90 (H100/H200) in build-gpu/ and
# collects what a GPU machine runs into gpu-bundle/ (docs/gpu.md, "A run a
# GPU machine can carry"): the daemon, every ctest entry labelled gpu, the
# GPU benchmark and probe, the shared libraries ldd names that the GPU
# machine lacks, and the kit that builds the Python extension there
# (gpu_bundle.py does the collecting). Carry it with the work tree
# (run's carry: ["gpu-bundle"]) and run tools/scripts/run_gpu_tests.sh there.
#
#   tools/scripts/gpu_bundle.sh [--build-dir DIR] [--out DIR] [--arch 90]
#                               [--no-build] [--check]
#
#   --no-build  collect from an existing build (CI: its own CUDA build)
#   --check     only check an existing bundle (files, ldd, size)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD="$ROOT/build-gpu"
OUT="$ROOT/gpu-bundle"
ARCH=90
BUILD_IT=1
CHECK=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --arch) ARCH="$2"; shift ;;
    --no-build) BUILD_IT=0 ;;
    --check) CHECK=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu_bundle.sh: unknown argument $1" >&2; exit 64 ;;
  esac
  shift
done
if [ "$CHECK" -eq 1 ]; then
  exec python3 "$ROOT/tools/scripts/gpu_bundle.py" --check --out "$OUT"
fi
if [ "$BUILD_IT" -eq 1 ]; then
  "$ROOT/tools/scripts/bootstrap.sh"
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(dirname "$ROOT")}"
  launcher=()
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  start=$(date +%s)
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHSDP_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" "${launcher[@]}" >"$BUILD.configure.log"
  # The test binaries labelled gpu (hsdp_add_test(NAME ... LABELS "...gpu...")):
  # gtest cases are discovered only once built, so the targets come from the
  # CMake files; what is collected afterwards comes from ctest -L gpu.
  mapfile -t gpu_targets < <(python3 - "$ROOT/tests" <<'PY'
import os, re, sys
for d, _, files in os.walk(sys.argv[1]):
    if "CMakeLists.txt" in files:
        text = open(os.path.join(d, "CMakeLists.txt")).read()
        for m in re.finditer(r"hsdp_add_test\(\s*([\w.-]+)([^)]*)\)", text):
            labels = re.search(r'LABELS\s+"?([^")]*)', m.group(2))
            if labels and "gpu" in labels.group(1):
                print(m.group(1))
PY
)
  if [ "${#gpu_targets[@]}" -eq 0 ]; then
    echo "gpu_bundle.sh: no test labelled gpu in tests/**/CMakeLists.txt" >&2
    exit 1
  fi
  if ! grep -q "HSDP_CUDA_ENABLED.*ON\|CUDA/NCCL engine: ON" "$BUILD.configure.log"; then
    echo "gpu_bundle.sh: CUDA not enabled in $BUILD ($BUILD.configure.log)" >&2
    exit 1
  fi
  cmake --build "$BUILD" -j "$(nproc)" --target hsdpd hsdpctl hsdp-gpu-bench hsdp-gpu-probe \
    hsdp_python_ext "${gpu_targets[@]}"
  echo "gpu_bundle.sh: built ${#gpu_targets[@]} GPU tests and the tools in $(( $(date +%s) - start ))s"
fi
python3 "$ROOT/tools/scripts/gpu_bundle.py" --build-dir "$BUILD" --out "$OUT" --root "$ROOT"
