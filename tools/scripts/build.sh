#!/usr/bin/env bash
# Configures and builds hsdpd into build/ (binaries in build/bin, the Python
# package in build/python). Runs the bootstrap first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$ROOT/tools/scripts/bootstrap.sh"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
