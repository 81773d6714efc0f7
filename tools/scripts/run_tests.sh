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
"$ROOT/tools/scripts/build.sh"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
status=0
(cd "$BUILD_DIR" && ctest --output-on-failure --timeout 1200 "$@") || status=$?
if [ $# -eq 0 ] && [ "${HSDP_HARDENING:-1}" != 0 ]; then
  "$ROOT/tools/scripts/run_hardening.sh" || status=1
fi
exit $status
