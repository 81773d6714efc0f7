#!/usr/bin/env bash
# The README's test command: installs what is missing (Debian packages; the
# Python environment with torch 2.15.0 in build/venv, downloaded once per
# machine), builds, and runs every test (C++ unit and integration tests, CLI
# smoke tests, the Python suite and torch's own suite) through ctest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$ROOT/tools/scripts/build.sh"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
cd "$BUILD_DIR"
ctest --output-on-failure --timeout 1200 "$@"
