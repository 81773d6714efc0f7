#!/usr/bin/env bash
# Creates (once) the training frameworks' Python environment: a virtual
# environment of Debian's python3 at $HSDP_FRAMEWORKS_VENV (default
# build/venv-frameworks) with python_client/requirements-frameworks.txt:
# torchtitan, Hugging Face Accelerate, Lightning and their dependencies, all
# pinned, on the project's torch and numpy (its constraints line).
#
# torch is not installed a second time (5.5 GB with its NVIDIA libraries, and
# most of the set-up's time): the environment reads build/venv's packages
# (tools/scripts/python_env.sh, which this script runs first) through a .pth
# file placed after its own, and installs the frameworks' pinned closure into
# itself with --no-deps --ignore-installed, so pip never touches build/venv.
# Where both hold a package (fsspec, say) this environment's version wins.
# Do not `pip install` into it by hand without --ignore-installed: pip could
# then uninstall a package from build/venv.
#
# Same caching as python_env.sh: the wheels are downloaded once per machine
# into $HSDP_WHEEL_CACHE (default ~/.cache/hsdpd/wheels, shared with it, so
# torch's ~3 GB are not fetched twice) and every later environment installs
# from there offline. Idempotent: a stamp holding both requirement files' hash
# skips everything when nothing changed. Checks that the environment's torch is
# the pinned one (no dependency pulled another). Prints its python on stdout.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
VENV="${HSDP_FRAMEWORKS_VENV:-$BUILD_DIR/venv-frameworks}"
REQ="$ROOT/python_client/requirements-frameworks.txt"
PINS="$ROOT/python_client/requirements-torch.txt"
CACHE="${HSDP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hsdpd/wheels}"
BASE_PY=/usr/bin/python3

BASE_VENV_PY=$(HSDP_BUILD_DIR="$BUILD_DIR" bash "$ROOT/tools/scripts/python_env.sh")
BASE_SITE=$("$BASE_VENV_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
log() { echo "frameworks_env: $*" >&2; }
# shellcheck source=wheel_cache.sh
. "$ROOT/tools/scripts/wheel_cache.sh"

hash=$(cat "$REQ" "$PINS" "$(dirname "$BASE_VENV_PY")/../.hsdp-stamp" | sha256sum | cut -c1-16)
venv_current "$VENV" "$hash" && exit 0
ensure_venv_support
fill_wheel_cache "$CACHE" "$REQ"

new_venv "$VENV"
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$BASE_SITE" >"$SITE/zz-hsdp-base-venv.pth"
# The frameworks' closure, less what build/venv already holds at the pins.
grep -v -E '^(-c|torch|numpy|pytest)( |$)' "$REQ" >"$VENV/requirements-own.txt"
"$VENV/bin/python" -m pip install -q --no-index --find-links "$CACHE" --no-deps --no-compile \
  --ignore-installed -r "$VENV/requirements-own.txt" >&2
"$VENV/bin/python" -m pip check >&2
want=$(sed -n 's/^torch==//p' "$PINS")
"$VENV/bin/python" - "$want" <<'PY' >&2
import sys
from importlib.metadata import version, distributions
want = sys.argv[1]
torches = [d for d in distributions() if d.metadata["Name"].lower() == "torch"]
got = [d.version for d in torches]
if got != [want]:
    sys.exit(f"frameworks_env: expected exactly torch {want}, found {got}")
print("frameworks_env: torch %s, numpy %s, torchtitan %s, accelerate %s, lightning %s"
      % tuple(version(p) for p in ("torch", "numpy", "torchtitan", "accelerate", "lightning")))
PY
stamp_venv "$VENV" "$hash"
