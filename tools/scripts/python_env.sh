#!/usr/bin/env bash
# Creates (once) the project's Python environment: a virtual environment of
# Debian's python3 (3.11 on bookworm) at $HSDP_VENV (default build/venv) with
# the pinned packages of python_client/requirements-torch.txt. Idempotent: a
# stamp holding the requirements' hash skips everything when nothing changed.
#
# PyPI's torch wheel is a CUDA build of about 3 GB with its NVIDIA libraries:
# the wheels are downloaded once per machine into $HSDP_WHEEL_CACHE (default
# ~/.cache/hsdpd/wheels) and every later environment installs from there
# without touching the network. Prints the environment's python on stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
VENV="${HSDP_VENV:-$BUILD_DIR/venv}"
REQ="$ROOT/python_client/requirements-torch.txt"
CACHE="${HSDP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hsdpd/wheels}"
BASE_PY=/usr/bin/python3

log() { echo "python_env: $*" >&2; }
# shellcheck source=wheel_cache.sh
. "$ROOT/tools/scripts/wheel_cache.sh"

hash=$(sha256sum "$REQ" | cut -c1-16)
venv_current "$VENV" "$hash" && exit 0
ensure_venv_support
fill_wheel_cache "$CACHE" "$REQ"

new_venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-index --find-links "$CACHE" -r "$REQ" >&2
"$VENV/bin/python" - <<'PY' >&2
import torch, numpy
print(f"python_env: torch {torch.__version__}, numpy {numpy.__version__}")
PY
stamp_venv "$VENV" "$hash"
