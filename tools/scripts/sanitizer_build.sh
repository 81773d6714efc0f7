#!/usr/bin/env bash
# Configures (once) and builds a sanitizer build of hsdpd with clang:
#   sanitizer_build.sh asan [TARGET...]   build-asan/: ASan + UBSan + libFuzzer
#                                         coverage, with the fuzz targets
#   sanitizer_build.sh tsan [TARGET...]   build-tsan/: TSan
# Without targets it builds everything the build defines. Neither builds the
# Python extension or the CUDA code (HSDP_WITH_PYTHON=OFF, HSDP_WITH_CUDA=OFF):
# what they cover is C++ (docs/security.md "Fuzzing and sanitizers").
# $HSDP_ASAN_BUILD_DIR / $HSDP_TSAN_BUILD_DIR move the folders; -j is
# $HSDP_JOBS (default: the cores this process may use).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mode="${1:?usage: sanitizer_build.sh asan|tsan [TARGET...]}"
shift
"$ROOT/tools/scripts/bootstrap.sh"
case "$mode" in
  asan)
    dir="${HSDP_ASAN_BUILD_DIR:-$ROOT/build-asan}"
    opts=(-DHSDP_SANITIZE=address,undefined -DHSDP_FUZZ=ON)
    ;;
  tsan)
    dir="${HSDP_TSAN_BUILD_DIR:-$ROOT/build-tsan}"
    opts=(-DHSDP_SANITIZE=thread -DHSDP_FUZZ=OFF)
    ;;
  *) echo "sanitizer_build.sh: unknown mode $mode (asan or tsan)" >&2; exit 2 ;;
esac
if [ ! -f "$dir/build.ninja" ]; then
  launcher=()
  if command -v ccache >/dev/null 2>&1 && [ "${CCACHE_DISABLE:-0}" != 1 ]; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  # -O1 with line tables: readable stacks at a fraction of -g's compile time.
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Sanitize \
    -DCMAKE_CXX_FLAGS_SANITIZE="-O1 -gline-tables-only" \
    -DCMAKE_C_FLAGS_SANITIZE="-O1 -gline-tables-only" \
    -DCMAKE_EXE_LINKER_FLAGS="-fuse-ld=lld" \
    -DHSDP_WITH_PYTHON=OFF -DHSDP_WITH_CUDA=OFF -DHSDP_TEST_PYTHON="$(command -v python3)" \
    -DHSDP_ETCD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}/third_party/etcd" \
    "${opts[@]}" "${launcher[@]}" >/dev/null
fi
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(dirname "$ROOT")}"
jobs="${HSDP_JOBS:-$(nproc)}"
cmake --build "$dir" -j "$jobs" ${1:+--target "$@"}
