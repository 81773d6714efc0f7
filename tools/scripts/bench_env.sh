#!/usr/bin/env bash
# Creates (once) the benchmarks' plotting environment: a virtual environment of
# Debian's python3 at $HSDP_BENCH_VENV (default build/bench-venv) with the
# pinned packages of tools/bench/requirements-plot.txt (matplotlib). Wheels are
# downloaded once per machine into the project's wheel cache
# ($HSDP_WHEEL_CACHE, default ~/.cache/hsdpd/wheels) and the environment is
# stamped with the requirements' hash (wheel_cache.sh, as python_env.sh does).
# Idempotent. Prints the venv's python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
VENV="${HSDP_BENCH_VENV:-$BUILD_DIR/bench-venv}"
REQ="$ROOT/tools/bench/requirements-plot.txt"
CACHE="${HSDP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hsdpd/wheels}"
BASE_PY=/usr/bin/python3

log() { echo "bench_env: $*" >&2; }
# shellcheck source=wheel_cache.sh
. "$ROOT/tools/scripts/wheel_cache.sh"

hash=$(sha256sum "$REQ" | cut -c1-16)
venv_current "$VENV" "$hash" && exit 0
fill_wheel_cache "$CACHE" "$REQ"
new_venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-index --find-links "$CACHE" -r "$REQ" >&2
stamp_venv "$VENV" "$hash"
