#!/usr/bin/env python3
"""Multi-process training through the "hsdpd" backend.

    HSDPD_SOCKET=/tmp/x/hsdpd.sock PYTHONPATH=build/python \\
        $(tools/scripts/python_env.sh) tools/demo/train_demo.py \\
        [--steps 20] [--world 2] [--mode auto|fsdp2|ddp|flat] [--hsdp]

Assumes an hsdpd is running at $HSDPD_SOCKET (or the default socket). Spawns
`--world` ranks (torch.multiprocessing, file:// rendezvous) and trains:
- fsdp2 (what `auto` picks where torch has FSDP2, torch >= 2.7): the small
  transformer of tools/demo/transformer.py with FSDP2 fully_shard (each block
  its own unit) on a 1-D DeviceMesh of the "hsdpd" ranks (--hsdp: a 2-D
  replicate x shard mesh, world 4), its communication buffers in hsdpd memory
  (hsdp.torch.fsdp2.use_hsdp_comm_buffers), on a learnable token sequence task;
- ddp (what `auto` picks elsewhere): an MLP with DistributedDataParallel;
- flat: the MLP with hsdp.flat_param (FSDP-style sharded flat parameters).
It prints which one runs, the loss and the time spent in communication per step
on rank 0, and exits cleanly (exit status 0 on success, 1 if a rank failed or
the loss did not go down).

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


def fsdp2_available():
    """(True, "") where FSDP2 and the demo's transformer can run, else (False, why)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401 - torch >= 2.6
        from torch.distributed.device_mesh import init_device_mesh  # noqa: F401
    except ImportError as e:
        return False, f"torch {torch.__version__} has no FSDP2 ({e})"
    try:
        import transformer  # noqa: F401 - tools/demo/transformer.py, next to this file
    except ImportError as e:
        return False, f"tools/demo/transformer.py not found ({e})"
    return True, ""


def token_batch(gen, n, vocab=64, seq=16):
    """Arithmetic token sequences (start a, stride b, mod vocab): learnable in a few steps."""
    a = torch.randint(0, vocab, (n, 1), generator=gen)
    b = torch.randint(1, 4, (n, 1), generator=gen)
    return (a + b * torch.arange(seq + 1)) % vocab


def run_fsdp2(rank, steps, log, hsdp_mesh=False, groups=None):
    import hsdp.torch.fsdp2 as f2
    import transformer as T
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    world = dist.get_world_size()
    if hsdp_mesh:
        mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    if groups is not None:
        groups.extend(mesh.get_group(name) for name in mesh.mesh_dim_names)
    model = T.shard_transformer(T.TinyTransformer(vocab=64, dim=64, heads=4, blocks=3,
                                                  seq=16), mesh, fully_shard)
    try:
        f2.use_hsdp_comm_buffers(model, composite=hsdp_mesh)
    except NotImplementedError as e:  # an FSDP2 without the comm hooks: staged buffers
        if rank == 0:
            print(f"(comm-buffer hooks unavailable: {e})", flush=True)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1 + rank)
    comm = {"s": 0.0}
    _time_comms(model, comm)
    for step in range(steps):
        tokens = token_batch(gen, 8)
        t0 = time.perf_counter()
        comm["s"] = 0.0
        loss = T.lm_loss(model, tokens)
        loss.backward()  # FSDP2 all-gathers and reduce-scatters each block through hsdpd
        opt.step()
        opt.zero_grad()
        log(step, loss, time.perf_counter() - t0, comm["s"])


def _time_comms(model, comm):
    """Adds the time in FSDP2's all-gather / reduce-scatter calls to comm["s"] (on CPU
    FSDP2 issues them synchronously; the HSDP composite includes the all-reduce)."""
    from torch.distributed.fsdp import FSDPModule
    for m in model.modules():
        if not isinstance(m, FSDPModule):
            continue
        for g in m._get_fsdp_state()._fsdp_param_groups:
            for attr in ("_all_gather_comm", "_reduce_scatter_comm"):
                inner = getattr(g, attr)
                call = type(inner).__call__

                def timed(self, *a, _call=call, **kw):
                    t0 = time.perf_counter()
                    try:
                        return _call(self, *a, **kw)
                    finally:
                        comm["s"] += time.perf_counter() - t0
                # A per-object subclass: FSDP2 calls comm(...), which looks up the type.
                inner.__class__ = type(type(inner).__name__, (type(inner),),
                                       {"__call__": timed})


def worker(rank, world, init_method, steps, mode, results, timeout_s=600, hsdp_mesh=False):
    torch.set_num_threads(1)
    import hsdp.torch  # noqa: F401 - registers "hsdpd"
    dist.init_process_group("hsdpd", init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    losses = []
    pg = dist.distributed_c10d._get_default_group()
    groups = [pg]  # whose hsdpd operations the log counts (FSDP2 adds its mesh's groups)

    def hsdp_stats():
        tot = {"ops": 0, "exec_ns": 0}
        for g in {id(g): g for g in groups}.values():
            st = g.hsdp_stats()
            tot["ops"] += st["ops"]
            tot["exec_ns"] += st["exec_ns"]
        return tot
    last = hsdp_stats()

    def log(step, loss, step_s, comm_s):
        nonlocal last
        now = hsdp_stats()
        ops, exec_ms = now["ops"] - last["ops"], (now["exec_ns"] - last["exec_ns"]) / 1e6
        last = now
        # Average the loss over ranks for the printout (also through hsdpd).
        t = loss.detach().clone()
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        losses.append(t.item())
        if rank == 0:
            label = {"ddp": "backward incl. all-reduce", "fsdp2": "in FSDP2 comms"}.get(
                mode, "comm")
            print(f"step {step:3d}  loss {t.item():.5f}  step {step_s * 1e3:7.2f} ms  "
                  f"{label} {comm_s * 1e3:7.2f} ms  hsdpd: {ops} ops, exec {exec_ms:6.2f} ms",
                  flush=True)

    try:
        if mode == "fsdp2":
            run_fsdp2(rank, steps, log, hsdp_mesh, groups)
        else:
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
    mode = args.mode + (" (HSDP 2-D mesh)" if args.hsdp else "")
    print(f"hsdpd demo: rank {rank} of {world}, {mode}, {args.steps} steps, socket "
          f"{os.environ.get('HSDPD_SOCKET', '(default)')}, store "
          f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}", flush=True)
    results = queue.SimpleQueue()
    t0 = time.perf_counter()
    worker(rank, world, "env://", args.steps, args.mode, results, args.timeout, args.hsdp)
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
    ap.add_argument("--mode", choices=("auto", "fsdp2", "ddp", "flat"), default="auto",
                    help="auto: fsdp2 where this torch has FSDP2, else ddp")
    ap.add_argument("--hsdp", action="store_true",
                    help="fsdp2 on a 2-D replicate x shard mesh (an even --world >= 4)")
    ap.add_argument("--timeout", type=float, default=600,
                    help="seconds for the rendezvous and each collective (env mode)")
    args = ap.parse_args()
    ok, why = fsdp2_available()
    if args.mode == "auto":
        args.mode = "fsdp2" if ok else "ddp"
        if not ok:
            print(f"hsdpd demo: FSDP2 unavailable ({why}); training with DDP", flush=True)
    elif args.mode == "fsdp2" and not ok:
        print(f"demo FAILED: --mode fsdp2: {why}", file=sys.stderr)
        return 1
    if args.hsdp and (args.mode != "fsdp2" or args.world < 4 or args.world % 2):
        print("demo FAILED: --hsdp needs --mode fsdp2 and an even --world >= 4",
              file=sys.stderr)
        return 1
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return main_env(args)
    what = {"fsdp2": "FSDP2 fully_shard" + (" (HSDP 2-D mesh)" if args.hsdp else ""),
            "ddp": "DDP", "flat": "hsdp.flat_param"}[args.mode]
    print(f"hsdpd demo: {args.world} ranks, {what}, {args.steps} steps, socket "
          f"{os.environ.get('HSDPD_SOCKET', '(default)')}", flush=True)
    store = os.path.join(tempfile.mkdtemp(prefix="hsdp-demo-"), "store")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args.world, f"file://{store}", args.steps,
                                              args.mode, results, 600, args.hsdp))
             for r in range(args.world)]
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
