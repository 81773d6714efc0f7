#!/usr/bin/env bash
# Builds the Debian package hsdpd_<version>_amd64.deb from a build folder
# (CPack DEB, deploy/packaging/packaging.cmake; docs/packaging.md) and prints
# its path. The build must be up to date (tools/scripts/build.sh).
#
#   tools/scripts/build_deb.sh [--build-dir build] [--version V] [--out DIR]
#
# --version V packages the same files as version V (the upgrade test installs
# one package over another); default: the project's version.
# Same as `cmake --build build --target package` (that one into build/packages).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="$ROOT/build"
VERSION=""
OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir) BUILD="$(cd "$2" && pwd)"; shift 2 ;;
    --version) VERSION="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    *) echo "usage: $0 [--build-dir DIR] [--version V] [--out DIR]" >&2; exit 2 ;;
  esac
done
# dpkg-shlibdeps computes the dependencies (dpkg-dev; bootstrap.sh installs it).
command -v dpkg-shlibdeps >/dev/null || "$ROOT/tools/scripts/bootstrap.sh"
OUT="${OUT:-$BUILD/packages}"
mkdir -p "$OUT"
args=(-G DEB --config "$BUILD/CPackConfig.cmake" -B "$OUT")
if [ -n "$VERSION" ]; then
  args+=(-D "CPACK_PACKAGE_VERSION=$VERSION")
fi
log="$OUT/cpack.log"
if ! (cd "$BUILD" && cpack "${args[@]}") >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
deb=$(sed -n 's/^CPack: - package: \(.*\.deb\) generated\.$/\1/p' "$log" | tail -n 1)
[ -n "$deb" ] && [ -f "$deb" ] || { cat "$log" >&2; echo "build_deb: no .deb" >&2; exit 1; }
echo "$deb"
