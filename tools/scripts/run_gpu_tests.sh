#!/usr/bin/env bash
# The GPU checks, one stage per call, on a GPU machine that carries the
# bundle gpu_bundle.sh made (docs/gpu.md, "A run a GPU machine can carry").
# The machine has CUDA, Python 3.12 with torch and pip's nvidia-nccl-cu13, a
# compiler, and none of gRPC / protobuf / abseil: everything else comes in
# the bundle (bin/, tests/, lib/, pykit/).
#
#   tools/scripts/run_gpu_tests.sh --stage overlap|probe|core|daemon|torch|bench
#        [--bundle DIR (gpu-bundle)] [--dry-run] [--sizes-mb 1,16,64]
#
#   overlap hsdp-overlap-probe (issue 36, docs/gpu.md "The overlap probe"):
#           a trainer's kernel beside another uid's copies / small kernels
#           without MPS, an idle context's cost, the flag hand-off, the
#           reduce kernel against the copy; as root, two unprivileged uids
#   probe   versions (driver, nvcc, Python, torch, NCCL), what torch's
#           _share_cuda_ returns (handle length, version and type bytes),
#           hsdp-gpu-probe (two exported VMM fds: fstat, /proc/self/fd, kcmp;
#           a legacy handle opened twice by a child; UUIDs), ldd of the bundle
#   core    the bundle's GPU unit tests (ctest label gpu + unit)
#   daemon  the bundle's GPU integration tests (label gpu + integration):
#           a real hsdpd from the bundle, trainer processes on the GPU
#   torch   builds hsdp._hsdp from pykit for this Python, then the torch
#           backend on CUDA tensors + FSDP2 (gpu_torch_e2e.py) and the CUDA
#           tests of tests/python/test_cuda.py
#   bench   hsdp-gpu-bench (the NCCL engine vs raw NCCL) and torch's NCCL
#
# Each stage stays under 9 minutes (every command has a timeout inside the
# stage's budget) and writes $OUT/<stage>.report.txt (one line per check:
# name, OK/FAIL/SKIP, detail) and $OUT/<stage>.log; $OUT defaults to
# ./gpu-out. Exit status: non-zero when any check failed. On a GPU machine a
# skipped GPU test is a failure.
#
# Environment: HSDP_STAGE_BUDGET_S (the stage's budget), HSDP_PREBUILT_EXT
# (torch: an already built hsdp/_hsdp*.so to use instead of building one),
# HSDP_E2E_ARGS (torch: more arguments of gpu_torch_e2e.py, e.g. --bench).
#
# --dry-run (what CI runs, no GPU needed): checks that everything the stage
# needs is in the bundle and that its scripts parse, prints the commands it
# would run, and fails when anything is missing.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUNDLE="$ROOT/gpu-bundle"
PYTHON="${PYTHON:-python3}"
STAGE=""
DRY=0
SIZES="1,16,64,256"
STAGE_BUDGET_S="${HSDP_STAGE_BUDGET_S:-510}"  # 8.5 minutes
while [ $# -gt 0 ]; do
  case "$1" in
    --stage) STAGE="${2:-}"; shift ;;
    --bundle) BUNDLE="$(cd "${2:?}" && pwd)"; shift ;;
    --dry-run) DRY=1 ;;
    --sizes-mb) SIZES="$2"; shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "run_gpu_tests.sh: unknown argument $1" >&2; exit 64 ;;
  esac
  shift
done
case "$STAGE" in
  overlap|probe|core|daemon|torch|bench) ;;
  *) echo "run_gpu_tests.sh: --stage overlap|probe|core|daemon|torch|bench is required" >&2; exit 64 ;;
esac

OUT_DIR="${OUT:-$ROOT/gpu-out}"
mkdir -p "$OUT_DIR"
REPORT="$OUT_DIR/$STAGE.report.txt"
LOG="$OUT_DIR/$STAGE.log"
: >"$REPORT"
: >"$LOG"
START=$(date +%s)
FAILED=0

record() {  # record NAME OK|FAIL|SKIP [DETAIL]
  printf '%-34s %-5s %s\n' "$1" "$2" "${3:-}" | tee -a "$REPORT"
  if [ "$2" = "FAIL" ]; then FAILED=1; fi
}
left() {  # seconds left of the stage's budget
  echo $(( STAGE_BUDGET_S - ($(date +%s) - START) ))
}
# run_logged NAME MAX_S CMD...: runs CMD with a timeout inside the budget,
# its output appended to the log; returns CMD's status (124: timed out).
run_logged() {
  local name="$1" max="$2"; shift 2
  local t; t=$(left)
  [ "$t" -gt "$max" ] && t="$max"
  if [ "$t" -le 5 ]; then
    echo "=== $name: no time left in the stage budget" >>"$LOG"
    return 124
  fi
  echo "=== $name (timeout ${t}s): $*" >>"$LOG"
  timeout --kill-after=10 "$t" "$@" >>"$LOG.part" 2>&1
  local rc=$?
  # Keep the log bounded: the whole output of short runs, the tail of long ones.
  if [ "$(wc -c <"$LOG.part")" -gt 400000 ]; then
    head -c 100000 "$LOG.part" >>"$LOG"; echo "... (cut) ..." >>"$LOG"
    tail -c 200000 "$LOG.part" >>"$LOG"
  else
    cat "$LOG.part" >>"$LOG"
  fi
  rm -f "$LOG.part"
  echo "=== $name: exit $rc" >>"$LOG"
  return "$rc"
}

manifest_entries() {  # manifest_entries KIND -> paths
  [ -f "$BUNDLE/MANIFEST" ] && awk -v k="$1" '$1 == k {print $2}' "$BUNDLE/MANIFEST"
}
need() {  # need PATH...: records FAIL for each missing bundle file
  local ok=0
  for p in "$@"; do
    if [ ! -e "$BUNDLE/$p" ]; then record "bundle: $p" "FAIL" "missing"; ok=1; fi
  done
  return "$ok"
}
parses() {  # parses FILE.py
  if "$PYTHON" -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())' "$1" 2>>"$LOG"; then
    record "syntax $(basename "$1")" "OK"
  else
    record "syntax $(basename "$1")" "FAIL"
  fi
}

gpu_present() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

# --- the bundle and the environment ----------------------------------------
if [ ! -f "$BUNDLE/MANIFEST" ]; then
  record "bundle" "FAIL" "no $BUNDLE/MANIFEST: run tools/scripts/gpu_bundle.sh and carry gpu-bundle"
  exit 1
fi
if python3 "$ROOT/tools/scripts/gpu_bundle.py" --check --out "$BUNDLE" >>"$LOG" 2>&1; then
  record "bundle check" "OK" "$(tail -1 "$LOG" | head -c 120)"
else
  record "bundle check" "FAIL" "see $LOG"
fi
NCCL_LIB=""
if [ "$DRY" -eq 0 ]; then
  NCCL_LIB="$("$PYTHON" -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)"
fi
export LD_LIBRARY_PATH="$BUNDLE/lib${NCCL_LIB:+:$NCCL_LIB}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export HSDP_BIN_DIR="$BUNDLE/bin"

if [ "$DRY" -eq 0 ] && ! gpu_present; then
  record "gpu" "FAIL" "no GPU (nvidia-smi finds none); use --dry-run on a machine without one"
  exit 1
fi

# run_gtest NAME BINARY MAX_S: a gtest binary; a skipped test fails (GPU machine).
run_gtest() {
  local name="$1" bin="$2" max="$3"
  if [ "$DRY" -eq 1 ]; then
    echo "would run: $bin (timeout ${max}s)" >>"$LOG"
    record "$name" "OK" "dry run: present"
    return
  fi
  local before; before=$(wc -l <"$LOG")
  run_logged "$name" "$max" "$bin" --gtest_color=no
  local rc=$?
  local part; part="$(tail -n +"$((before + 1))" "$LOG")"
  local skipped; skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z]' <<<"$part" || true)
  local passed; passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' <<<"$part")
  if [ "$rc" -eq 124 ]; then
    record "$name" "FAIL" "timed out"
  elif [ "$rc" -ne 0 ]; then
    record "$name" "FAIL" "exit $rc: $(grep -m3 -E 'Failure|FAILED' <<<"$part" | tr '\n' ' ' | head -c 200)"
  elif [ "${skipped:-0}" -gt 0 ]; then
    record "$name" "FAIL" "$skipped test(s) skipped on a GPU machine"
  else
    record "$name" "OK" "${passed:-?} passed"
  fi
}

case "$STAGE" in
overlap)
  if ! need bin/hsdp-overlap-probe; then
    :
  elif [ "$DRY" -eq 1 ]; then
    # Present and starting: without a GPU it must say so and exit 2.
    "$BUNDLE/bin/hsdp-overlap-probe" --kernel-ms 5 >>"$LOG" 2>&1
    rc=$?
    if [ "$rc" -eq 2 ] || [ "$rc" -eq 0 ]; then
      record "hsdp-overlap-probe" "OK" "dry run: starts (exit $rc)"
    else
      record "hsdp-overlap-probe" "FAIL" "exit $rc without a GPU (want 2); see $LOG"
    fi
  else
    if run_logged "hsdp-overlap-probe" 180 "$BUNDLE/bin/hsdp-overlap-probe" --json "$OUT_DIR/overlap.json"; then
      record "hsdp-overlap-probe" "OK" "$(grep -m1 '^(a)' "$LOG" | head -c 160)"
    else
      record "hsdp-overlap-probe" "FAIL" "see $LOG"
    fi
    if run_logged "hsdp-overlap-probe --same-uid" 120 "$BUNDLE/bin/hsdp-overlap-probe" --same-uid --json "$OUT_DIR/overlap_same_uid.json"; then
      record "hsdp-overlap-probe --same-uid" "OK" "$(grep '^(a)' "$LOG" | tail -1 | head -c 160)"
    else
      record "hsdp-overlap-probe --same-uid" "FAIL" "see $LOG"
    fi
  fi
  ;;
probe)
  if ! need bin/hsdp-gpu-probe; then
    :
  elif [ "$DRY" -eq 1 ]; then
    echo "would run: nvidia-smi, nvcc --version, $PYTHON (torch, _share_cuda_, NCCL), $BUNDLE/bin/hsdp-gpu-probe, ldd" >>"$LOG"
    record "probe" "OK" "dry run"
  else
    {
      echo "uname: $(uname -r)"
      nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader
      (command -v nvcc >/dev/null && nvcc --version | tail -2) || echo "nvcc: not on PATH"
      echo "nccl lib dir: ${NCCL_LIB:-none}"; ls "$NCCL_LIB" 2>/dev/null
    } >>"$LOG" 2>&1
    record "versions" "OK" "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
    if run_logged "torch _share_cuda_" 120 "$PYTHON" - <<'PY'
import sys, torch
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
print("nccl", torch.cuda.nccl.version() if hasattr(torch.cuda, "nccl") else "?")
t = torch.arange(1024, device="cuda", dtype=torch.float32)
shared = t.untyped_storage()._share_cuda_()
h = shared[1]
print("share_cuda_tuple_len", len(shared))
print("share_cuda_handle_len", len(h), "version_byte", h[0], "type_byte", chr(h[1]) if len(h) > 1 else None)
print("share_cuda_offset", shared[3], "ref_counter", shared[4], shared[5])
print("device_uuid", getattr(torch.cuda.get_device_properties(0), "uuid", None))
try:
    from cuda.bindings import driver  # noqa: F401
    print("cuda_bindings yes")
except ImportError as e:
    print("cuda_bindings no", e)
PY
    then record "torch _share_cuda_" "OK" "$(grep -m1 share_cuda_handle_len "$LOG")"
    else record "torch _share_cuda_" "FAIL" "see $LOG"; fi
    if run_logged "hsdp-gpu-probe" 120 "$BUNDLE/bin/hsdp-gpu-probe"; then
      record "hsdp-gpu-probe" "OK" "$(grep -m1 legacy_reopen_same_pointer "$LOG") $(grep -m1 vmm_kcmp "$LOG" | cut -c1-20)"
    else
      record "hsdp-gpu-probe" "FAIL" "see $LOG"
    fi
  fi
  notfound=0
  for f in "$BUNDLE"/bin/* "$BUNDLE"/tests/*; do
    [ -f "$f" ] || continue
    if ldd "$f" 2>/dev/null | grep -v -E 'libcuda\.|libnccl\.' | grep -q 'not found'; then
      echo "ldd $f:" >>"$LOG"; ldd "$f" | grep 'not found' >>"$LOG"; notfound=1
    fi
    if [ "$DRY" -eq 0 ] && ldd "$f" 2>/dev/null | grep -q 'not found'; then
      echo "ldd $f (with NCCL):" >>"$LOG"; ldd "$f" | grep 'not found' >>"$LOG"; notfound=1
    fi
  done
  if [ "$notfound" -eq 0 ]; then record "ldd" "OK" "every library found"
  else record "ldd" "FAIL" "see $LOG"; fi
  ;;
core|daemon)
  mapfile -t tests < <(manifest_entries "test:$STAGE")
  if [ "${#tests[@]}" -eq 0 ]; then
    record "$STAGE tests" "FAIL" "no test:$STAGE entry in the bundle's MANIFEST"
  fi
  if [ "$STAGE" = "daemon" ]; then need bin/hsdpd bin/hsdpctl || true; fi
  for t in "${tests[@]}"; do
    need "$t" && run_gtest "$(basename "$t")" "$BUNDLE/$t" 300
  done
  ;;
torch)
  need pykit/build_ext.sh pykit/link.txt bin/hsdpd || true
  parses "$ROOT/tools/bench/gpu_torch_e2e.py"
  parses "$ROOT/tests/python/test_cuda.py"
  WORK="${TMPDIR:-/tmp}/hsdp-gpu-torch"
  rm -rf "$WORK"; mkdir -p "$WORK/python"
  if [ "$DRY" -eq 1 ]; then
    if bash "$BUNDLE/pykit/build_ext.sh" --dry-run "$WORK/python" >>"$LOG" 2>&1; then
      record "build hsdp._hsdp" "OK" "dry run: every input present"
    else
      record "build hsdp._hsdp" "FAIL" "see $LOG"
    fi
    echo "would run: gpu_torch_e2e.py --build $WORK; pytest tests/python/test_cuda.py" >>"$LOG"
  else
    cp -r "$ROOT/python_client/hsdp" "$WORK/python/"
    ln -s "$BUNDLE/bin" "$WORK/bin"
    prebuilt="$(ls "${HSDP_PREBUILT_EXT:-/nonexistent}" 2>/dev/null || true)"
    if [ -n "$prebuilt" ]; then  # built by run_gpu_all.sh while the other stages ran
      cp "$prebuilt" "$WORK/python/hsdp/"
      echo "=== build hsdp._hsdp: prebuilt $prebuilt" >>"$LOG"
    fi
    if [ -n "$prebuilt" ] || run_logged "build hsdp._hsdp" 240 bash "$BUNDLE/pykit/build_ext.sh" "$WORK/python"; then
      record "build hsdp._hsdp" "OK" "$(ls "$WORK"/python/hsdp/_hsdp* 2>/dev/null | head -1)${prebuilt:+ (prebuilt)}"
      # shellcheck disable=SC2086
      if run_logged "gpu_torch_e2e" 240 "$PYTHON" "$ROOT/tools/bench/gpu_torch_e2e.py" --build "$WORK" ${HSDP_E2E_ARGS:-}; then
        record "torch backend e2e (cuda)" "OK"
      else
        record "torch backend e2e (cuda)" "FAIL" "see $LOG"
      fi
      if HSDP_BUILD_DIR="$WORK" PYTHONPATH="$WORK/python" run_logged "test_cuda.py" 120 "$PYTHON" -m pytest -q -p no:cacheprovider "$ROOT/tests/python/test_cuda.py"; then
        record "test_cuda.py" "OK" "$(grep -E '[0-9]+ passed' "$LOG" | tail -1)"
      else
        record "test_cuda.py" "FAIL" "see $LOG"
      fi
    else
      record "build hsdp._hsdp" "FAIL" "see $LOG"
    fi
  fi
  ;;
bench)
  parses "$ROOT/tools/bench/gpu_torch_baseline.py"
  if ! need bin/hsdp-gpu-bench; then
    :
  elif [ "$DRY" -eq 1 ]; then
    echo "would run: $BUNDLE/bin/hsdp-gpu-bench --sizes-mb $SIZES; gpu_torch_baseline.py" >>"$LOG"
    record "hsdp-gpu-bench" "OK" "dry run: present"
  else
    if run_logged "hsdp-gpu-bench" 240 "$BUNDLE/bin/hsdp-gpu-bench" --sizes-mb "$SIZES"; then
      record "hsdp-gpu-bench" "OK" "figures in $LOG"
    else
      record "hsdp-gpu-bench" "FAIL" "see $LOG"
    fi
    if run_logged "torch NCCL baseline" 200 "$PYTHON" "$ROOT/tools/bench/gpu_torch_baseline.py" --sizes-mb "$SIZES"; then
      record "torch NCCL baseline" "OK" "figures in $LOG"
    else
      record "torch NCCL baseline" "FAIL" "see $LOG"
    fi
  fi
  ;;
esac

echo "stage $STAGE: $(( $(date +%s) - START ))s, $([ "$FAILED" -eq 0 ] && echo OK || echo FAILED)" | tee -a "$REPORT"
exit "$FAILED"
