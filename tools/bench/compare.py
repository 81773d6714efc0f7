#!/usr/bin/python3
"""One-run comparison: hsdpd vs torch.distributed Gloo vs a memcpy ceiling.

Runs, in this order and in one invocation, on the same machine:
  1. hsdp-bench (its own daemon, N client processes) for each collective;
  2. the same collective through torch.distributed's Gloo backend
     (N processes, torch from Debian);
  3. a single-threaded memcpy of the same size (numpy.copyto), the
     memory-bandwidth ceiling.
and prints one table with bus bandwidths and the ratios.

With --nodes K > 1 (multi-node mode, compare_cluster.py): hsdp-bench across K
daemons forming a cluster on loopback, --nranks ranks per node, against torch
Gloo with the same world size (K x nranks processes on loopback), for
all_reduce, all_gather, reduce_scatter and the HSDP composite, in --rounds
alternating rounds (hsdpd then Gloo, then Gloo then hsdpd, ...): medians,
ranges and the load average of the same run.

usage: /usr/bin/python3 tools/bench/compare.py [--build-dir build] [--nranks 2]
         [--ops all_reduce,all_gather] [--min-mb 1] [--max-mb 64] [--iters 10] [--json FILE]
         [--nodes K] [--rounds R] [--warmup W]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_world import mean_seconds, run_world, sizes_mb  # noqa: E402


def bus_factor(op, n):
    return {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n,
            "reduce_scatter": (n - 1) / n}.get(op, 1.0)


def run_hsdp(build_dir, op, nranks, sizes, iters):
    cmd = [os.path.join(build_dir, "bin", "hsdp-bench"), "--op", op, "--nranks", str(nranks),
           "--min-bytes", str(sizes[0]), "--max-bytes", str(sizes[-1]), "--step-factor", "2",
           "--iters", str(iters), "--warmup", "3", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = json.loads(out)
    return {r["size"]: r for r in rows}


def _gloo_worker(rank, init_file, queue, nranks, op, sizes, iters):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank,
                            world_size=nranks)
    result = {}
    for size in sizes:
        elems = size // 4
        if op == "all_reduce":
            t = torch.ones(elems, dtype=torch.float32)
            fn = lambda: dist.all_reduce(t)
        elif op == "all_gather":
            per = elems // nranks
            src = torch.ones(per, dtype=torch.float32)
            outs = [torch.empty(per, dtype=torch.float32) for _ in range(nranks)]
            fn = lambda: dist.all_gather(outs, src)
        else:  # reduce_scatter is not implemented by Gloo in torch 1.13
            raise SystemExit("gloo baseline supports all_reduce and all_gather")
        result[size] = mean_seconds(fn, iters, warmup=3)
    if rank == 0:
        queue.put(result)
    dist.destroy_process_group()


def run_gloo(op, nranks, sizes, iters):
    return run_world(_gloo_worker, nranks, (nranks, op, sizes, iters))


def run_memcpy(sizes, iters):
    result = {}
    for size in sizes:
        a = np.ones(size, dtype=np.uint8)
        b = np.empty_like(a)
        np.copyto(b, a)
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            np.copyto(b, a)
            times.append(time.perf_counter() - t0)
        result[size] = sum(times) / len(times)
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(os.path.dirname(__file__), "..", "..", "build"))
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--ops", default="all_reduce,all_gather")
    ap.add_argument("--min-mb", type=int, default=1)
    ap.add_argument("--max-mb", type=int, default=64)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--nodes", type=int, default=1,
                    help="> 1: daemons forming a cluster on loopback (compare_cluster.py)")
    ap.add_argument("--rounds", type=int, default=3, help="multi-node mode: alternating rounds")
    ap.add_argument("--warmup", type=int, default=3, help="multi-node mode: warm-up iterations")
    args = ap.parse_args()
    if args.nodes > 1:
        import compare_cluster
        ops = None if args.ops == ap.get_default("ops") else args.ops.split(",")
        return compare_cluster.main(args, ops)
    sizes = sizes_mb(args.min_mb, args.max_mb)
    rows = []
    print(f"# {args.nranks} ranks, float32, sum; machine: {os.cpu_count()} cores; "
          f"busbw in GB/s (nccl-tests factors); memcpy = single-thread copy of `size` bytes")
    print(f"{'op':<14} {'size':>10} {'hsdpd':>8} {'gloo':>8} {'memcpy':>8} {'hsdpd/gloo':>11} "
          f"{'hsdpd/memcpy':>13} {'hsdpd_us':>10} {'gloo_us':>10}")
    for op in args.ops.split(","):
        hs = run_hsdp(args.build_dir, op, args.nranks, sizes, args.iters)
        gl = run_gloo(op, args.nranks, sizes, args.iters)
        mc = run_memcpy(sizes, args.iters)
        f = bus_factor(op, args.nranks)
        for size in sizes:
            h_bw = hs[size]["busbw_gbps"]
            g_bw = size / gl[size] / 1e9 * f
            m_bw = size / mc[size] / 1e9
            row = {"op": op, "size": size, "hsdpd_busbw": h_bw, "gloo_busbw": g_bw, "memcpy_gbps": m_bw,
                   "hsdpd_us": hs[size]["time_us"], "gloo_us": gl[size] * 1e6}
            rows.append(row)
            print(f"{op:<14} {size >> 20:>8}MB {h_bw:>8.2f} {g_bw:>8.2f} {m_bw:>8.2f} {h_bw / g_bw:>10.1f}x "
                  f"{h_bw / m_bw:>12.0%} {row['hsdpd_us']:>10.0f} {row['gloo_us']:>10.0f}")
            sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
