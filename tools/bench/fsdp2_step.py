#!/usr/bin/env python3
"""FSDP2 training step of the transformer (tools/demo/transformer.py) over Gloo and
hsdpd, with and without hsdp.torch.fsdp2's comm-buffer hooks, in the SAME processes,
in alternating rounds.

    PY=$(HSDP_VENV=... tools/scripts/python_env.sh)
    $PY tools/bench/fsdp2_step.py --mesh 2 --dim 1024 --blocks 4 --batch 1
    $PY tools/bench/fsdp2_step.py --mesh 2x2 ...      # HSDP, replicate x shard

The default process group is "hsdpd" (a daemon is started from $HSDP_BUILD_DIR/bin
unless $HSDPD_SOCKET names a running one); the Gloo meshes are the same shape,
made with init_device_mesh(backend_override=gloo). Every round runs every mode
once (a fresh model, 1 warm-up step, --steps timed steps); the order of the
modes rotates from round to round. Per mode: the median over rounds of the
step time, of the time inside FSDP2's collectives (its all-gather and
reduce-scatter calls and the HSDP all-reduce, each to completion: on CPU FSDP2
issues them synchronously) and of the bytes the hsdpd backend had to copy into
and out of its staging memory because FSDP2's buffers were not in hsdpd
memory. Prints a table and, with --json, writes the raw numbers.

Modes: gloo, hsdpd, hsdpd+buffers (use_hsdp_comm_buffers), hsdpd+composite
(also the composite reduce-scatter -> all-reduce; 2-D meshes only).
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "demo"))


def _timed_comms(model, client, acc):
    """Wraps every FSDP2 unit's all-gather / reduce-scatter comm to time it and to count
    the bytes of its tensors that are not in hsdpd memory (the backend stages those)."""
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
    from torch.distributed.fsdp import FSDPModule

    def staged(*tensors):
        if client is None:
            return 0
        return sum(t.numel() * t.element_size() for t in tensors if client.locate(t) is None)

    class TimedAG(AllGather):
        def __init__(self, inner):
            self.inner = inner

        def allocate(self, size, *, dtype, device):
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            t0 = time.perf_counter()
            w = self.inner(output_tensor, input_tensor, group, async_op)
            if w is not None:
                w.wait()
            acc["comm"] += time.perf_counter() - t0
            acc["staged"] += staged(output_tensor)  # the input is a slice of the output

    class TimedRS(ReduceScatter):
        def __init__(self, inner):
            self.inner = inner

        def allocate(self, size, *, dtype, device):
            return self.inner.allocate(size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            t0 = time.perf_counter()
            w = self.inner(output_tensor, input_tensor, group, op, async_op)
            if w is not None:
                w.wait()
            acc["comm"] += time.perf_counter() - t0
            acc["staged"] += staged(output_tensor, input_tensor)

    for m in model.modules():
        if isinstance(m, FSDPModule):
            for g in m._get_fsdp_state()._fsdp_param_groups:
                g._all_gather_comm = TimedAG(g._all_gather_comm)
                g._reduce_scatter_comm = TimedRS(g._reduce_scatter_comm)


def _patch_all_reduce(acc_ref, client_ref):
    """Times FSDP2's HSDP all-reduce (dist.all_reduce on the replicate group)."""
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as fc
    orig = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        acc = acc_ref[0]
        t0 = time.perf_counter()
        out = orig(tensor, *args, **kwargs)
        if acc is not None:
            acc["comm"] += time.perf_counter() - t0
            c = client_ref[0]
            if c is not None and c.locate(tensor) is None:
                acc["staged"] += 2 * tensor.numel() * tensor.element_size()
        return out
    proxy = types.ModuleType("dist_timed")  # what _fsdp_collectives sees as `dist`
    proxy.__dict__["__getattr__"] = lambda name: getattr(dist, name)
    proxy.all_reduce = all_reduce
    fc.dist = proxy
    return orig


def worker(rank, world, args, store, q):
    try:
        q.put((rank, True, _worker(rank, world, args, store)))
    except BaseException:  # noqa: B902
        import traceback
        q.put((rank, False, traceback.format_exc()))


def _worker(rank, world, args, store):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import hsdp.torch
    import hsdp.torch.fsdp2 as f2
    import transformer as T
    torch.set_num_threads(1)
    dist.init_process_group("hsdpd", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    shape = tuple(args.mesh_shape)
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    meshes = {"hsdpd": init_device_mesh("cpu", shape, mesh_dim_names=names),
              "gloo": init_device_mesh("cpu", shape, mesh_dim_names=names,
                                       backend_override={n: "gloo" for n in names})}
    client = hsdp.torch.client()
    acc_ref, client_ref = [None], [None]
    _patch_all_reduce(acc_ref, client_ref)
    dims = dict(vocab=args.vocab, dim=args.dim, heads=args.heads, blocks=args.blocks,
                seq=args.seq)
    results = {m: [] for m in args.modes}
    for rnd in range(args.rounds):
        order = args.modes[rnd % len(args.modes):] + args.modes[:rnd % len(args.modes)]
        for mode in order:
            backend = "gloo" if mode == "gloo" else "hsdpd"
            model = T.shard_transformer(T.TinyTransformer(**dims, seed=0), meshes[backend],
                                        fully_shard)
            if mode in ("hsdpd+buffers", "hsdpd+composite"):
                f2.use_hsdp_comm_buffers(model, composite=mode == "hsdpd+composite")
            acc = {"comm": 0.0, "staged": 0}
            _timed_comms(model, client if backend == "hsdpd" else None, acc)
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            acc_ref[0], client_ref[0] = acc, (client if backend == "hsdpd" else None)
            steps = []
            for step in range(args.steps + 1):
                tokens = T.batch(step, rank, args.batch, args.vocab, args.seq)
                dist.barrier()
                acc["comm"], acc["staged"] = 0.0, 0
                t0 = time.perf_counter()
                T.lm_loss(model, tokens).backward()
                opt.step()
                opt.zero_grad()
                dt = time.perf_counter() - t0
                if step > 0:  # step 0 warms up
                    steps.append((dt, acc["comm"], acc["staged"]))
            acc_ref[0] = None
            results[mode].append(steps)
            del model, opt
    dist.destroy_process_group()
    return results


def _start_daemon(build):
    tmp = tempfile.mkdtemp(prefix="hsdpd-bench-")
    sock = os.path.join(tmp, "hsdpd.sock")
    log = open(os.path.join(tmp, "hsdpd.log"), "w")
    proc = subprocess.Popen([os.path.join(build, "bin", "hsdpd"), "--socket", sock],
                            stdout=log, stderr=subprocess.STDOUT)
    for _ in range(200):
        if os.path.exists(sock):
            break
        time.sleep(0.05)
    return proc, tmp, sock


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mesh", default="2", help="2, 4 (FSDP) or 2x2 (HSDP)")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1, help="sequences per rank")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mode and round")
    ap.add_argument("--modes", default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    args.mesh_shape = [int(x) for x in args.mesh.split("x")]
    world = 1
    for s in args.mesh_shape:
        world *= s
    default = ["gloo", "hsdpd", "hsdpd+buffers"] + (
        ["hsdpd+composite"] if len(args.mesh_shape) == 2 else [])
    args.modes = args.modes.split(",") if args.modes else default

    build = os.path.abspath(os.environ.get("HSDP_BUILD_DIR", os.path.join(ROOT, "build")))
    sys.path.insert(0, os.path.join(build, "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(build, "python"), os.path.join(ROOT, "tools", "demo")] +
        [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    daemon = None
    if not os.environ.get("HSDPD_SOCKET"):
        daemon, tmpdir, sock = _start_daemon(build)
        os.environ["HSDPD_SOCKET"] = sock
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    store = os.path.join(tempfile.mkdtemp(prefix="fsdp2-bench-"), "store")
    t_start = time.time()
    load0 = os.getloadavg()
    procs = [ctx.Process(target=worker, args=(r, world, args, store, q)) for r in range(world)]
    for p in procs:
        p.start()
    res = {}
    try:
        for _ in range(world):
            rank, ok, val = q.get(timeout=3600)
            if not ok:
                raise SystemExit(f"rank {rank} failed:\n{val}")
            res[rank] = val
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
        if daemon is not None:
            daemon.terminate()
            daemon.wait(10)
            shutil.rmtree(tmpdir, ignore_errors=True)
    load1 = os.getloadavg()
    _report(args, world, res, load0, load1, time.time() - t_start)


def _report(args, world, res, load0, load1, wall):
    nparams = args.blocks * 12 * args.dim * args.dim
    print(f"FSDP2 step: mesh {args.mesh} (world {world}), transformer dim {args.dim} x "
          f"{args.blocks} blocks (~{nparams * 4 / 2**20:.0f} MB fp32 of block weights), "
          f"batch {args.batch} x seq {args.seq} per rank; {args.rounds} rounds x "
          f"{args.steps} steps; load average {load0[0]:.1f} -> {load1[0]:.1f} on "
          f"{os.cpu_count()} CPUs; {wall:.0f} s")
    # Per round and mode: the step time is the slowest rank's mean over the round's steps.
    summary = {}
    for mode in args.modes:
        steps, comms, staged = [], [], []
        for rnd in range(args.rounds):
            per_rank = [res[r][mode][rnd] for r in range(world)]
            steps.append(max(statistics.mean(s[0] for s in pr) for pr in per_rank))
            comms.append(statistics.mean(statistics.mean(s[1] for s in pr) for pr in per_rank))
            staged.append(statistics.mean(statistics.mean(s[2] for s in pr) for pr in per_rank))
        summary[mode] = {"step_s": steps, "comm_s": comms, "staged_bytes": staged}
    base = statistics.median(summary["gloo"]["step_s"]) if "gloo" in summary else None
    print(f"{'mode':<17}{'step ms (min-max)':>24}{'comm ms':>10}{'comm %':>8}"
          f"{'staged MB/step':>16}{'step / gloo':>13}")
    for mode, s in summary.items():
        st, cm = statistics.median(s["step_s"]), statistics.median(s["comm_s"])
        ratio = f"{st / base:.2f}x" if base else "-"
        print(f"{mode:<17}{st * 1e3:>10.0f} ({min(s['step_s']) * 1e3:.0f}-"
              f"{max(s['step_s']) * 1e3:.0f}){'':>4}{cm * 1e3:>10.0f}{100 * cm / st:>7.0f}%"
              f"{statistics.median(s['staged_bytes']) / 2**20:>16.1f}{ratio:>13}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "load": [load0, load1], "summary": summary}, f,
                      indent=1)


if __name__ == "__main__":
    main()
