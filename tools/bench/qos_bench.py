#!/usr/bin/env python3
"""Two jobs on one hsdpd: a bulk job and a latency-sensitive one, same run.

    PYTHONPATH=build/python build/venv/bin/python tools/bench/qos_bench.py \\
        [--bin build/bin] [--seconds 4] [--rounds 2] [--b-sizes 4096,1048576] [--bulk-nice 0]
        [--idle-lower-classes false,true]

For each engine.bulk_nice and engine.idle_lower_classes value, starts its own hsdpd (engine threads: all
cores; a private socket) with one
class of service, `interactive` (level 1) for jobs named "qos-hi-*"; every
other job is in "default" (level 4). Job A (2 ranks) all-reduces 64 MiB
(float32) in a loop; job B (2 ranks) all-reduces B_SIZE bytes back to back
and records each op's latency. Scenarios, alternating in rounds:

  B alone                B's latency p50 / p99
  A alone                A's throughput (GB/s of buffer, per rank)
  A + B idle             A's throughput with B attached and idle
  A + B, equal classes   B's latency next to A, A's throughput
  A + B, B interactive   the same with B in the higher class

Prints one table per B size: medians over the rounds, and each round's values.
Targets: B's p99 with priority within 3x its p99 alone; A's
throughput with B idle within 10% of A alone. Ops up to engine.inline_max_bytes
(64 KiB) run on the dispatcher thread and never queue; the 1 MiB case shows
the engine's queue.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from bench_daemon import running_hsdpd

A_BYTES = 64 << 20


def worker(args):
    import numpy as np
    import hsdp
    c = hsdp.Client(job_id=args.job, rank=args.rank, world_size=2,
                    priority_class=args.cls or None)
    x = c.array((args.nbytes // 4,), np.float32)
    x.fill(1.0)
    c.barrier()
    with open(args.out + ".ready", "w"):
        pass
    lat, done = [], []
    flag = c.array((1,), np.float32)
    end = time.monotonic() + args.seconds
    rank0 = args.rank == 0

    def keep_going():
        # Rank 0 decides for both (the ranks must run the same ops): an
        # all-reduce (max) of its verdict, not timed.
        stop = rank0 and (os.path.exists(args.stop) or time.monotonic() >= end)
        flag[0] = 1.0 if stop else 0.0
        c.all_reduce(flag, op="max")
        return flag[0] == 0.0

    if args.mode == "idle":
        while keep_going():
            time.sleep(0.05)
    else:
        while keep_going():
            for _ in range(args.batch):
                t0 = time.perf_counter_ns()
                c.all_reduce(x)
                lat.append(time.perf_counter_ns() - t0)
                done.append(time.monotonic())
    c.barrier()
    with open(args.out, "w") as f:
        json.dump({"lat_ns": lat, "done": done}, f)
    c.close()
    return 0


def start_job(py, tmp, job, nbytes, mode, seconds, cls, stop):
    procs, outs = [], []
    for r in range(2):
        out = os.path.join(tmp, f"{job}.{r}.json")
        outs.append(out)
        procs.append(subprocess.Popen(
            [py, os.path.abspath(__file__), "--worker", "--job", job, "--rank", str(r),
             "--nbytes", str(nbytes), "--mode", mode, "--seconds", str(seconds),
             "--batch", str(1 if nbytes >= (1 << 20) else 64), "--cls",
             cls, "--out", out, "--stop", stop]))
    return procs, outs


def wait_ready(outs, timeout=60):
    end = time.monotonic() + timeout
    while not all(os.path.exists(o + ".ready") for o in outs):
        if time.monotonic() > end:
            raise RuntimeError(f"ranks not ready: {outs}")
        time.sleep(0.01)


def finish(procs, outs):
    for p in procs:
        if p.wait(timeout=120) != 0:
            raise RuntimeError(f"a rank failed: exit {p.returncode}")
    with open(outs[0]) as f:
        return json.load(f)


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def throughput(done, t0=None, t1=None):
    """GB/s of A's buffer over the completions inside [t0, t1]."""
    ts = [t for t in done if (t0 is None or t >= t0) and (t1 is None or t <= t1)]
    if len(ts) < 2:
        return float("nan")
    return (len(ts) - 1) * A_BYTES / (ts[-1] - ts[0]) / 1e9


def scenario(py, tmp, name, b_bytes, seconds, n):
    """One scenario; returns {"b_p50_us", "b_p99_us", "a_gbs"} (what applies)."""
    stop = os.path.join(tmp, f"stop.{n}")
    out = {}
    a = b = None
    if "A" in name:
        a = start_job(py, tmp, f"qos-a-{n}", A_BYTES, "loop", 3600, "", stop)
        wait_ready(a[1])
        time.sleep(0.5)  # A in its stride
    if name in ("B alone", "A + B equal", "A + B prio"):
        job = f"qos-hi-{n}" if name == "A + B prio" else f"qos-b-{n}"
        b = start_job(py, tmp, job, b_bytes, "loop", seconds, "", stop)
    elif name == "A + B idle":
        b = start_job(py, tmp, f"qos-b-{n}", b_bytes, "idle", seconds, "", stop)
    if b is not None:
        wait_ready(b[1])
    t0 = time.monotonic()
    if name in ("A alone", "A + B idle"):
        time.sleep(seconds)
        open(stop, "w").close()
    elif b is not None:
        res = finish(*b)
        b = None
        lat = [v / 1e3 for v in res["lat_ns"][10:]]  # warm-up dropped
        out["b_p50_us"], out["b_p99_us"], out["b_ops"] = pct(lat, 0.5), pct(lat, 0.99), len(lat)
        open(stop, "w").close()
    t1 = time.monotonic()
    if b is not None:
        finish(*b)
    if a is not None:
        out["a_gbs"] = throughput(finish(*a)["done"], t0, t1)
    return out


def report(results, names, size, nice, args):
    print(f"\nengine.bulk_nice {nice}: B = {size} B all-reduce (2 ranks), A = 64 MiB all-reduce "
          f"(2 ranks); {args.rounds} rounds of {args.seconds:g} s, medians (each round)")
    print(f"{'scenario':<14} {'B p50 us':>10} {'B p99 us':>10} {'B ops':>7} {'A GB/s':>8}   rounds")
    for name in names:
        rs = results[name]

        def med(key):
            vals = sorted(r[key] for r in rs if key in r)
            return vals[len(vals) // 2] if vals else float("nan")
        each = "; ".join(", ".join(f"{k}={v:.1f}" for k, v in r.items()) for r in rs)
        print(f"{name:<14} {med('b_p50_us'):>10.1f} {med('b_p99_us'):>10.1f} "
              f"{med('b_ops'):>7.0f} {med('a_gbs'):>8.2f}   {each}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--job")
    ap.add_argument("--rank", type=int)
    ap.add_argument("--nbytes", type=int)
    ap.add_argument("--mode")
    ap.add_argument("--cls", default="")
    ap.add_argument("--out")
    ap.add_argument("--stop")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--b-sizes", default="4096,1048576")
    ap.add_argument("--bulk-nice", default="0", help="engine.bulk_nice values, one daemon each")
    ap.add_argument("--idle-lower-classes", default="false,true",
                    help="engine.idle_lower_classes values, one daemon each (with each bulk_nice)")
    ap.add_argument("--bin", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin"))
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    tmp = tempfile.mkdtemp(prefix="hsdp-qos-")
    names = ["B alone", "A alone", "A + B idle", "A + B equal", "A + B prio"]
    n = 0
    daemons = [(int(nice), idle) for nice in args.bulk_nice.split(",")
               for idle in args.idle_lower_classes.split(",")]
    for nice, idle in daemons:
        cfg = os.path.join(tmp, f"node{nice}-{idle}.yaml")
        with open(cfg, "w") as f:
            f.write(f"engine:\n  bulk_nice: {nice}\n  idle_lower_classes: {idle}\n"
                    "jobs:\n  priority_classes:\n"
                    "    - {name: interactive, level: 1, jobs: [\"qos-hi-*\"]}\n")
        sock = os.path.join(tmp, f"hsdpd{nice}-{idle}.sock")
        os.environ["HSDPD_SOCKET"] = sock
        with running_hsdpd(args.bin, sock, cfg):
            for size in [int(v) for v in args.b_sizes.split(",")]:
                results = {k: [] for k in names}
                for rnd in range(args.rounds):
                    order = names if rnd % 2 == 0 else list(reversed(names))
                    for name in order:
                        n += 1
                        results[name].append(
                            scenario(sys.executable, tmp, name, size, args.seconds, n))
                report(results, names, size, f"{nice}, engine.idle_lower_classes {idle}", args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
