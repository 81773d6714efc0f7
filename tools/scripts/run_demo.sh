#!/usr/bin/env bash
# The README's main command: builds hsdpd, starts it on the embedded default
# configuration, shows `hsdpctl status`, runs a short 2-process training job
# through the daemon (FSDP2 fully_shard of a small transformer where torch has
# FSDP2, else DDP; the demo prints which), and stops the daemon cleanly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
"$ROOT/tools/scripts/build.sh"
BUILD_DIR="${HSDP_BUILD_DIR:-$ROOT/build}"
BIN="$BUILD_DIR/bin"

RUN_DIR="$(mktemp -d /tmp/hsdpd-demo.XXXXXX)"
export HSDPD_SOCKET="$RUN_DIR/hsdpd.sock"
"$BIN/hsdpd" --socket "$HSDPD_SOCKET" 2> "$RUN_DIR/hsdpd.log" &
DAEMON_PID=$!
cleanup() {
  if kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID"
    wait "$DAEMON_PID" || true
  fi
}
trap cleanup EXIT

for _ in $(seq 1 100); do
  [ -S "$HSDPD_SOCKET" ] && "$BIN/hsdpctl" --socket "$HSDPD_SOCKET" health >/dev/null 2>&1 && break
  sleep 0.1
done
echo "== hsdpd started (pid $DAEMON_PID) on the embedded default config; hsdpctl status:"
"$BIN/hsdpctl" --socket "$HSDPD_SOCKET" status

if [ -f "$ROOT/tools/demo/train_demo.py" ]; then
  # The project's Python environment (torch 2.15.0; build.sh set it up already).
  PY="$(HSDP_BUILD_DIR="$BUILD_DIR" "$ROOT/tools/scripts/python_env.sh")"
  echo "== demo training job: 2 processes, FSDP2 fully_shard over the torch.distributed" \
       "backend \"hsdpd\" ($PY)"
  PYTHONPATH="$BUILD_DIR/python" "$PY" "$ROOT/tools/demo/train_demo.py" --mode auto
else
  echo "== C++ demo: 2 ranks all-reduce through hsdpd"
  "$BIN/hsdp-bench" --socket "$HSDPD_SOCKET" --nranks 2 --op all_reduce --min-bytes 1M --max-bytes 4M --check
fi

echo "== after the job:"
"$BIN/hsdpctl" --socket "$HSDPD_SOCKET" status
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID"
echo "== hsdpd stopped cleanly (exit $?); daemon log: $RUN_DIR/hsdpd.log"
trap - EXIT
