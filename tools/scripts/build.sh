#!/usr/bin/env bash
# Configures and builds hsdpd into build/ (binaries in build/bin, the Python
# package in build/python). Runs the bootstrap and tools/scripts/python_env.sh
# (the tests' Python environment, build/venv; $HSDP_VENV elsewhere) first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$ROOT/tools/scripts/bootstrap.sh"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
# etcd's protos and binaries (the etcd client's stubs, its tests' cluster).
"$ROOT/tools/scripts/etcd_env.sh" "$BUILD_DIR/third_party/etcd"
# ccache (optional) hashes paths relative to the parent of the checkout, so
# several worktrees of one repository share the cache. Exported on every build:
# the compiler launcher reads it at compile time, not at configure time.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(dirname "$ROOT")}"
# The Python environment of the tests (torch 2.15.0, numpy, pytest; created
# once, then a no-op): its interpreter goes to CMake as HSDP_TEST_PYTHON. The
# extension is built for /usr/bin/python3, the environment's base interpreter.
TEST_PY="$(HSDP_BUILD_DIR="$BUILD_DIR" "$ROOT/tools/scripts/python_env.sh")"
if [ -f "$BUILD_DIR/build.ninja" ] && \
   ! grep -qxF "HSDP_TEST_PYTHON:FILEPATH=$TEST_PY" "$BUILD_DIR/CMakeCache.txt"; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -DHSDP_TEST_PYTHON="$TEST_PY" >/dev/null
fi
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  launcher=()
  # ccache is optional: used when present (developer machines), never required.
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DHSDP_TEST_PYTHON="$TEST_PY" "${launcher[@]}" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
