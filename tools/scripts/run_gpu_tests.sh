#!/usr/bin/env bash
# The GPU suite, one command (docs/gpu.md). On a machine with a GPU:
#   1. builds with HSDP_WITH_CUDA=ON into build-gpu/ (or $HSDP_BUILD_DIR),
#   2. runs the device tests (ctest -L gpu: real CUDA IPC with both handle
#      kinds across two processes, events, streams, the scale/cast kernel,
#      the NCCL engine on real communicators) and the fake-backed engine tests,
#      then the end-to-end daemon tests (a real hsdpd, trainer processes, both
#      handle kinds: cuda_daemon_integration_test on the GPU, device_daemon /
#      device_hostile on engine.device: fake) and
#      the torch backend with CUDA tensors and FSDP2 fully_shard against a real
#      hsdpd with engine.kind nccl (tools/bench/gpu_torch_e2e.py, torch >= 2.4),
#   3. the GPU benchmark: hsdp-gpu-bench (the NCCL engine vs raw NCCL in the
#      same process) and in-process NCCL through torch.distributed, same sizes,
#   4. the compute/communication overlap experiment (tools/bench/gpu_overlap.py),
#   5. prints a summary; exits non-zero when any step failed.
# Without a GPU (or with --dry-run) it checks what it can, says "no GPU" and
# exits 0 without building. Needs torch >= 2.4 for steps 3-4 (skipped, and
# reported, when torch or its CUDA is missing); never uses the network.
#
#   tools/scripts/run_gpu_tests.sh [--dry-run] [--sizes-mb 1,16,64,256] [--try-mps]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build-gpu}"
PYTHON="${PYTHON:-python3}"
DRY=0
SIZES="1,16,64,256"
MPS_FLAG=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --sizes-mb) SIZES="$2"; shift ;;
    --try-mps) MPS_FLAG="--try-mps" ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run_gpu_tests.sh: unknown argument $1" >&2; exit 64 ;;
  esac
  shift
done

declare -a SUMMARY=()
FAILED=0
record() {  # record NAME STATUS [DETAIL]
  SUMMARY+=("$(printf '%-28s %-8s %s' "$1" "$2" "${3:-}")")
  if [ "$2" = "FAIL" ]; then FAILED=1; fi
}
print_summary() {
  echo
  echo "=== GPU suite summary ($(date -u +%FT%TZ)) ==="
  for line in "${SUMMARY[@]}"; do echo "$line"; done
  if [ "$FAILED" -ne 0 ]; then echo "result: FAILED"; else echo "result: OK"; fi
}

gpu_present() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '
}

if [ "$DRY" -eq 1 ] || ! gpu_present; then
  why="--dry-run"
  gpu_present || why="no GPU (nvidia-smi finds none)"
  record "gpu" "SKIP" "$why"
  for f in "$ROOT/tools/bench/gpu_torch_baseline.py" "$ROOT/tools/bench/gpu_overlap.py" \
           "$ROOT/tools/bench/gpu_torch_e2e.py"; do
    if "$PYTHON" -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())' "$f" 2>/dev/null; then record "syntax $(basename "$f")" "OK"; \
    else record "syntax $(basename "$f")" "FAIL"; fi
  done
  if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    record "cuda toolkit" "OK" "$( (command -v nvcc || echo /usr/local/cuda/bin/nvcc) | head -1)"
  else
    record "cuda toolkit" "SKIP" "nvcc not found"
  fi
  print_summary
  exit "$FAILED"
fi

nvidia-smi -L
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader || true

# 1. build
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
if cmake -S "$ROOT" -B "$BUILD_DIR" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
     -DHSDP_WITH_CUDA=ON "${launcher[@]}" >"$BUILD_DIR.configure.log" 2>&1 \
   && cmake --build "$BUILD_DIR" -j "$(nproc)" --target cuda_device_test cuda_ipc_peer \
        nccl_engine_test nccl_fakes_test fake_device_api_test device_buffers_test \
        device_engine_factory_test hsdp-gpu-bench hsdpd hsdpctl \
        device_daemon_integration_test device_hostile_integration_test \
        cuda_daemon_integration_test >"$BUILD_DIR.build.log" 2>&1; then
  record "build (HSDP_WITH_CUDA=ON)" "OK" "$BUILD_DIR"
else
  record "build (HSDP_WITH_CUDA=ON)" "FAIL" "see $BUILD_DIR.configure.log / $BUILD_DIR.build.log"
  tail -30 "$BUILD_DIR.build.log" 2>/dev/null || tail -30 "$BUILD_DIR.configure.log"
  print_summary
  exit 1
fi

# 2. device tests (real GPU) and the fake-backed engine tests
for t in cuda_device_test nccl_engine_test nccl_fakes_test fake_device_api_test \
         device_buffers_test device_engine_factory_test device_daemon_integration_test \
         device_hostile_integration_test cuda_daemon_integration_test; do
  log="$BUILD_DIR/$t.log"
  if timeout 600 "$BUILD_DIR/tests/$t" >"$log" 2>&1; then
    skipped=$(grep -c '^\[  SKIPPED \] [A-Za-z]' "$log" || true)
    passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log")
    if [[ "$t" == cuda_* ]] && [ "${skipped:-0}" -gt 0 ]; then
      record "$t" "FAIL" "$skipped test(s) skipped on a GPU machine (see $log)"
    else
      record "$t" "OK" "${passed:-?} passed"
    fi
  else
    record "$t" "FAIL" "see $log"
    grep -E 'Failure|FAILED|Expected|Which' "$log" | head -20
  fi
done

# 2b. the daemon on the real device through the torch backend: CUDA tensors
# (legacy IPC handles, producer events, Work.wait()) and FSDP2 fully_shard.
# The Python module of this build is needed: build it if it is configured.
cmake --build "$BUILD_DIR" -j "$(nproc)" --target hsdp_python >>"$BUILD_DIR.build.log" 2>&1 || true
e2e_log="$BUILD_DIR/gpu_torch_e2e.txt"
timeout 900 "$PYTHON" "$ROOT/tools/bench/gpu_torch_e2e.py" --build "$BUILD_DIR" >"$e2e_log" 2>&1
case $? in
  0) record "torch backend e2e (cuda)" "OK" "$e2e_log" ;;
  2) record "torch backend e2e (cuda)" "FAIL" "torch with CUDA not importable ($e2e_log)" ;;
  *) record "torch backend e2e (cuda)" "FAIL" "see $e2e_log"; tail -20 "$e2e_log" ;;
esac

# 3. benchmark: the NCCL engine vs raw NCCL (same process), then torch.distributed NCCL
bench_log="$BUILD_DIR/gpu_bench.txt"
if timeout 900 "$BUILD_DIR/bin/hsdp-gpu-bench" --sizes-mb "$SIZES" | tee "$bench_log"; then
  record "hsdp-gpu-bench" "OK" "$bench_log"
else
  record "hsdp-gpu-bench" "FAIL" "$bench_log"
fi
torch_ok=0
if "$PYTHON" - <<'PY' 2>/dev/null; then torch_ok=1; fi
import sys, torch
major, minor = (int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
sys.exit(0 if (major, minor) >= (2, 4) and torch.cuda.is_available() else 1)
PY
if [ "$torch_ok" -eq 1 ]; then
  if timeout 900 "$PYTHON" "$ROOT/tools/bench/gpu_torch_baseline.py" --sizes-mb "$SIZES" \
       | tee "$BUILD_DIR/torch_baseline.txt"; then
    record "torch NCCL baseline" "OK" "$BUILD_DIR/torch_baseline.txt"
  else
    record "torch NCCL baseline" "FAIL" "$BUILD_DIR/torch_baseline.txt"
  fi
  # 4. overlap experiment (torch side process, then hsdpd's engine as the side process)
  for side in torch hsdp; do
    if timeout 900 "$PYTHON" "$ROOT/tools/bench/gpu_overlap.py" --side "$side" $MPS_FLAG \
         | tee "$BUILD_DIR/overlap_$side.txt"; then
      record "overlap ($side side)" "OK" "$BUILD_DIR/overlap_$side.txt"
    else
      record "overlap ($side side)" "FAIL" "$BUILD_DIR/overlap_$side.txt"
    fi
  done
else
  record "torch steps" "SKIP" "torch >= 2.4 with CUDA not importable by $PYTHON"
fi

print_summary
exit "$FAILED"
