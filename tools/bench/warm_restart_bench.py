#!/usr/bin/env python3
"""Warm restart of a trainer against a fresh start, same run.

    PYTHONPATH=build/python build/venv/bin/python tools/bench/warm_restart_bench.py \\
        [--bin build/bin] [--rounds 3]

Each round, alternating order:
  warm restart   a two-rank torch job over hsdpd runs; rank 1 exits; a new
                 rank-1 process starts and joins the survivor's group (the
                 survivor keeps its process group): the time from the new
                 process's start (its first line of Python) to its first
                 successful all-reduce.
  gloo fresh     a new two-rank torch job with Gloo (TCPStore on loopback):
                 the time from rank 1's start to its first successful
                 all-reduce, the cost a job without warm restart pays for
                 every rank (and every rank restarts).
  hsdpd fresh    the same with a new two-rank job over hsdpd.
Prints medians (ms) and each round's values. The import of torch is part of
every figure alike; the line below the table gives it alone.
"""
import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_daemon import running_hsdpd  # noqa: E402


def rank_main(rank, port, backend, job, mode, queue):
    t_start = time.monotonic()
    import torch
    import torch.distributed as dist
    t_torch = time.monotonic()
    if backend == "hsdpd":
        import hsdp.torch  # noqa: F401
        os.environ["HSDP_JOB_ID"] = job
        os.environ["HSDP_WARM_RESTART"] = "1"
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=2)
    x = torch.ones(4)
    if mode == "survivor":
        dist.all_reduce(x)  # with the first rank 1
        queue.put(("ready", rank))
        try:
            dist.all_reduce(x)  # fails: rank 1 left
        except RuntimeError:
            pass
        dist.all_reduce(x)  # rejoins, waits for the new rank 1
    elif mode == "doomed":
        dist.all_reduce(x)
        os._exit(0)
    else:  # restarted, fresh
        dist.all_reduce(x)
    t_first = time.monotonic()
    if mode in ("restarted", "fresh"):
        queue.put(("time", rank, (t_first - t_start) * 1e3, (t_torch - t_start) * 1e3))
    dist.destroy_process_group()


def warm(ctx, backend, job):
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    q = ctx.Queue()
    surv = ctx.Process(target=rank_main, args=(0, store.port, backend, job, "survivor", q))
    doomed = ctx.Process(target=rank_main, args=(1, store.port, backend, job, "doomed", q))
    surv.start()
    doomed.start()
    assert q.get(timeout=120) == ("ready", 0)
    doomed.join(60)
    new = ctx.Process(target=rank_main, args=(1, store.port, backend, job, "restarted", q))
    new.start()
    _, _, ms, torch_ms = q.get(timeout=120)
    new.join(60)
    surv.join(60)
    return ms, torch_ms


def fresh(ctx, backend, job):
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    q = ctx.Queue()
    ps = [ctx.Process(target=rank_main, args=(r, store.port, backend, job, "fresh", q))
          for r in range(2)]
    for p in ps:
        p.start()
    got = {}
    for _ in range(2):
        _, rank, ms, torch_ms = q.get(timeout=120)
        got[rank] = (ms, torch_ms)
    for p in ps:
        p.join(60)
    return got[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "bin"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    tmp = tempfile.mkdtemp(prefix="hsdp-warm-")
    sock = os.path.join(tmp, "hsdpd.sock")
    os.environ["HSDPD_SOCKET"] = sock
    names = ["warm restart (hsdpd)", "fresh start (gloo)", "fresh start (hsdpd)"]
    res = {n: [] for n in names}
    torch_import = []
    with running_hsdpd(args.bin, sock):
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else list(reversed(names))
            for n in order:
                job = f"warm-{rnd}-{names.index(n)}"
                if n.startswith("warm"):
                    ms, tms = warm(ctx, "hsdpd", job)
                else:
                    ms, tms = fresh(ctx, "gloo" if "gloo" in n else "hsdpd", job)
                res[n].append(ms)
                torch_import.append(tms)
    print(f"time from a rank-1 process's start to its first successful all-reduce "
          f"(2 ranks, {args.rounds} rounds, ms):")
    print(f"{'':<24} {'median':>8}   rounds")
    for n in names:
        print(f"{n:<24} {statistics.median(res[n]):>8.1f}   "
              + ", ".join(f"{v:.1f}" for v in res[n]))
    print(f"of which `import torch`: median {statistics.median(torch_import):.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
