#!/usr/bin/env python3
"""torchtitan's training step over hsdpd against Gloo (docs/frameworks.md, docs/benchmarks.md
§17). Same run, one daemon, the stock torchtitan trainer (tests/python/frameworks/titan_entry.py:
torchtitan.train plus the CPU device shim) launched exactly as a user does: `torchrun ...` for
Gloo and `python -m hsdp.run ...` (the same arguments, no code change) for hsdpd.

Configurations (torchtitan's llama3 layout, attention through SDPA on CPU):
  comm   communication-bound, benchmarks.md §7's shape: dim 1024, 4 layers, 1 sequence of
         16 tokens per rank;
  compute  compute-bound: the Llama debug model (dim 256, 6 layers), 4 sequences of 256
         tokens per rank.
Parallelisms: fsdp (data_parallel_shard 2), hsdp (replicate 2 x shard 2, 4 ranks), ddp
(replicate 2). torchtitan's FSDP2 and HSDP reduce-scatter with ReduceOp.PREMUL_SUM, which
Gloo refuses ("Cannot use ReduceOp.PREMUL_SUM with Gloo"): their Gloo baseline is the same
model's DDP step over Gloo with as many ranks (what a Gloo user can run: 2 for fsdp, 4 for
hsdp; before 2026-11-30 always 2), labelled as such; ddp compares like for like. With --buffers-off, "hsdpd, buffers off" sets HSDP_COMM_BUFFERS=0 (FSDP2's comm
buffers staged, where the backend honours it); with --overlap-off, "hsdpd, overlap off" sets
HSDP_FSDP2_OVERLAP=0 (every FSDP2 reduce-scatter waited in its hook, docs/torch-defaults.md).
--titan-arg (repeatable) adds a torchtitan option to every mode's command line, e.g.
--titan-arg=--training.disable_cuda_graphs (zero_grad(set_to_none=True)).

Step time: from rank 0's timestamps of torchtitan's per-step log lines (the interval between
step k-1's and step k's line), median over the steps after --warmup; every mode runs in the
same invocation, the order rotating every round; the figure is the median over rounds.

  PY=$(tools/scripts/frameworks_env.sh)
  $PY tools/bench/frameworks_bench.py --rounds 2 --steps 6 [--configs comm,compute]
      [--parallel fsdp,hsdp,ddp] [--json out.json]
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FW = os.path.join(ROOT, "tests", "python", "frameworks")
sys.path.insert(0, FW)

import fw_assets  # noqa: E402
import fw_launch  # noqa: E402
import titan_util  # noqa: E402

CONFIGS = {
    "comm": dict(config="wide_cpu", seq_len=16, batch=1),
    "compute": dict(config="debugmodel_cpu", seq_len=256, batch=4),
}
PARALLEL = {
    "fsdp": (2, dict(shard=2, replicate=1)),
    "hsdp": (4, dict(shard=2, replicate=2)),
    "ddp": (2, dict(shard=1, replicate=2)),
}
LINE_RE = re.compile(r"\[titan\] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*?step:\s*(\d+)\s+loss")


def step_times(output):
    stamps = {}
    for m in LINE_RE.finditer(output):
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        stamps.setdefault(int(m.group(2)), t)
    return {k: (stamps[k] - stamps[k - 1]) * 1000 for k in stamps if k - 1 in stamps}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2, help="steps not timed (step 1 has no "
                   "interval anyway)")
    p.add_argument("--configs", default="comm,compute")
    p.add_argument("--parallel", default="fsdp,hsdp,ddp")
    p.add_argument("--build", default=os.environ.get("HSDP_BUILD_DIR",
                                                     os.path.join(ROOT, "build")))
    p.add_argument("--buffers-off", action="store_true",
                   help="also run FSDP2/HSDP with HSDP_COMM_BUFFERS=0")
    p.add_argument("--overlap-off", action="store_true",
                   help="also run FSDP2 with HSDP_FSDP2_OVERLAP=0")
    p.add_argument("--titan-arg", action="append", default=[],
                   help="a torchtitan option for every mode (repeatable)")
    p.add_argument("--json")
    a = p.parse_args()
    os.environ["HSDP_BUILD_DIR"] = a.build
    Daemon, _ = fw_launch.daemon_class()  # tests/python/conftest.py's (reads HSDP_BUILD_DIR)

    tmp = tempfile.mkdtemp(prefix="hsdp-fwbench-")
    daemon = Daemon(os.path.join(a.build, "bin", "hsdpd"), tmp)
    results = {}
    try:
        assets = fw_assets.make_assets(os.path.join(tmp, "assets"))
        for cfg in a.configs.split(","):
            for par in a.parallel.split(","):
                nproc, pkw = PARALLEL[par]
                modes = [("hsdpd", {})]
                if a.buffers_off and par != "ddp":
                    modes.append(("hsdpd, buffers off", {"HSDP_COMM_BUFFERS": "0"}))
                if a.overlap_off and par != "ddp":
                    modes.append(("hsdpd, overlap off", {"HSDP_FSDP2_OVERLAP": "0"}))
                modes.append(("gloo", {}) if par == "ddp" else ("gloo (ddp)", {}))
                per_mode = {m: [] for m, _ in modes}
                for rnd in range(a.rounds):
                    order = modes[rnd % len(modes):] + modes[:rnd % len(modes)]
                    for mode, env in order:
                        backend = "gloo" if mode.startswith("gloo") else "hsdpd"
                        # Gloo's DDP baseline runs as many ranks as the mode it stands for.
                        run_nproc, run_pkw = (nproc, dict(shard=1, replicate=nproc)) \
                            if mode == "gloo (ddp)" else (nproc, pkw)
                        dump = os.path.join(tmp, "dump")
                        shutil.rmtree(dump, ignore_errors=True)
                        args = titan_util.titan_args(assets, dump, steps=a.steps,
                                                     **CONFIGS[cfg], **run_pkw,
                                                     extra=a.titan_arg)
                        out = fw_launch.launch(args, run_nproc, backend, daemon.socket,
                                               a.build, env=env)
                        times = [t for k, t in step_times(out).items() if k > a.warmup]
                        if not times:
                            raise SystemExit(f"no timed steps in {cfg}/{par}/{mode}:\n"
                                             f"{out[-3000:]}")
                        per_mode[mode].append(statistics.median(times))
                        print(f"# {cfg} {par} {mode} round {rnd}: "
                              f"{statistics.median(times):.0f} ms", flush=True)
                results[f"{cfg}/{par}"] = per_mode
    finally:
        daemon.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    load = os.getloadavg()[0]
    print(f"\nload average at the end: {load:.1f}"
          + (f"; torchtitan options added: {' '.join(a.titan_arg)}" if a.titan_arg else "")
          + "\n")
    print("| config | parallelism | mode | step ms, median (min–max over rounds) | vs Gloo |")
    print("|---|---|---|---|---|")
    for key, per_mode in results.items():
        cfg, par = key.split("/")
        base = [v for m, v in per_mode.items() if m.startswith("gloo")][0]
        base_med = statistics.median(base)
        for mode, vals in per_mode.items():
            med = statistics.median(vals)
            print(f"| {cfg} | {par} | {mode} | {med:.0f} ({min(vals):.0f}–{max(vals):.0f}) | "
                  f"{med / base_med:.2f}x |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"results": results, "load": load, "args": vars(a)}, f, indent=1)


if __name__ == "__main__":
    main()
