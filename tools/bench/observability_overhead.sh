#!/usr/bin/env bash
# The cost of observability on the data plane: hsdp-bench all-reduce, 2 ranks,
# 4 KB latency and 64 MB bandwidth, every operation through the daemon
# (data_plane.small_op_bytes: 0), with observability OFF (no metrics
# endpoint, trace ring not recording) and ON in each metrics mode
# (docs/observability.md): TOTALS (metrics.listen set, no password: node
# totals only) and JOBS (metrics.listen and metrics.password_file set: the
# per-job and per-rank series too, scraped with the password); ON means the
# endpoint scraped every second and `hsdpctl trace` recording the whole run.
# Interleaved rounds against the same binaries. Prints every run and the
# medians, each ON mode against OFF (docs/benchmarks.md, section
# "Observability overhead").
#
#   tools/bench/observability_overhead.sh [ROUNDS] [MODES]
#     ROUNDS default 5; MODES the ON modes, default "totals jobs"; needs build/
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="${HSDP_BUILD_DIR:-$ROOT/build}/bin"
ROUNDS="${1:-5}"
MODES="${2:-totals jobs}"
for m in $MODES; do
  case "$m" in totals|jobs) ;; *) echo "unknown mode: $m (totals, jobs)" >&2; exit 2 ;; esac
done
TMP="$(mktemp -d /tmp/hsdp-obs-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$TMP"
}
trap cleanup EXIT

PASSWORD="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
(umask 077 && printf '%s\n' "$PASSWORD" > "$TMP/metrics.password")
# Every operation through the daemon, where the observer sees it: a 4 KB
# all-reduce of an all-local group would otherwise run in the group's arena
# among the members (data_plane.small_op_bytes), which no mode observes.
THROUGH_DAEMON='data_plane:\n  small_op_bytes: 0\n'
printf "$THROUGH_DAEMON" > "$TMP/off.yaml"
printf "${THROUGH_DAEMON}metrics:\n  listen: \"127.0.0.1:0\"\n" > "$TMP/totals.yaml"
printf "${THROUGH_DAEMON}metrics:\n  listen: \"127.0.0.1:0\"\n  password_file: \"%s\"\n" \
  "$TMP/metrics.password" > "$TMP/jobs.yaml"

# run MODE SIZE ITERS WARMUP -> "MODE SIZE time_us p50_us busbw_gbps"
run() {
  local mode=$1 size=$2 iters=$3 warmup=$4
  local sock="$TMP/$mode.sock"
  rm -f "$sock"
  "$BIN/hsdpd" --socket "$sock" --node-config "$TMP/$mode.yaml" --log-level warning \
    2>"$TMP/$mode.log" &
  local daemon=$!
  PIDS+=("$daemon")
  for _ in $(seq 200); do "$BIN/hsdpctl" --socket "$sock" health >/dev/null 2>&1 && break; sleep 0.05; done
  local helpers=()
  if [ "$mode" != off ]; then
    local addr auth=()
    addr=$("$BIN/hsdpctl" --socket "$sock" --json status |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["metrics_address"])')
    [ "$mode" = jobs ] && auth=(-u "hsdpd:$PASSWORD")
    # The scrape must succeed (a 401 would measure nothing).
    curl -fsS "${auth[@]}" "http://$addr/metrics" >/dev/null
    "$BIN/hsdpctl" --socket "$sock" trace --seconds 600 -o /dev/null 2>/dev/null &
    helpers+=($!)
    (while true; do curl -s "${auth[@]}" "http://$addr/metrics" >/dev/null; sleep 1; done) &
    helpers+=($!)
    sleep 0.2  # recording armed
  fi
  "$BIN/hsdp-bench" --socket "$sock" --nranks 2 --min-bytes "$size" --max-bytes "$size" \
    --iters "$iters" --warmup "$warmup" --json |
    python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print(sys.argv[1], sys.argv[2],
      "%.2f %.2f %.3f" % (r["time_us"], r["p50_us"], r["busbw_gbps"]))' "$mode" "$size"
  for h in "${helpers[@]:-}"; do [ -n "$h" ] && kill "$h" 2>/dev/null || true; done
  kill "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
}

{
  for round in $(seq "$ROUNDS"); do
    # Alternate which mode goes first, so drifts in the machine's load even out.
    order="off $MODES"
    [ $((round % 2)) -eq 0 ] && order="$(echo "$MODES" | tr ' ' '\n' | tac | tr '\n' ' ') off"
    for mode in $order; do run "$mode" 4K 3000 300; done
    for mode in $order; do run "$mode" 64M 20 3; done
  done
} | tee "$TMP/runs.txt"

python3 - "$TMP/runs.txt" $MODES <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
modes = sys.argv[2:]
def med(mode, size, col):
    return statistics.median(float(r[col]) for r in rows if r[0] == mode and r[1] == size)
print("\nmedians over %d rounds (totals: no password, node totals only; "
      "jobs: password set, per-job series)" % (len(rows) // (2 * (1 + len(modes)))))
for mode in modes:
    for size in ("4K", "64M"):
        for col, name in ((2, "mean us"), (3, "p50 us"), (4, "busbw GB/s")):
            off, on = med("off", size, col), med(mode, size, col)
            print(f"{mode:>6} {size:>4} {name:>10}: off {off:9.3f}  {mode} {on:9.3f}  "
                  f"diff {on - off:+8.3f} ({(on - off) / off * 100:+.2f}%)")
PY
