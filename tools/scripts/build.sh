#!/usr/bin/env bash
# Configures and builds hsdpd into build/ (binaries in build/bin, the Python
# package in build/python). Runs the bootstrap first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$ROOT/tools/scripts/bootstrap.sh"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
# ccache (optional) hashes paths relative to the parent of the checkout, so
# several worktrees of one repository share the cache. Exported on every build:
# the compiler launcher reads it at compile time, not at configure time.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(dirname "$ROOT")}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  launcher=()
  # ccache is optional: used when present (developer machines), never required.
  if command -v ccache >/dev/null 2>&1; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
