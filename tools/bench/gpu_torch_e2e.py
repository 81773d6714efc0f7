#!/usr/bin/env python3
"""End to end on a GPU machine (run by tools/scripts/run_gpu_tests.sh): a real
hsdpd with engine.kind nccl, trainer processes submitting CUDA tensors through
the torch backend "hsdpd" (legacy IPC handles of the caching allocator,
producer events, Work.wait() ordering the current stream), checked against
expected values; then FSDP2 fully_shard for a few steps where torch >= 2.4.

Two trainer processes: one process group of world 2 when there are two GPUs
(NCCL runs one rank per GPU); on a single GPU, two independent world-1 jobs
on cuda:0 (their collectives are single-member, which still maps each
trainer's memory into the daemon, waits on its producer event and records its
completion event). Exits 0 when
every check passed, 1 otherwise, 2 when no GPU / torch with CUDA is present.
Never run on a GPU by its author (docs/gpu.md).
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time


def worker(rank, world, init, results, gpu, job):
    os.environ["HSDP_JOB_ID"] = job
    import torch
    import torch.distributed as dist
    import hsdp.torch  # noqa: F401 - registers the "hsdpd" backend
    torch.cuda.set_device(gpu)
    dist.init_process_group("hsdpd", init_method=init, rank=rank, world_size=world)
    dev = torch.device("cuda", gpu)
    failures = []

    def check(name, got, want):
        torch.cuda.synchronize(dev)
        if not torch.equal(got.cpu(), want.cpu()):
            failures.append(f"{name}: got {got[:4].tolist()}, want {want[:4].tolist()}")

    n = 1 << 16
    base = torch.arange(n, dtype=torch.float32, device=dev)
    ranks_sum = sum(range(1, world + 1))
    # The producer kernel runs on the current stream right before submitting:
    # the daemon must wait for it (producer event), Work.wait() orders after.
    x = (base * 0 + 1) * (rank + 1)
    dist.all_reduce(x, async_op=True).wait()
    check("all_reduce", x, torch.full((n,), float(ranks_sum), device=dev))
    out = torch.empty(n * world, device=dev)
    dist.all_gather_into_tensor(out, base + rank, async_op=True).wait()
    check("all_gather", out, torch.cat([base + r for r in range(world)]))
    rs_in = torch.cat([base + r for r in range(world)]) * (rank + 1)
    rs_out = torch.empty(n, device=dev)
    dist.reduce_scatter_tensor(rs_out, rs_in, async_op=True).wait()
    check("reduce_scatter", rs_out, (base + rank) * ranks_sum)
    b = base + 100 * rank
    dist.broadcast(b, src=world - 1)
    check("broadcast", b, base + 100 * (world - 1))

    major, minor = (int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if (major, minor) >= (2, 4):
        try:
            try:
                from torch.distributed.fsdp import fully_shard
            except ImportError:
                from torch.distributed._composable.fsdp import fully_shard
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                        torch.nn.Linear(256, 8)).to(dev)
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer)
            fully_shard(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(3):
                loss = model(torch.randn(32, 256, device=dev)).square().mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            torch.cuda.synchronize(dev)
            if not torch.isfinite(loss).item():
                failures.append("fsdp2: loss is not finite")
        except Exception as e:  # reported, not hidden
            failures.append(f"fsdp2 fully_shard: {type(e).__name__}: {e}")
    else:
        failures.append(f"fsdp2 skipped: torch {torch.__version__} < 2.4")
    dist.destroy_process_group()
    results.put((rank, failures))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True, help="build dir with bin/hsdpd and python/")
    args = ap.parse_args()
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        print("gpu_torch_e2e: torch is not installed")
        return 2
    if not torch.cuda.is_available():
        print("gpu_torch_e2e: no GPU visible to torch", torch.__version__)
        return 2
    sys.path.insert(0, os.path.join(args.build, "python"))
    os.environ["PYTHONPATH"] = os.path.join(args.build, "python")
    tmp = tempfile.mkdtemp(prefix="hsdp-gpu-e2e.")
    cfg = os.path.join(tmp, "node.yaml")
    with open(cfg, "w") as f:
        f.write("engine:\n  kind: nccl\n")
    sock = os.path.join(tmp, "hsdpd.sock")
    log = open(os.path.join(tmp, "hsdpd.log"), "w")
    daemon = subprocess.Popen([os.path.join(args.build, "bin", "hsdpd"), "--socket", sock,
                               "--node-config", cfg], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while not os.path.exists(sock) and time.time() < deadline and daemon.poll() is None:
        time.sleep(0.1)
    if not os.path.exists(sock):
        print("gpu_torch_e2e: hsdpd did not start:\n" + open(log.name).read())
        return 1
    os.environ["HSDPD_SOCKET"] = sock
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    if torch.cuda.device_count() >= 2:
        world = 2
        init = "file://" + os.path.join(tmp, "rendezvous")
        args = [(r, 2, init, results, r, "e2e") for r in range(2)]
    else:
        world = 1  # two jobs of one rank each, both on cuda:0
        args = [(0, 1, "file://" + os.path.join(tmp, f"rendezvous{k}"), results, 0, f"e2e-{k}")
                for k in range(2)]
    procs = [ctx.Process(target=worker, args=a) for a in args]
    for p in procs:
        p.start()
    failed = False
    for _ in range(len(procs)):
        try:
            rank, failures = results.get(timeout=300)
        except Exception:
            print("gpu_torch_e2e: a worker did not report within 300 s")
            failed = True
            break
        for f in failures:
            print(f"rank {rank}: {f}")
            failed = failed or not f.startswith("fsdp2 skipped")
    for p in procs:
        p.join(30)
        if p.is_alive():
            p.kill()
            failed = True
    daemon.send_signal(signal.SIGTERM)
    daemon.wait(30)
    print(f"gpu_torch_e2e: world {world}: {'FAILED' if failed else 'OK'} (daemon log {log.name})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
