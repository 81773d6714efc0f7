#!/usr/bin/env python3
"""Runs one hsdp-bench command from two builds alternately and prints them
side by side: the check that a change left speed alone (or what it changed).

  tools/bench/ab_compare.py --before OLD/build/bin --after build/bin \\
      --rounds 5 -- --op all_reduce --nranks 2 --min-bytes 4K --max-bytes 64M

Each round runs `<dir>/hsdp-bench <args> --json` once per build, the order
alternating (before first in odd rounds, after first in even ones) so that a
machine that drifts during the run moves both alike. hsdp-bench starts the
hsdpd of its own directory, so each side runs its own daemon. Printed per
size: the median over the rounds (min-max) of p50 latency and of bus
bandwidth for each build, and after/before. --json FILE keeps every round.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def run(bin_dir, args, timeout):
    cmd = [os.path.join(bin_dir, "hsdp-bench"), *args, "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        sys.exit(f"ab_compare: {' '.join(cmd)} exited {out.returncode}:\n{out.stderr[-2000:]}")
    rows = json.loads(out.stdout)
    for r in rows:
        if r.get("wrong", 0):
            sys.exit(f"ab_compare: {bin_dir}: wrong results at {r['size']} bytes")
    return rows


def fmt(values, digits):
    med = statistics.median(values)
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def size_name(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}B"
    return f"{n} B"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="bin folder of the old build")
    ap.add_argument("--after", required=True, help="bin folder of the new build")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per hsdp-bench run")
    ap.add_argument("--json", help="write every round's rows here")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="-- then hsdp-bench's arguments")
    a = ap.parse_args()
    args = a.bench_args[1:] if a.bench_args[:1] == ["--"] else a.bench_args
    if a.rounds < 1:
        ap.error("--rounds must be at least 1")
    sides = {"before": a.before, "after": a.after}
    results = {"before": [], "after": []}
    for rnd in range(a.rounds):
        order = ["before", "after"] if rnd % 2 == 0 else ["after", "before"]
        for side in order:
            results[side].append(run(sides[side], args, a.timeout))
        print(f"round {rnd + 1}/{a.rounds} done ({' then '.join(order)})", file=sys.stderr)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": args, "sides": sides, "rounds": results}, f, indent=1)

    def series(side, key):
        out = {}
        for rows in results[side]:
            for r in rows:
                out.setdefault((r["op"], r["size"]), []).append(r[key])
        return out

    p50 = {s: series(s, "p50_us") for s in sides}
    bus = {s: series(s, "busbw_gbps") for s in sides}
    print(f"hsdp-bench {' '.join(args)}: {a.rounds} rounds, alternating; median (min-max)")
    print("| op | size | p50 us before | p50 us after | after/before | busbw GB/s before "
          "| busbw GB/s after | after/before |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for key in sorted(p50["before"]):
        pb, pa = p50["before"][key], p50["after"].get(key, [float("nan")])
        bb, ba = bus["before"][key], bus["after"].get(key, [float("nan")])
        rp = statistics.median(pa) / statistics.median(pb) if statistics.median(pb) else float("nan")
        rb = statistics.median(ba) / statistics.median(bb) if statistics.median(bb) else float("nan")
        print(f"| {key[0]} | {size_name(key[1])} | {fmt(pb, 1)} | {fmt(pa, 1)} | {rp:.2f} "
              f"| {fmt(bb, 2)} | {fmt(ba, 2)} | {rb:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
