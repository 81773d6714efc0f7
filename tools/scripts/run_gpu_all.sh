#!/usr/bin/env bash
# Every GPU stage in one call of the device tool (a lease is short and each
# start costs minutes): builds hsdp._hsdp from the bundle's pykit in the
# background while probe, core and daemon run, then torch (with
# gpu_torch_e2e.py --bench) and bench, each stage's budget cut to what is
# left of TOTAL_S. Reports and logs go to $OUT (run_gpu_tests.sh's files plus
# ext.log and summary.txt).
#
#   tools/scripts/run_gpu_all.sh [--total-s 420] [--stages overlap,probe,core,daemon,torch,bench]
#                                [--e2e-args "--bench --max-mb 1024"]
#                                [--sizes-mb 0.00390625,1,16,64,256,1024] (bench)
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOTAL_S=420
STAGES="overlap,probe,core,daemon,torch,bench"  # the overlap probe first (issue 36)
E2E_ARGS="--bench --max-mb 1024"
SIZES="0.00390625,1,16,64,256,1024"
while [ $# -gt 0 ]; do
  case "$1" in
    --total-s) TOTAL_S="$2"; shift ;;
    --stages) STAGES="$2"; shift ;;
    --e2e-args) E2E_ARGS="$2"; shift ;;
    --sizes-mb) SIZES="$2"; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "run_gpu_all.sh: unknown argument $1" >&2; exit 64 ;;
  esac
  shift
done
export OUT="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT"
START=$(date +%s)
left() { echo $(( TOTAL_S - ($(date +%s) - START) )); }
declare -A SHARE=([overlap]=60 [probe]=45 [core]=90 [daemon]=90 [torch]=200 [bench]=90)

EXT_DIR="${TMPDIR:-/tmp}/hsdp-gpu-ext"
rm -rf "$EXT_DIR"; mkdir -p "$EXT_DIR"
if [[ ",$STAGES," == *",torch,"* ]]; then
  ( NCCL_LIB="$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null)"
    export LD_LIBRARY_PATH="$ROOT/gpu-bundle/lib${NCCL_LIB:+:$NCCL_LIB}"
    s=$(date +%s)
    timeout 300 bash "$ROOT/gpu-bundle/pykit/build_ext.sh" "$EXT_DIR" >"$OUT/ext.log" 2>&1
    echo "build_ext exit $? in $(( $(date +%s) - s ))s" >>"$OUT/ext.log" ) &
  EXT_PID=$!
fi
rc=0
: >"$OUT/summary.txt"
for stage in ${STAGES//,/ }; do
  budget=${SHARE[$stage]:-60}
  l=$(left)
  [ "$budget" -gt "$l" ] && budget=$l
  if [ "$budget" -lt 15 ]; then
    echo "$stage: not run, ${l}s left of ${TOTAL_S}s" | tee -a "$OUT/summary.txt"
    rc=1; continue
  fi
  extra=()
  if [ "$stage" = "torch" ] && [ -n "${EXT_PID:-}" ]; then
    wait "$EXT_PID"
    tail -1 "$OUT/ext.log"
    so="$(ls "$EXT_DIR"/hsdp/_hsdp*.so 2>/dev/null | head -1)"
    [ -n "$so" ] && extra=(HSDP_PREBUILT_EXT="$so")
    l=$(left); [ "$budget" -gt "$l" ] && budget=$l
  fi
  s=$(date +%s)
  env "${extra[@]}" HSDP_STAGE_BUDGET_S="$budget" HSDP_E2E_ARGS="$E2E_ARGS" \
    bash "$ROOT/tools/scripts/run_gpu_tests.sh" --stage "$stage" --sizes-mb "$SIZES"
  src=$?
  [ "$src" -ne 0 ] && rc=1
  echo "$stage: exit $src in $(( $(date +%s) - s ))s (budget ${budget}s)" | tee -a "$OUT/summary.txt"
done
echo "all: $(( $(date +%s) - START ))s, exit $rc" | tee -a "$OUT/summary.txt"
exit "$rc"
