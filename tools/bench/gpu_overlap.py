#!/usr/bin/env python3
"""Compute/communication overlap on one GPU: does communication running in
another process (another CUDA context, as hsdpd's is) slow the trainer's
compute more than the same communication on a second stream of the
trainer's own context (in-process NCCL)?

    python3 tools/bench/gpu_overlap.py [--steps 30] [--dim 8192] [--comm-mb 256]
                                       [--side torch|hsdp] [--try-mps]

Cases, all in the same run (step = one bf16 matmul of dim x dim):
  alone      the matmul loop by itself (baseline)
  in-process the loop while all_reduce runs on a high-priority side stream of
             the same process (torch.distributed NCCL, world 1)
  separate   the loop while another process runs the same collectives
             (--side torch: torch.distributed; --side hsdp: build/bin/hsdp-gpu-bench,
             i.e. hsdpd's NCCL engine)
  separate+MPS (with --try-mps, when nvidia-cuda-mps-control exists and MPS is
             not already running): the separate case again under MPS.
Prints step times and ratios to "alone". Exit code 2 without a GPU.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

SIDE_SNIPPET = r"""
import os, sys, time, torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", init_method="file://" + sys.argv[1], rank=0, world_size=1)
x = torch.ones(int(float(sys.argv[2]) * (1 << 20)) // 4, device="cuda")
open(sys.argv[3], "w").close()            # ready
while not os.path.exists(sys.argv[4]):     # until told to stop
    for _ in range(10):
        dist.all_reduce(x)
    torch.cuda.synchronize()
dist.destroy_process_group()
"""


def matmul_loop(torch, steps, dim):
    a = torch.randn(dim, dim, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(dim, dim, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        a @ b
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / steps


def in_process(torch, dist, steps, dim, comm_mb, tmp):
    dist.init_process_group("nccl", init_method="file://" + os.path.join(tmp, "inproc"),
                            rank=0, world_size=1)
    x = torch.ones(int(comm_mb * (1 << 20)) // 4, device="cuda")
    side = torch.cuda.Stream(priority=-1)
    done = [0]
    with torch.cuda.stream(side):
        for _ in range(steps * 4):  # keep communication busy for the whole loop
            dist.all_reduce(x)
            done[0] += 1
    t = matmul_loop(torch, steps, dim)
    torch.cuda.synchronize()
    dist.destroy_process_group()
    return t


def separate(torch, steps, dim, comm_mb, tmp, side_kind, env=None):
    ready = os.path.join(tmp, "ready-%s" % time.time())
    stop = os.path.join(tmp, "stop-%s" % time.time())
    if side_kind == "hsdp":
        exe = os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin", "hsdp-gpu-bench")
        proc = subprocess.Popen([exe, "--sizes-mb", str(comm_mb), "--iters", "100000"],
                                stdout=subprocess.DEVNULL, env=env)
        time.sleep(5)  # communicator init
    else:
        proc = subprocess.Popen([sys.executable, "-c", SIDE_SNIPPET,
                                 os.path.join(tmp, "side-%s" % time.time()), str(comm_mb), ready, stop],
                                env=env)
        for _ in range(600):
            if os.path.exists(ready) or proc.poll() is not None:
                break
            time.sleep(0.1)
    try:
        return matmul_loop(torch, steps, dim)
    finally:
        open(stop, "w").close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def mps_running():
    # -x: the process name itself ("-f" also matches any shell whose command
    # line merely mentions the control program).
    return subprocess.call(["pgrep", "-x", "nvidia-cuda-mps"], stdout=subprocess.DEVNULL) == 0 or \
        subprocess.call(["pgrep", "-x", "nvidia-cuda-mps-control"], stdout=subprocess.DEVNULL) == 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--comm-mb", type=float, default=256)
    ap.add_argument("--side", choices=("torch", "hsdp"), default="torch")
    ap.add_argument("--try-mps", action="store_true")
    args = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        print("gpu_overlap: no torch")
        return 2
    if not torch.cuda.is_available():
        print("gpu_overlap: no GPU")
        return 2
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        alone = matmul_loop(torch, args.steps, args.dim)
        rows.append(("alone", alone))
        rows.append(("in-process", in_process(torch, dist, args.steps, args.dim, args.comm_mb, tmp)))
        rows.append(("separate(%s)" % args.side,
                     separate(torch, args.steps, args.dim, args.comm_mb, tmp, args.side)))
        mps = "running" if mps_running() else "not running"
        if args.try_mps and not mps_running() and shutil.which("nvidia-cuda-mps-control"):
            env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=os.path.join(tmp, "mps-pipe"),
                       CUDA_MPS_LOG_DIRECTORY=os.path.join(tmp, "mps-log"))
            os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"])
            os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
            if subprocess.call(["nvidia-cuda-mps-control", "-d"], env=env) == 0:
                try:
                    # This process already has a context outside MPS: measure
                    # both sides as fresh MPS clients.
                    code = ("import sys; sys.argv=['x','--steps','%d','--dim','%d','--comm-mb','%g','--side','%s'];"
                            "exec(open(%r).read())" % (args.steps, args.dim, args.comm_mb, args.side,
                                                       os.path.abspath(__file__)))
                    out = subprocess.run([sys.executable, "-c", code], env=env,
                                         capture_output=True, text=True, timeout=900).stdout
                    rows.append(("--- under MPS ---", None))
                    print(out)
                finally:
                    subprocess.run(["nvidia-cuda-mps-control"], input="quit\n", text=True, env=env)
                mps = "tried (see the block above)"
    print("overlap: %d steps of a %dx%d bf16 matmul, %g MB all_reduce on the side, MPS %s"
          % (args.steps, args.dim, args.dim, args.comm_mb, mps))
    for name, t in rows:
        if t is None:
            continue
        print("%-18s step %8.3f ms   x%.2f of alone" % (name, t * 1e3, t / alone))
    return 0


if __name__ == "__main__":
    sys.exit(main())
