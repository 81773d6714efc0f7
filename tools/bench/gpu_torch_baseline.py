#!/usr/bin/env python3
"""In-process NCCL through torch.distributed: the baseline hsdp-gpu-bench is
compared with in the same run (tools/scripts/run_gpu_tests.sh).

    python3 tools/bench/gpu_torch_baseline.py [--sizes-mb 1,16,64,256] [--iters 20]

One process per visible GPU (world = GPU count; 1 on a single-GPU machine),
rendezvous through a file (no network). Prints, per op and size, time per op
and bus bandwidth in the nccl-tests convention, in the same columns as
hsdp-gpu-bench. Exit code 2 without torch CUDA/NCCL.
"""
import argparse
import os
import sys
import tempfile
import time


def _worker(rank, world, init_file, sizes, iters, q):
    import torch
    import torch.distributed as dist
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="file://" + init_file, rank=rank, world_size=world)
    rows = []
    for op in ("all_reduce", "all_gather", "reduce_scatter"):
        for mb in sizes:
            total = int(mb * (1 << 20)) // 4 * 4
            n = total // 4
            full = torch.ones(n, device="cuda")
            shard = torch.ones(n // world, device="cuda")

            def once():
                if op == "all_reduce":
                    dist.all_reduce(full)
                elif op == "all_gather":
                    dist.all_gather_into_tensor(full[: (n // world) * world], shard)
                else:
                    dist.reduce_scatter_tensor(shard, full[: (n // world) * world])

            once()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                once()
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / iters
            factor = (2.0 * (world - 1) / world if op == "all_reduce" else (world - 1) / world) if world > 1 else 1.0
            rows.append((op, total, dt * 1e6, total * factor / dt / 1e9))
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mb", default="1,16,64,256")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print("gpu_torch_baseline: no torch")
        return 2
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        print("gpu_torch_baseline: no GPU or no NCCL in this torch (%s)" % torch.__version__)
        return 2
    sizes = [float(s) for s in args.sizes_mb.split(",") if s]
    world = torch.cuda.device_count()
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "rdzv")
        procs = [ctx.Process(target=_worker, args=(r, world, init_file, sizes, args.iters, q))
                 for r in range(world)]
        for p in procs:
            p.start()
        rows = q.get(timeout=600)
        for p in procs:
            p.join(timeout=120)
    print("torch.distributed NCCL (in-process): %d rank(s), torch %s, NCCL %s"
          % (world, torch.__version__, ".".join(map(str, torch.cuda.nccl.version()))))
    print("%-15s %10s %12s %10s" % ("op", "bytes", "torch_us", "GB/s"))
    for op, total, us, bw in rows:
        print("%-15s %10d %12.1f %10.2f" % (op, total, us, bw))
    return 0 if all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    sys.exit(main())
