#!/usr/bin/env python3
"""Two-process training of a small model through the "hsdpd" backend.

    HSDPD_SOCKET=/tmp/x/hsdpd.sock PYTHONPATH=build/python \\
        /usr/bin/python3 tools/demo/train_demo.py [--steps 20] [--world 2] [--mode ddp|flat]

Assumes an hsdpd is running at $HSDPD_SOCKET (or the default socket). Spawns
`--world` ranks (torch.multiprocessing, file:// rendezvous), trains an MLP
on a synthetic regression task with DDP (default) or hsdp.flat_param
(FSDP-style sharded flat parameters), prints the loss and the time spent in
communication per step on rank 0, and exits cleanly (exit status 0 on
success, 1 if a rank failed or the loss did not go down).

With $RANK and $WORLD_SIZE set (torchrun-style; also $MASTER_ADDR and
$MASTER_PORT, optional $LOCAL_RANK) it runs only that rank, in this process,
with an env:// rendezvous (a TCP store on MASTER_ADDR:MASTER_PORT, served by
rank 0): one trainer per node, each attached to its own node's hsdpd, as in
deploy/docker-compose.yml. --timeout bounds the rendezvous and every
collective there.
"""
import argparse
import datetime
import os
import queue
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 1))


def batch(gen, n=64):
    x = torch.randn(n, 64, generator=gen)
    y = (x[:, :8].sum(dim=1, keepdim=True) * 0.5).tanh()
    return x, y


def run_ddp(rank, steps, log):
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(steps):
        x, y = batch(gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        tb = time.perf_counter()
        loss.backward()  # DDP all-reduces gradient buckets through hsdpd here
        t_bwd = time.perf_counter() - tb
        opt.step()
        log(step, loss, time.perf_counter() - t0, t_bwd)


def run_flat(rank, steps, log):
    import hsdp.torch
    from hsdp.flat_param import FlatParameters
    model = make_model()
    fp = FlatParameters(model, hsdp.torch.client(), bucket_size=64)
    opt = torch.optim.Adam(fp.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(steps):
        x, y = batch(gen)
        t0 = time.perf_counter()
        fp.zero_grad()
        tc = time.perf_counter()
        fp.unshard()
        comm = time.perf_counter() - tc
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        tc = time.perf_counter()
        fp.reduce_grads()
        fp.sync()
        comm += time.perf_counter() - tc
        opt.step()
        log(step, loss, time.perf_counter() - t0, comm)


def worker(rank, world, init_method, steps, mode, results, timeout_s=600):
    torch.set_num_threads(1)
    import hsdp.torch  # noqa: F401 - registers "hsdpd"
    dist.init_process_group("hsdpd", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    losses = []
    pg = dist.distributed_c10d._get_default_group()
    last = pg.hsdp_stats()

    def log(step, loss, step_s, comm_s):
        nonlocal last
        now = pg.hsdp_stats()
        ops, exec_ms = now["ops"] - last["ops"], (now["exec_ns"] - last["exec_ns"]) / 1e6
        last = now
        # Average the loss over ranks for the printout (also through hsdpd).
        t = loss.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        losses.append(t.item())
        if rank == 0:
            label = "backward incl. all-reduce" if mode == "ddp" else "comm"
            print(f"step {step:3d}  loss {t.item():.5f}  step {step_s * 1e3:7.2f} ms  "
                  f"{label} {comm_s * 1e3:7.2f} ms  hsdpd: {ops} ops, exec {exec_ms:6.2f} ms",
                  flush=True)

    try:
        (run_ddp if mode == "ddp" else run_flat)(rank, steps, log)
        dist.barrier()
        results.put((rank, losses, None))
    except BaseException as e:  # noqa: B902 - report and fail the demo
        results.put((rank, None, f"{type(e).__name__}: {e}"))
    finally:
        dist.destroy_process_group()


def check_losses(losses):
    """Exit status: 0 when the (rank-averaged) loss went down."""
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    if not losses[-1] < losses[0]:
        print("demo FAILED: the loss did not decrease", file=sys.stderr)
        return 1
    return 0


def main_env(args):
    """One rank of a job whose ranks run on several nodes (torchrun-style env)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(f"hsdpd demo: rank {rank} of {world}, {args.mode}, {args.steps} steps, socket "
          f"{os.environ.get('HSDPD_SOCKET', '(default)')}, store "
          f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}", flush=True)
    results = queue.SimpleQueue()
    t0 = time.perf_counter()
    worker(rank, world, "env://", args.steps, args.mode, results, args.timeout)
    _, losses, err = results.get()
    if err:
        print(f"demo FAILED: rank {rank}: {err}", file=sys.stderr)
        return 1
    print(f"rank {rank} done in {time.perf_counter() - t0:.1f} s", flush=True)
    return check_losses(losses)


def main():
    ap = argparse.ArgumentParser(description="hsdpd two-process training demo")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--mode", choices=("ddp", "flat"), default="ddp")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds for the rendezvous and each collective (env mode)")
    args = ap.parse_args()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return main_env(args)
    print(f"hsdpd demo: {args.world} ranks, {args.mode}, {args.steps} steps, socket "
          f"{os.environ.get('HSDPD_SOCKET', '(default)')}", flush=True)
    store = os.path.join(tempfile.mkdtemp(prefix="hsdp-demo-"), "store")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, f"file://{store}", args.steps,
                                              args.mode, results)) for r in range(args.world)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    outcome = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    errors = [f"rank {r}: {err}" for r, _, err in outcome if err]
    if errors:
        print("demo FAILED:\n" + "\n".join(errors), file=sys.stderr)
        return 1
    losses = next(l for r, l, _ in outcome if r == 0)
    print(f"done in {time.perf_counter() - t0:.1f} s", flush=True)
    return check_losses(losses)


if __name__ == "__main__":
    sys.exit(main())
