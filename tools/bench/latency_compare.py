#!/usr/bin/env python3
"""hsdpd's collective latency against Open MPI and Gloo on this machine.

Runs hsdp-bench (which starts its own hsdpd from --bin), mpi-bench under
mpirun (Open MPI, shared memory: ob1 + vader) and gloo-bench (Gloo TCP on
127.0.0.1) for every op and rank count, --rounds times, rotating the order of
the three systems each round. All three use the same size semantics (total
buffer as in nccl-tests), float32 sum, and the same timing loop (barrier, then
time one collective on each rank; rank 0's times). It prints, per op, rank
count and size, the median over rounds of each system's p50 and p99 and
hsdpd's ratio to Open MPI (MPI p50 / hsdpd p50: > 1 means hsdpd is faster),
plus the load average before and after. A system whose binary is missing is
reported as missing; a run that fails or times out is reported as an error.

Reproduce (repository root; Open MPI: apt-get install openmpi-bin libopenmpi-dev):
  cd build && cmake . && ninja hsdpd hsdp-bench mpi-bench gloo-bench && cd ..
  python3 tools/bench/latency_compare.py                 # 3 rounds, 8 B .. 64 MiB, 2 and 4 ranks
  python3 tools/bench/latency_compare.py --rounds 1 --ops all_reduce --nranks 2 \\
      --max-bytes 64K --json /tmp/latency.json          # a quick look

--json FILE writes {"load_before", "load_after", "mpirun_args", "missing",
"errors", "rows" (every row of every run, with "system" and "round" added),
"summary" (the medians printed)}. Programs: tools/bench/hsdp_bench.cc,
mpi_bench.cc, gloo_bench.cc. Standard library only.
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import tempfile
import sys

OPS = ("all_reduce", "all_gather", "reduce_scatter", "barrier")
# hsdp-daemon: hsdpd with data_plane.small_op_bytes 0, every operation
# through the daemon (the path before the group arenas): the baseline.
SYSTEMS = ("hsdp", "hsdp-daemon", "mpi", "gloo")
NO_ARENA_YAML = "data_plane:\n  small_op_bytes: 0\n"
DEFAULT_MPIRUN_ARGS = ("--allow-run-as-root --oversubscribe --bind-to none "
                       "--mca pml ob1 --mca btl self,vader")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_size(text):
    """'8', '64K', '64M', '1G' -> bytes (raises ValueError)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1] if t and t[-1] in "KMG" else ""
    value = float(t[: len(t) - len(unit)])
    if value <= 0:
        raise ValueError(text)
    return int(value * units[unit])


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", default=os.path.join(REPO, "build", "bin"),
                   help="directory of hsdpd, hsdp-bench, mpi-bench, gloo-bench (default build/bin)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--nranks", default="2,4", help="comma-separated rank counts")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="subset of hsdp,hsdp-daemon,mpi,gloo")
    p.add_argument("--min-bytes", default="8")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--step-factor", default="2")
    p.add_argument("--iters", type=int, default=100,
                   help="timed iterations per size (p99 needs >= 100)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--timeout", type=float, default=600, help="seconds per benchmark process")
    p.add_argument("--mpirun", default="mpirun")
    p.add_argument("--mpirun-args", default=DEFAULT_MPIRUN_ARGS)
    p.add_argument("--json", metavar="FILE")
    a = p.parse_args(argv)
    a.ops = [o for o in a.ops.split(",") if o]
    a.systems = [s for s in a.systems.split(",") if s]
    bad = [o for o in a.ops if o not in OPS] + [s for s in a.systems if s not in SYSTEMS]
    if bad or not a.ops or not a.systems:
        p.error(f"unknown op or system {bad}; ops: {','.join(OPS)}; systems: {','.join(SYSTEMS)}")
    try:
        a.nranks = [int(n) for n in a.nranks.split(",") if n]
        lo, hi = parse_size(a.min_bytes), parse_size(a.max_bytes)
        step = float(a.step_factor)
    except ValueError as e:
        p.error(f"bad number: {e}")
    if not a.nranks or min(a.nranks) < 1 or max(a.nranks) > 64:
        p.error("--nranks: integers 1..64")
    if lo > hi or step <= 1:
        p.error("need --min-bytes <= --max-bytes and --step-factor > 1")
    a.min_bytes, a.max_bytes = str(lo), str(hi)  # as the programs parse them
    if a.rounds < 1 or a.iters < 1 or a.warmup < 0 or a.timeout <= 0:
        p.error("need --rounds >= 1, --iters >= 1, --warmup >= 0, --timeout > 0")
    return a


def missing_systems(a):
    """{system: why} for the systems that cannot run here."""
    need = {"hsdp": ["hsdp-bench", "hsdpd"], "hsdp-daemon": ["hsdp-bench", "hsdpd"],
            "mpi": ["mpi-bench"], "gloo": ["gloo-bench"]}
    why = {}
    for system in a.systems:
        absent = [b for b in need[system] if not os.access(os.path.join(a.bin, b), os.X_OK)]
        if absent:
            why[system] = "not built: " + ", ".join(os.path.join(a.bin, b) for b in absent)
    if "mpi" in a.systems and "mpi" not in why and shutil.which(a.mpirun) is None:
        why["mpi"] = f"{a.mpirun} not found (apt-get install openmpi-bin libopenmpi-dev)"
    return why


def command(a, system, op, nranks):
    common = ["--op", op, "--min-bytes", a.min_bytes, "--max-bytes", a.max_bytes,
              "--step-factor", a.step_factor, "--iters", str(a.iters),
              "--warmup", str(a.warmup), "--json"]
    if system == "hsdp":
        return [os.path.join(a.bin, "hsdp-bench"), "--nranks", str(nranks)] + common
    if system == "hsdp-daemon":
        return [os.path.join(a.bin, "hsdp-bench"), "--nranks", str(nranks),
                "--node-config", a.no_arena_config] + common
    if system == "gloo":
        return [os.path.join(a.bin, "gloo-bench"), "--nranks", str(nranks)] + common
    return ([a.mpirun] + shlex.split(a.mpirun_args) + ["-np", str(nranks),
            os.path.join(a.bin, "mpi-bench")] + common)


def run_one(cmd, timeout):
    """Runs cmd in its own process group (killed whole on timeout); (rows, error)."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
    except OSError as e:
        return [], f"cannot start: {e}"
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return [], f"timed out after {timeout:g}s"
    begin, end = out.find("["), out.rfind("]")
    rows = []
    if begin >= 0 and end > begin:
        try:
            rows = json.loads(out[begin:end + 1])
        except json.JSONDecodeError:
            pass
    if proc.returncode != 0 or not rows:
        tail = " | ".join(err.strip().splitlines()[-3:])
        return rows, f"exit {proc.returncode}: {tail or 'no JSON rows'}"
    return rows, None


def fmt(v, width=9):
    return f"{v:{width}.2f}" if isinstance(v, (int, float)) else f"{v:>{width}}"


def summarize(a, rows, missing, errors):
    """Median p50/p99 per (op, nranks, size, system); prints the tables."""
    by_key = {}
    for r in rows:
        key = (r["op"], r["nranks"], r["size"])
        by_key.setdefault(key, {}).setdefault(r["system"], []).append(r)
    summary = []
    for op in a.ops:
        for n in a.nranks:
            sizes = sorted(s for (o, k, s) in by_key if o == op and k == n)
            print(f"\n== {op}, {n} ranks: median over {a.rounds} round(s) of p50 / p99 (us); "
                  "mpi/hsdp = MPI p50 / hsdpd p50 (> 1: hsdpd faster)")
            header = f"{'size(B)':>10}"
            for s in a.systems:
                header += f" {s + ' p50':>9} {s + ' p99':>9}"
            print(header + f" {'mpi/hsdp':>9}")
            for s in a.systems:
                if s in missing:
                    print(f"  {s}: missing ({missing[s]})")
                elif errors.get((s, op, n)):
                    print(f"  {s}: error ({errors[(s, op, n)][-1]})")
            if not sizes:
                print("  (no results)")
            for size in sizes:
                line, entry = f"{size:>10}", {"op": op, "nranks": n, "size": size}
                for s in a.systems:
                    got = by_key[(op, n, size)].get(s, [])
                    p50s = [r["p50_us"] for r in got if r.get("p50_us") is not None]
                    p99s = [r["p99_us"] for r in got if r.get("p99_us") is not None]
                    p50 = statistics.median(p50s) if p50s else None
                    p99 = statistics.median(p99s) if p99s else None
                    entry[f"{s}_p50_us"], entry[f"{s}_p99_us"] = p50, p99
                    absent = "missing" if s in missing else "-"
                    line += f" {fmt(p50 if p50 is not None else absent)}"
                    line += f" {fmt(p99 if p99 is not None else ('n/a' if p50 else absent))}"
                hp, mp = entry.get("hsdp_p50_us"), entry.get("mpi_p50_us")
                ratio = mp / hp if hp and mp else None
                entry["mpi_over_hsdp_p50"] = ratio
                line += f" {fmt(ratio if ratio is not None else '-')}"
                wrong = sum(r.get("wrong", 0) for g in by_key[(op, n, size)].values() for r in g)
                if wrong:
                    line += f"  WRONG={wrong}"
                print(line)
                summary.append(entry)
    return summary


def main(argv):
    a = parse_args(argv)
    a.bin = os.path.abspath(a.bin)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="hsdp-no-arena.",
                                     delete=False) as f:
        f.write(NO_ARENA_YAML)
        a.no_arena_config = f.name
    missing = missing_systems(a)
    load_before = os.getloadavg()
    print(f"# latency_compare: load average before: {load_before[0]:.2f} {load_before[1]:.2f} "
          f"{load_before[2]:.2f} ({os.cpu_count()} CPUs)")
    print(f"# bin {a.bin}; mpirun args: {a.mpirun_args}")
    for s, why in missing.items():
        print(f"# {s}: missing ({why})")
    runnable = [s for s in a.systems if s not in missing]
    rows, errors = [], {}
    for rnd in range(a.rounds):
        order = runnable[rnd % len(runnable):] + runnable[:rnd % len(runnable)] if runnable else []
        for op in a.ops:
            for n in a.nranks:
                for system in order:
                    cmd = command(a, system, op, n)
                    print(f"# round {rnd + 1}/{a.rounds}: {' '.join(shlex.quote(c) for c in cmd)}",
                          file=sys.stderr, flush=True)
                    got, error = run_one(cmd, a.timeout)
                    if error:
                        print(f"#   {system} {op} {n} ranks: {error}", file=sys.stderr, flush=True)
                        errors.setdefault((system, op, n), []).append(error)
                    for r in got:
                        r.update(system=system, round=rnd + 1)
                    rows.extend(got)
    os.unlink(a.no_arena_config)
    summary = summarize(a, rows, missing, errors)
    load_after = os.getloadavg()
    print(f"\n# load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"load_before": load_before, "load_after": load_after,
                       "mpirun_args": a.mpirun_args, "missing": missing,
                       "errors": {" ".join(map(str, k)): v for k, v in errors.items()},
                       "rows": rows, "summary": summary}, f, indent=1)
        print(f"# wrote {a.json}")
    return 1 if errors or not rows else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
