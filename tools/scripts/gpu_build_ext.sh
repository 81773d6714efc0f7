#!/usr/bin/env bash
# Builds the Python extension hsdp._hsdp on the GPU machine, against its own
# Python (3.12 there) and pybind11 (pip), from the bundle's pykit/ (made by
# gpu_bundle.py: binding sources, headers, the project's static libraries,
# the link inputs in order). The shared libraries it links are the bundle's
# lib/. Usage: build_ext.sh OUT_DIR  -> OUT_DIR/hsdp/_hsdp<EXT_SUFFIX>
# (with --dry-run: prints the command, checks every input exists).
set -euo pipefail
KIT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
BUNDLE="$(dirname "$KIT")"
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT="${1:?usage: build_ext.sh [--dry-run] OUT_DIR}"
PY="${PYTHON:-python3}"
static=(); shared=(); system=(); missing=0
while read -r kind name; do
  case "$kind" in
    static) static+=("$KIT/lib/$name"); [ -f "$KIT/lib/$name" ] || { echo "missing $KIT/lib/$name" >&2; missing=1; } ;;
    shared) shared+=("$BUNDLE/lib/$name"); [ -f "$BUNDLE/lib/$name" ] || { echo "missing $BUNDLE/lib/$name" >&2; missing=1; } ;;
    system) system+=("$name") ;;
  esac
done < "$KIT/link.txt"
ls "$KIT"/src/*.cc >/dev/null || missing=1
[ -d "$KIT/include/hsdp" ] || { echo "missing $KIT/include/hsdp" >&2; missing=1; }
[ "$missing" -eq 0 ] || exit 1
if [ "$DRY" -eq 1 ]; then
  inc="-I<python> -I<pybind11>"; suffix="<EXT_SUFFIX>"
else
  inc="$("$PY" -m pybind11 --includes)"
  suffix="$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
fi
mkdir -p "$OUT/hsdp"
flags=(-O2 -std=c++20 -fPIC -fvisibility=hidden)
# shellcheck disable=SC2046,SC2086
cflags=("${flags[@]}" $inc $(cat "$KIT/defines.txt") -I"$KIT/include")
link_tail=(-Wl,--start-group "${static[@]}" -Wl,--end-group "${shared[@]}" "${system[@]}"
      -Wl,-rpath,"$BUNDLE/lib")
if [ "$DRY" -eq 1 ]; then
  echo "${CXX:-c++} ${cflags[*]} -c <each of $KIT/src/*.cc> (in parallel)"
  echo "${CXX:-c++} -shared -o $OUT/hsdp/_hsdp$suffix $OUT/obj/*.o ${link_tail[*]}"
  exit 0
fi
# One compiler per source, in parallel: the GPU machine has many cores and
# each binding source takes tens of seconds alone.
mkdir -p "$OUT/obj"
printf '%s\n' "$KIT"/src/*.cc | xargs -P "$(nproc)" -I{} sh -c \
  'src="$1"; shift; exec "$@" -c "$src" -o "'"$OUT"'/obj/$(basename "$src" .cc).o"' _ {} \
  "${CXX:-c++}" "${cflags[@]}"
"${CXX:-c++}" -shared -o "$OUT/hsdp/_hsdp$suffix" "$OUT"/obj/*.o "${link_tail[@]}"
