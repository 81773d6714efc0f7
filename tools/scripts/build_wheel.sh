#!/usr/bin/env bash
# Builds the pip wheel of the Python client (python_client/pyproject.toml,
# docs/packaging.md "The Python wheel") for Debian's /usr/bin/python3:
#
#   tools/scripts/build_wheel.sh [OUT_DIR]     (default build/wheel/dist)
#
# prints the wheel's path on stdout. The build requirements of pyproject.toml
# (scikit-build-core, pybind11 and theirs) are downloaded once per machine
# into the project's wheel cache ($HSDP_WHEEL_CACHE, default
# ~/.cache/hsdpd/wheels, as tools/scripts/python_env.sh does for torch), and
# pip's build isolation installs them from there without the network.
# $HSDP_WHEEL_BUILD_DIR: a persistent CMake build folder (rebuilds are
# incremental); default a fresh temporary one. Needs the Debian -dev packages
# the main build needs (tools/scripts/bootstrap.sh) and ccache when present.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${1:-${HSDP_BUILD_DIR:-$ROOT/build}/wheel/dist}"
CACHE="${HSDP_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hsdpd/wheels}"
BASE_PY=/usr/bin/python3
log() { echo "build_wheel: $*" >&2; }

mkdir -p "$CACHE" "$OUT"
REQ="$(mktemp /tmp/hsdp-wheel-req.XXXXXX)"
trap 'rm -f "$REQ"' EXIT
"$BASE_PY" - "$ROOT/python_client/pyproject.toml" >"$REQ" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
PY
(
  flock 9
  if ! "$BASE_PY" -m pip download -q --only-binary=:all: -d "$CACHE" -r "$REQ" --no-index \
       --find-links "$CACHE" >/dev/null 2>&1; then
    log "downloading the build requirements into $CACHE (once per machine): $(tr '\n' ' ' <"$REQ")"
    "$BASE_PY" -m pip download -q --only-binary=:all: -d "$CACHE" -r "$REQ" >&2
  fi
) 9>"$CACHE/.lock"

args=()
if [ -n "${HSDP_WHEEL_BUILD_DIR:-}" ]; then
  args+=(--config-settings="build-dir=$HSDP_WHEEL_BUILD_DIR")
fi
rm -f "$OUT"/hsdp-*.whl
log "building the wheel of python_client/ into $OUT"
"$BASE_PY" -m pip wheel -q --no-deps --no-index --find-links "$CACHE" -w "$OUT" \
  "${args[@]}" "$ROOT/python_client" >&2
ls "$OUT"/hsdp-*.whl
