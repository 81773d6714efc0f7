"""The torch Gloo baseline's frame, shared by compare.py and compare_cluster.py:
the sizes swept, how one collective is timed, and the world of worker
processes that runs it.
"""
import os
import tempfile
import time


def sizes_mb(min_mb, max_mb):
    """Bytes: min_mb MiB, doubled while at most max_mb MiB."""
    sizes = []
    s = min_mb << 20
    while s <= max_mb << 20:
        sizes.append(s)
        s *= 2
    return sizes


def mean_seconds(fn, iters, warmup):
    """Seconds per call of fn: `warmup` untimed calls, then the mean of
    `iters`, each after a barrier of the whole world, as hsdp-bench times."""
    import torch.distributed as dist
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sum(times) / len(times)


def run_world(worker, n, args, join_timeout=None):
    """Runs worker(rank, init_file, queue, *args) in n spawned processes
    (torch.distributed's file:// rendezvous at init_file) and returns what
    rank 0 puts on the queue."""
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        init_file = os.path.join(d, "init")
        procs = [ctx.Process(target=worker, args=(r, init_file, queue, *args)) for r in range(n)]
        for p in procs:
            p.start()
        result = queue.get(timeout=1800)
        for p in procs:
            p.join(timeout=join_timeout)
    return result
