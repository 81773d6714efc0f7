#!/usr/bin/env bash
# Creates (once) the benchmarks' plotting environment: a virtual environment of
# Debian's python3 at $HSDP_BENCH_VENV (default build/bench-venv) with the
# pinned packages of tools/bench/requirements-plot.txt (matplotlib). Wheels are
# downloaded once per machine into the project's wheel cache
# ($HSDP_WHEEL_CACHE, default ~/.cache/hsdpd/wheels), as python_env.sh does.
# Idempotent (a stamp of the requirements' hash). Prints the venv's python.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
VENV="${HSDP_BENCH_VENV:-$BUILD_DIR/bench-venv}"
REQ="$ROOT/tools/bench/requirements-plot.txt"
CACHE="${HSDP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hsdpd/wheels}"
BASE_PY=/usr/bin/python3

hash=$(sha256sum "$REQ" | cut -c1-16)
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.hsdp-stamp" 2>/dev/null)" = "$hash" ]; then
  echo "$VENV/bin/python"
  exit 0
fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if ! "$BASE_PY" -m pip download -q --only-binary=:all: -d "$CACHE" -r "$REQ" --no-index \
     --find-links "$CACHE" >/dev/null 2>&1; then
  echo "bench_env: downloading the pinned wheels into $CACHE (once per machine)" >&2
  "$BASE_PY" -m pip download -q --only-binary=:all: -d "$CACHE" -r "$REQ" >&2
fi
rm -rf "$VENV"
"$BASE_PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-index --find-links "$CACHE" -r "$REQ" >&2
echo "$hash" >"$VENV/.hsdp-stamp"
echo "$VENV/bin/python"
