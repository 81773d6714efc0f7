#!/usr/bin/env python3
"""torch.distributed through the "hsdpd" backend vs Gloo, in the same run.

    HSDPD_SOCKET=/tmp/x/hsdpd.sock PYTHONPATH=build/python \\
        /usr/bin/python3 tools/bench/torch_bench.py [--sizes-mb 1,4,16,64] [--world 2]

Two spawned ranks hold one "hsdpd" default group and one Gloo group. For each
collective and size it prints time per op, bus bandwidth (nccl-tests
convention: all_reduce x 2(n-1)/n, all_gather / reduce_scatter x (n-1)/n of
the full buffer) and hsdpd/Gloo ratio of bandwidths. hsdpd runs twice: on
ordinary tensors (staged through the registered pool: one copy in, one out)
and on tensors allocated in hsdpd memory (zero-copy). Gloo in torch 1.13 has
neither all_gather_into_tensor nor reduce_scatter: its baseline then uses the
list all_gather (plus a concatenation) and an all_reduce followed by taking
this rank's chunk — marked "emulated" in the table.
"""
import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _iters(nbytes, budget):
    return max(3, min(50, int(budget / max(nbytes, 1))))


def _time(fn, iters, group):
    for _ in range(2):
        fn()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dist.barrier(group=group)
    return (time.perf_counter() - t0) / iters


def _ops(world, rank, n, alloc, gloo):
    """name -> (callable, bus factor, bytes counted, emulated?) for one backend/alloc."""
    numel = n // 4
    x = alloc((numel,))
    x.fill_(1.0)
    chunk = numel // world
    out_ag = alloc((chunk * world,))
    in_ag = alloc((chunk,))
    in_rs = alloc((chunk * world,))
    out_rs = alloc((chunk,))
    ar = (lambda: dist.all_reduce(x, group=gloo)) if gloo else (lambda: dist.all_reduce(x))
    if gloo is None:
        ag = lambda: dist.all_gather_into_tensor(out_ag, in_ag)  # noqa: E731
        rs = lambda: dist.reduce_scatter_tensor(out_rs, in_rs)    # noqa: E731
        emu = False
    else:
        parts = [torch.empty(chunk) for _ in range(world)]

        def ag():
            dist.all_gather(parts, in_ag, group=gloo)
            torch.cat(parts, out=out_ag)

        def rs():
            dist.all_reduce(in_rs, group=gloo)
            out_rs.copy_(in_rs[rank * chunk:(rank + 1) * chunk])
        emu = True
    f = (world - 1) / world
    return {"all_reduce": (ar, 2 * f, n, False),
            "all_gather_into_tensor": (ag, f, chunk * world * 4, emu),
            "reduce_scatter_tensor": (rs, f, chunk * world * 4, emu)}


def worker(rank, world, store, sizes_mb, budget, queue):
    torch.set_num_threads(1)
    import hsdp.torch
    dist.init_process_group("hsdpd", init_method=f"file://{store}", rank=rank,
                            world_size=world)
    gloo = dist.new_group(list(range(world)), backend="gloo")
    rows = []
    for mb in sizes_mb:
        n = int(mb * (1 << 20))
        iters = _iters(n, budget)
        variants = [("gloo", _ops(world, rank, n, torch.empty, gloo)),
                    ("hsdpd-staged", _ops(world, rank, n, torch.empty, None)),
                    ("hsdpd-zero-copy", _ops(world, rank, n, hsdp.torch.empty, None))]
        for op in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"):
            res = {}
            for name, ops in variants:
                fn, factor, nbytes, emulated = ops[op]
                dt = _time(fn, iters, gloo)
                res[name] = (dt, nbytes / dt * factor / 1e9, emulated)
            rows.append((op, mb, iters, res))
    if rank == 0:
        queue.put((rows, hsdp.torch.client().staging.stats()))
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes-mb", default="1,4,16,64")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--budget-mb", type=float, default=512,
                    help="bytes moved per measurement, bounds the iteration count")
    args = ap.parse_args()
    if not os.environ.get("HSDPD_SOCKET"):
        print("note: HSDPD_SOCKET unset; using the default socket path", file=sys.stderr)
    sizes = [float(s) for s in args.sizes_mb.split(",")]
    store = os.path.join(tempfile.mkdtemp(prefix="torch-bench-"), "store")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, store, sizes,
                                              args.budget_mb * (1 << 20), queue))
             for r in range(args.world)]
    for p in procs:
        p.start()
    rows, stats = queue.get(timeout=1800)
    for p in procs:
        p.join()
    print(f"# torch {torch.__version__}, {args.world} ranks, {os.cpu_count()} cores; "
          "busbw in GB/s (nccl-tests convention); ratio = hsdpd busbw / gloo busbw")
    print(f"{'collective':<24}{'MB':>6}{'iters':>6}  {'gloo ms':>9}{'busbw':>7}  "
          f"{'staged ms':>9}{'busbw':>7}{'ratio':>7}  {'zc ms':>9}{'busbw':>7}{'ratio':>7}")
    for op, mb, iters, res in rows:
        g, s, z = res["gloo"], res["hsdpd-staged"], res["hsdpd-zero-copy"]
        mark = "*" if g[2] else " "
        print(f"{op:<24}{mb:>6g}{iters:>6}  {g[0] * 1e3:>9.2f}{g[1]:>6.2f}{mark}  "
              f"{s[0] * 1e3:>9.2f}{s[1]:>7.2f}{s[1] / g[1]:>7.2f}  "
              f"{z[0] * 1e3:>9.2f}{z[1]:>7.2f}{z[1] / g[1]:>7.2f}")
    print("* gloo baseline emulated (torch 1.13 Gloo lacks the tensor forms: list all_gather "
          "+ cat; all_reduce + own chunk for reduce_scatter)")
    print(f"# hsdpd staging pool on rank 0: {stats}")


if __name__ == "__main__":
    main()
