#!/usr/bin/env python3
"""Where one small collective's time goes, from the daemon's own trace.

    python3 tools/bench/latency_breakdown.py [--bin build/bin] [--bytes 4K] [--iters 20000]

Starts its own hsdpd, then in one run:
  1. hsdp-bench (2 ranks, all_reduce of --bytes, float32) alone: p50 and mean;
  2. the same while `hsdpctl trace` records, and the trace's per-member
     phases (docs/observability.md): "wait for peers" (this member's arrival
     at its group to the last member's), "queued" (match to the engine's
     launch), "executing" (launch to this member's completion written);
  3. hsdp-bench alone again.
From the trace, per all-reduce: the first arriver's wait for its peer, and
the last arriver's span inside the daemon (its arrival to its completion:
matching, launch, the inline reduction, writing the completion). What the
daemon's trace cannot see -- the client writing the descriptor and ringing,
the dispatcher picking it up and validating it, the client seeing its
completion -- is the end-to-end p50 minus that span. Recording the trace adds
its own cost (one event per member per phase); the figures say how much by
comparing runs 1-3.

The traced run also has hsdp-bench write each rank's submit and return times
(--stamps, CLOCK_MONOTONIC like the trace, whose origin the trace records):
joined with the trace per rank, they split the last arriver's end-to-end
time into (a) its submit to its arrival at the group (the client library,
the ring, the dispatcher's pick-up and validation), (b) the daemon's span,
(c) the completion written to the client's return.
"""
import argparse
import bisect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from bench_daemon import running_hsdpd


def size(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.upper())
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def bench(bin_dir, sock, nbytes, iters, stamps=None):
    extra = ["--stamps", stamps] if stamps else []
    out = subprocess.run(
        [os.path.join(bin_dir, "hsdp-bench"), "--socket", sock, "--op", "all_reduce",
         "--nranks", "2", "--min-bytes", str(nbytes), "--max-bytes", str(nbytes),
         "--iters", str(iters), "--warmup", "200", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stdout)
    # nccl-tests format: size count type redop time(us) algbw busbw p50(us) ...
    for line in out.stdout.splitlines():
        w = line.split()
        if w and w[0] == str(nbytes):
            nums = [float(x) for x in w if re.fullmatch(r"[0-9.]+", x)]
            return {"mean_us": nums[2], "p50_us": nums[5], "line": line.strip()}
    raise RuntimeError(f"no result line in:\n{out.stdout}")


def phases(trace_path):
    with open(trace_path) as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    by_track = {}
    ops = []
    for e in events:
        if e.get("ph") != "X":
            continue
        key = (e["pid"], e["tid"])
        if e.get("cat") == "op" and e["name"].startswith("all_reduce"):
            ops.append(e)
        elif e.get("cat") == "phase":
            by_track.setdefault(key, []).append(e)
    for v in by_track.values():
        v.sort(key=lambda e: e["ts"])
    per_op = {}
    for o in ops:
        track = by_track.get((o["pid"], o["tid"]), [])
        i = bisect.bisect_left([p["ts"] for p in track], o["ts"])
        got = {}
        while i < len(track) and track[i]["ts"] <= o["ts"] + o["dur"]:
            got[track[i]["name"]] = track[i]["dur"]
            i += 1
        per_op.setdefault((o["args"]["group"], o["args"]["epoch"], o["args"]["seq"]), []).append(
            (o["dur"], got))
    first_wait, last_span, queued, executing = [], [], [], []
    for members in per_op.values():
        if len(members) != 2:
            continue
        members.sort(key=lambda m: -m[1].get("wait for peers", 0.0))
        (_, first), (span, last) = members
        first_wait.append(first.get("wait for peers", 0.0))
        last_span.append(span)
        queued.append(last.get("queued", 0.0))
        executing.append(last.get("executing", 0.0))
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    return {"ops": len(last_span), "first_wait_us": med(first_wait),
            "last_span_us": med(last_span), "queued_us": med(queued),
            "executing_us": med(executing)}


def client_split(trace_path, stamps_dir):
    """Joins the trace's per-member op slices with the ranks' own stamps."""
    with open(trace_path) as f:
        doc = json.load(f)
    origin = doc["otherData"]["from_monotonic_ns"]
    events = doc["traceEvents"]
    stamps = {}
    for name in os.listdir(stamps_dir):
        m = re.fullmatch(r"rank(\d+)\.txt", name)
        if not m:
            continue
        with open(os.path.join(stamps_dir, name)) as f:
            rows = sorted((int(a), int(b)) for _, a, b in (line.split() for line in f))
        stamps[int(m.group(1))] = rows
    members = {}  # (group, epoch, seq) -> [(rank, start_ns, end_ns)]
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "op" or not e["name"].startswith("all_reduce"):
            continue
        start = origin + e["ts"] * 1000.0
        a = e["args"]
        members.setdefault((a["group"], a["epoch"], a["seq"]), []).append(
            (a["rank"], start, start + e["dur"] * 1000.0))
    to_arrival, inside, to_return, total = [], [], [], []
    for ms in members.values():
        if len(ms) != 2:
            continue
        rank, start, end = max(ms, key=lambda m: m[1])  # the last arriver
        rows = stamps.get(rank, [])
        i = bisect.bisect_right([r[0] for r in rows], start) - 1
        if i < 0 or not rows[i][0] <= start <= end <= rows[i][1]:
            continue  # not a timed iteration (warm-up, barrier) or not inside it
        t0, t1 = rows[i]
        to_arrival.append((start - t0) / 1e3)
        inside.append((end - start) / 1e3)
        to_return.append((t1 - end) / 1e3)
        total.append((t1 - t0) / 1e3)
    med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
    return {"ops": len(total), "to_arrival_us": med(to_arrival), "inside_us": med(inside),
            "to_return_us": med(to_return), "total_us": med(total)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin"))
    ap.add_argument("--bytes", default="4K")
    ap.add_argument("--iters", type=int, default=20000)
    args = ap.parse_args()
    nbytes = size(args.bytes)
    tmp = tempfile.mkdtemp(prefix="hsdp-lat-")
    sock = os.path.join(tmp, "hsdpd.sock")
    with running_hsdpd(args.bin, sock):
        before = bench(args.bin, sock, nbytes, args.iters)
        trace = os.path.join(tmp, "trace.json")
        rec = subprocess.Popen([os.path.join(args.bin, "hsdpctl"), "--socket", sock, "trace",
                                "--seconds", "4", "-o", trace], stdout=subprocess.DEVNULL)
        time.sleep(0.5)
        stamps = os.path.join(tmp, "stamps")
        os.makedirs(stamps)
        traced = bench(args.bin, sock, max(nbytes, 1), args.iters // 4, stamps)
        rec.wait(timeout=60)
        after = bench(args.bin, sock, nbytes, args.iters)
        ph = phases(trace)
        split = client_split(trace, stamps)
    print(f"all_reduce {nbytes} B, 2 ranks, float32 (hsdp-bench p50 / mean, us)")
    print(f"  alone, before      {before['p50_us']:8.2f} / {before['mean_us']:.2f}")
    print(f"  while tracing      {traced['p50_us']:8.2f} / {traced['mean_us']:.2f}")
    print(f"  alone, after       {after['p50_us']:8.2f} / {after['mean_us']:.2f}")
    print(f"from the trace ({ph['ops']} all-reduces; medians, us):")
    print(f"  first arriver waits for its peer          {ph['first_wait_us']:8.2f}")
    print(f"  last arriver, arrival -> completion      {ph['last_span_us']:8.2f}")
    print(f"    of which match -> launch ('queued')     {ph['queued_us']:8.2f}")
    print(f"    launch -> completion ('executing')      {ph['executing_us']:8.2f}")
    rest = traced["p50_us"] - ph["last_span_us"]
    print(f"  outside the trace (client submit, pick-up, validation, client wake): "
          f"{rest:.2f} = p50 while tracing - last arriver's span")
    print(f"the last arriver, joined with its own stamps ({split['ops']} ops; medians, us):")
    print(f"  submit -> arrival at the group (client, ring, pick-up, validation) "
          f"{split['to_arrival_us']:8.2f}")
    print(f"  arrival -> completion written (the daemon)                        "
          f"{split['inside_us']:8.2f}")
    print(f"  completion written -> the client returns                          "
          f"{split['to_return_us']:8.2f}")
    print(f"  end to end (the same ops)                                         "
          f"{split['total_us']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
