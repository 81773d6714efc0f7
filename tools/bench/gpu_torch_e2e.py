#!/usr/bin/env python3
"""End to end on a GPU machine (run by tools/scripts/run_gpu_tests.sh): a real
hsdpd with engine.kind nccl, trainer processes submitting CUDA tensors through
the torch backend "hsdpd" (legacy IPC handles of the caching allocator,
producer events, Work.wait() ordering the current stream), checked against
expected values; then FSDP2 fully_shard for a few steps, its parameters
compared with a single-process reference trained on the whole batch.

Trainer processes (--world, 2 by default) in one process group, spread over
the GPUs round robin: on a single GPU all on cuda:0 (hsdpd reduces within the
device; in-process NCCL cannot run two ranks on one GPU at all).

With --bench, the same processes then time, in the same run:
  * all-reduce / all-gather / reduce-scatter through hsdpd, 4 KiB to --max-mb,
    against the device's own copy (dst.copy_(src), same bytes, same GPU) and
    against torch's Gloo on the same CUDA tensors;
  * the time a 4 KiB all-reduce adds over a bare kernel launch (both waited
    for with a stream synchronisation, median of many);
  * overlap: a bf16 matmul loop alone, a 64 MiB all-reduce alone, and both
    together (the collective submitted before the loop): hidden fraction =
    (compute + collective - together) / collective.
Exits 0 when every check passed, 1 otherwise, 2 when no GPU / torch with CUDA
is present.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time


def fsdp2_check(torch, dist, dev, rank, world, failures):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard

    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                   torch.nn.Linear(256, 8)).to(dev)

    reference, model = make(), make()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    gen = torch.Generator(device=dev).manual_seed(1)
    per_rank = 16
    for _ in range(4):
        batch = torch.randn(per_rank * world, 256, device=dev, generator=gen)
        mine = batch[rank * per_rank:(rank + 1) * per_rank]
        loss = model(mine).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_loss = reference(batch).square().mean()
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
    sync_dev(torch, dev)
    worst = 0.0
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        worst = max(worst, (full - q).abs().max().item())
    if not worst <= 1e-5:
        failures.append(f"fsdp2: parameters differ from the reference by {worst:.3g} (> 1e-5)")
    return worst


def sync_dev(torch, dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(torch, dev, fn, iters):
    """Seconds per call of fn, the stream synchronised once at the end."""
    fn()
    sync_dev(torch, dev)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync_dev(torch, dev)
    return (time.perf_counter() - t0) / iters


def median_sync(torch, dev, fn, iters):
    """Median seconds of fn followed by a stream synchronisation."""
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync_dev(torch, dev)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples[iters // 10:])


def bench(torch, dist, dev, rank, world, max_mb, report):
    gloo = dist.new_group(backend="gloo")
    sizes = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
    sizes = [s for s in sizes if s <= max_mb << 20]
    sync = torch.zeros(1, device=dev)
    for nbytes in sizes:
        n = nbytes // 4
        iters = max(3, min(100, (1 << 30) // nbytes))
        gloo_iters = max(2, min(20, (64 << 20) // nbytes))
        row = {"bytes": nbytes}
        if rank == 0:  # the device's own copy, rank 1 waits in the all-reduce below
            src = torch.ones(n, device=dev)
            dst = torch.empty(n, device=dev)
            row["copy"] = timed(torch, dev, lambda: dst.copy_(src), iters)
            del src, dst
        dist.all_reduce(sync)
        x = torch.ones(n, device=dev)
        row["all_reduce"] = timed(torch, dev, lambda: dist.all_reduce(x), iters)
        out = torch.empty(n, device=dev)
        shard = torch.ones(n // world, device=dev)
        row["all_gather"] = timed(
            torch, dev, lambda: dist.all_gather_into_tensor(out, shard), iters)
        row["reduce_scatter"] = timed(
            torch, dev, lambda: dist.reduce_scatter_tensor(shard, x), iters)
        if nbytes <= 256 << 20:
            try:
                row["gloo_all_reduce"] = timed(
                    torch, dev, lambda: dist.all_reduce(x, group=gloo), gloo_iters)
            except Exception as e:  # reported in the table, not hidden
                row["gloo_all_reduce"] = f"{type(e).__name__}"
        del x, out, shard
        dist.all_reduce(sync)
        if rank == 0:
            report.append(row)
    # Time added at 4 KiB over a bare kernel launch, both synchronised.
    x = torch.ones(1024, device=dev)
    bare = median_sync(torch, dev, lambda: x.add_(1), 400)
    dist.all_reduce(sync)
    hsdp = median_sync(torch, dev, lambda: dist.all_reduce(x), 400)
    dist.all_reduce(sync)
    # Overlap: the collective submitted first, then the compute on the trainer's stream.
    dim = 4096 if dev.type == "cuda" else 256
    a = torch.randn(dim, dim, device=dev, dtype=torch.bfloat16)
    y = torch.ones(16 << 20, device=dev)
    steps = 20
    compute = timed(torch, dev, lambda: [a @ a for _ in range(steps)], 3)
    dist.all_reduce(sync)
    comm = timed(torch, dev, lambda: dist.all_reduce(y), 3)
    dist.all_reduce(sync)

    def both():
        work = dist.all_reduce(y, async_op=True)
        for _ in range(steps):
            a @ a
        work.wait()
    together = timed(torch, dev, both, 3)
    if rank == 0:
        report.append({"latency_4k": {"bare_kernel": bare, "hsdp_all_reduce": hsdp},
                       "overlap": {"compute": compute, "comm_64mb": comm, "together": together}})


def worker(rank, world, init, results, gpu, job, max_mb):
    """gpu: a CUDA device index, or None: CPU tensors (--cpu, to check this
    script on a machine without a GPU)."""
    os.environ["HSDP_JOB_ID"] = job
    import torch
    import torch.distributed as dist
    import hsdp.torch  # noqa: F401 - registers the "hsdpd" backend
    if gpu is not None:
        torch.cuda.set_device(gpu)
    dist.init_process_group("hsdpd", init_method=init, rank=rank, world_size=world)
    dev = torch.device("cuda", gpu) if gpu is not None else torch.device("cpu")
    failures = []
    report = []

    def check(name, got, want):
        sync_dev(torch, dev)
        if not torch.equal(got.cpu(), want.cpu()):
            failures.append(f"{name}: got {got[:4].tolist()}, want {want[:4].tolist()}")

    try:
        n = 1 << 16
        base = torch.arange(n, dtype=torch.float32, device=dev)
        ranks_sum = sum(range(1, world + 1))
        # The producer kernel runs on the current stream right before submitting:
        # the daemon must wait for it (producer event), Work.wait() orders after.
        x = (base * 0 + 1) * (rank + 1)
        dist.all_reduce(x, async_op=True).wait()
        check("all_reduce", x, torch.full((n,), float(ranks_sum), device=dev))
        m = (base * 0 + 1) * (rank + 1)
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        check("all_reduce max", m, torch.full((n,), float(world), device=dev))
        out = torch.empty(n * world, device=dev)
        dist.all_gather_into_tensor(out, base + rank, async_op=True).wait()
        check("all_gather", out, torch.cat([base + r for r in range(world)]))
        rs_in = torch.cat([base + r for r in range(world)]) * (rank + 1)
        rs_out = torch.empty(n, device=dev)
        dist.reduce_scatter_tensor(rs_out, rs_in, async_op=True).wait()
        check("reduce_scatter", rs_out, (base + rank) * ranks_sum)
        avg = (base * 0 + 2) * (rank + 1)
        dist.all_reduce(avg, op=dist.ReduceOp.AVG)
        check("all_reduce avg", avg, torch.full((n,), 2.0 * ranks_sum / world, device=dev))
        bf = ((base % 7) * (rank + 1)).to(torch.bfloat16)
        dist.all_reduce(bf)
        check("all_reduce bf16", bf, ((base % 7) * ranks_sum).to(torch.bfloat16))
        b = base + 100 * rank
        dist.broadcast(b, src=world - 1)
        check("broadcast", b, base + 100 * (world - 1))
    except Exception as e:  # reported, not hidden
        failures.append(f"collectives: {type(e).__name__}: {e}")
    fsdp_diff = None
    try:
        fsdp_diff = fsdp2_check(torch, dist, dev, rank, world, failures)
    except Exception as e:
        failures.append(f"fsdp2 fully_shard: {type(e).__name__}: {e}")
    if max_mb and not failures:
        try:
            bench(torch, dist, dev, rank, world, max_mb, report)
        except Exception as e:
            failures.append(f"bench: {type(e).__name__}: {e}")
    dist.destroy_process_group()
    results.put((rank, failures, fsdp_diff, report))


def fmt_bytes(n):
    return f"{n >> 30} GiB" if n >= 1 << 30 else f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def print_report(report, world):
    print("\n| bytes | copy GB/s | all-reduce GB/s (x copy) | all-gather GB/s | "
          "reduce-scatter GB/s | Gloo all-reduce GB/s | all-reduce µs |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for row in report:
        if "bytes" not in row:
            continue
        nb = row["bytes"]
        gb = lambda s: nb / s / 1e9 if isinstance(s, float) else float("nan")  # noqa: E731
        gloo = row.get("gloo_all_reduce")
        gloo_s = f"{gb(gloo):.2f}" if isinstance(gloo, float) else (gloo or "-")
        print(f"| {fmt_bytes(nb)} | {gb(row['copy']):.1f} | {gb(row['all_reduce']):.1f} "
              f"({row['copy'] / row['all_reduce']:.2f}) | {gb(row['all_gather']):.1f} | "
              f"{gb(row['reduce_scatter']):.1f} | {gloo_s} | {row['all_reduce'] * 1e6:.1f} |")
    for row in report:
        if "latency_4k" in row:
            lat = row["latency_4k"]
            print(f"\n4 KiB all-reduce, synchronised, median: {lat['hsdp_all_reduce'] * 1e6:.1f} µs; "
                  f"bare kernel launch {lat['bare_kernel'] * 1e6:.1f} µs; added "
                  f"{(lat['hsdp_all_reduce'] - lat['bare_kernel']) * 1e6:.1f} µs")
            ov = row["overlap"]
            hidden = (ov["compute"] + ov["comm_64mb"] - ov["together"]) / ov["comm_64mb"]
            print(f"overlap: compute {ov['compute'] * 1e3:.2f} ms, 64 MiB all-reduce "
                  f"{ov['comm_64mb'] * 1e3:.2f} ms, together {ov['together'] * 1e3:.2f} ms: "
                  f"hidden {hidden * 100:.0f}%")
    print(f"(world {world}; GB/s = bytes of the buffer / time; all-gather and "
          "reduce-scatter: bytes of the whole buffer)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="build dir with bin/hsdpd and python/")
    ap.add_argument("--bench", action="store_true", help="also time (see the docstring)")
    ap.add_argument("--max-mb", type=int, default=1024, help="largest size of --bench")
    ap.add_argument("--world", type=int, default=2, help="trainer processes (one job)")
    ap.add_argument("--cpu", action="store_true",
                    help="CPU tensors and engine.kind cpu: checks this script without a GPU")
    args = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print("gpu_torch_e2e: torch is not installed")
        return 2
    if not torch.cuda.is_available() and not args.cpu:
        print("gpu_torch_e2e: no GPU visible to torch", torch.__version__)
        return 2
    print("torch", torch.__version__, "cuda", torch.version.cuda,
          "cpu" if args.cpu else torch.cuda.get_device_name(0), flush=True)
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.environ["PYTHONPATH"] = os.path.join(args.build, "python")
    tmp = tempfile.mkdtemp(prefix="hsdp-gpu-e2e.")
    cfg = os.path.join(tmp, "node.yaml")
    with open(cfg, "w") as f:
        f.write("engine:\n  kind: %s\n" % ("cpu" if args.cpu else "nccl"))
    sock = os.path.join(tmp, "hsdpd.sock")
    log_path = os.path.join(tmp, "hsdpd.log")
    log = open(log_path, "w")
    daemon = subprocess.Popen([os.path.join(args.build, "bin", "hsdpd"), "--socket", sock,
                               "--node-config", cfg], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while not os.path.exists(sock) and time.time() < deadline and daemon.poll() is None:
        time.sleep(0.1)
    if not os.path.exists(sock):
        print("gpu_torch_e2e: hsdpd did not start:\n" + open(log_path).read())
        return 1
    os.environ["HSDPD_SOCKET"] = sock
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    world = args.world
    ngpu = 0 if args.cpu else torch.cuda.device_count()
    gpus = [None] * world if args.cpu else [r % ngpu for r in range(world)]
    init = "file://" + os.path.join(tmp, "rendezvous")
    max_mb = args.max_mb if args.bench else 0
    procs = [ctx.Process(target=worker, args=(r, world, init, results, gpus[r], "e2e", max_mb))
             for r in range(world)]
    for p in procs:
        p.start()
    failed = False
    deadline = time.time() + 300
    for _ in range(len(procs)):
        got = None
        while got is None and time.time() < deadline:
            try:
                got = results.get(timeout=1)
            except Exception:  # queue.Empty: is every worker still alive?
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    break
        if got is None:
            print("gpu_torch_e2e: a worker died or did not report within 300 s")
            failed = True
            break
        rank, failures, fsdp_diff, report = got
        for f in failures:
            print(f"rank {rank}: {f}")
            failed = True
        if fsdp_diff is not None:
            print(f"rank {rank}: FSDP2 max |param - reference| = {fsdp_diff:.3g}")
        if report:
            print_report(report, world)
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
            failed = True
    daemon.send_signal(signal.SIGTERM)
    try:
        rc = daemon.wait(30)
    except subprocess.TimeoutExpired:
        daemon.kill()
        rc = "killed after 30 s"
    if failed or rc != 0:
        failed = True
        print(f"--- hsdpd exit {rc}, log tail:\n" + open(log_path).read()[-4000:])
    print(f"gpu_torch_e2e: world {world} on GPUs {gpus}: {'FAILED' if failed else 'OK'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
