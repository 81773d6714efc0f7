"""Multi-node mode of compare.py: hsdpd across K daemons vs torch Gloo, same run.

hsdpd: `hsdp-bench --nodes K --nranks L --json` per op (it starts K daemons
forming a cluster on loopback and K x L rank processes, rank r on node r // L).
Gloo: K x L torch.distributed processes (backend gloo, loopback, one thread
each) running the same ops on the same sizes.

Ops and sizes (nccl-tests conventions; `size` is the whole buffer):
  all_reduce      size bytes per rank; busbw factor 2(n-1)/n
  all_gather      output size bytes, size/n per rank; factor (n-1)/n. Gloo:
                  list all_gather (torch 1.13's Gloo has no all_gather_into_tensor)
  reduce_scatter  input size bytes per rank; factor (n-1)/n. torch 1.13's Gloo
                  has no reduce-scatter: the baseline is the faster (per size)
                  of all_to_all_single + a local sum of the n blocks (the
                  reduce-scatter's bytes) and all_reduce + this rank's block
  composite       the HSDP gradient op on a K x L mesh: reduce-scatter of size
                  bytes in the shard group (the L ranks of a node), then
                  all-reduce of the size/L shard in the replicate group (the K
                  ranks with the same local index). hsdpd: ONE submission
                  (ReduceScatterAllReduce). Gloo: the reduce-scatter emulated as
                  above (the faster per size) then all_reduce. Factor: the two
                  phases' bus bytes over size, (L-1)/L + 2(K-1)/(K L).

n = K x L. Times are means over --iters after --warmup, each iteration after a
barrier of the whole world, as hsdp-bench does.
"""
import json
import os
import statistics
import subprocess
import time

from gloo_world import mean_seconds, run_world, sizes_mb

OPS = ["all_reduce", "all_gather", "reduce_scatter", "composite"]
HSDP_OP = {"all_reduce": "all_reduce", "all_gather": "all_gather",
           "reduce_scatter": "reduce_scatter", "composite": "reduce_scatter_all_reduce"}


def bus_factor(op, nodes, per_node):
    n = nodes * per_node
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    s, r = per_node, nodes
    return (s - 1) / s + 2.0 * (r - 1) / (r * s)


def run_hsdp(build_dir, op, nodes, per_node, sizes, iters, warmup):
    cmd = [os.path.join(build_dir, "bin", "hsdp-bench"), "--op", HSDP_OP[op], "--nodes", str(nodes),
           "--nranks", str(per_node), "--min-bytes", str(sizes[0]), "--max-bytes", str(sizes[-1]),
           "--step-factor", "2", "--iters", str(iters), "--warmup", str(warmup), "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800).stdout
    return {r["size"]: r["time_us"] * 1e-6 for r in json.loads(out)}


def _gloo_worker(rank, init_file, queue, nodes, per_node, ops, sizes, iters, warmup):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    n = nodes * per_node
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=n)
    # Every rank creates every group, in the same order (torch requires it).
    shard_groups = [dist.new_group(list(range(k * per_node, (k + 1) * per_node)))
                    for k in range(nodes)]
    repl_groups = [dist.new_group(list(range(l, n, per_node))) for l in range(per_node)]
    shard = shard_groups[rank // per_node]
    repl = repl_groups[rank % per_node]

    # Outputs and staging are allocated once per size, outside the timed
    # loop (as hsdpd's buffers are): the baseline pays no page faults.
    def rs_all_to_all(t, blocks, out, width, group):
        # The reduce-scatter's bytes: block j of every rank to rank j, then sum.
        dist.all_to_all_single(blocks, t, group=group)
        torch.sum(blocks.view(width, -1), 0, out=out)
        return out

    def rs_all_reduce(t, out, width, group, rank_in_group):
        dist.all_reduce(t, group=group)
        out.copy_(t.view(width, -1)[rank_in_group])
        return out

    result = {}
    for op in ops:
        for size in sizes:
            elems = size // 4
            variants = {}
            if op == "all_reduce":
                t = torch.ones(elems)
                variants["all_reduce"] = lambda: dist.all_reduce(t)
            elif op == "all_gather":
                src = torch.ones(elems // n)
                outs = [torch.empty(elems // n) for _ in range(n)]
                variants["list all_gather"] = lambda: dist.all_gather(outs, src)
            elif op == "reduce_scatter":
                t = torch.ones(elems)
                blocks, out = torch.empty(elems), torch.empty(elems // n)
                variants["all_to_all+sum"] = lambda: rs_all_to_all(t, blocks, out, n, None)
                variants["all_reduce+chunk"] = lambda: rs_all_reduce(t, out, n, None, rank)
            else:  # composite
                t = torch.ones(elems)
                blocks, out = torch.empty(elems), torch.empty(elems // per_node)
                local = rank % per_node

                def comp(rs):
                    dist.all_reduce(rs(), group=repl)

                variants["all_to_all+sum, all_reduce"] = \
                    lambda: comp(lambda: rs_all_to_all(t, blocks, out, per_node, shard))
                variants["all_reduce+chunk, all_reduce"] = \
                    lambda: comp(lambda: rs_all_reduce(t, out, per_node, shard, local))
            best = None
            for name, fn in variants.items():
                mean = mean_seconds(fn, iters, warmup)
                if best is None or mean < best[0]:
                    best = (mean, name)
            result[(op, size)] = best
    if rank == 0:
        queue.put(result)
    dist.barrier()
    dist.destroy_process_group()


def run_gloo(ops, nodes, per_node, sizes, iters, warmup):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback, as the daemons
    return run_world(_gloo_worker, nodes * per_node,
                     (nodes, per_node, ops, sizes, iters, warmup), join_timeout=120)


def loadavg():
    return "%.2f %.2f %.2f" % os.getloadavg()


def fmt_range(values):
    return f"{min(values):.2f}-{max(values):.2f}"


def main(args, ops):
    ops = ops or OPS
    for op in ops:
        if op not in OPS:
            raise SystemExit(f"unknown op {op} (multi-node mode: {', '.join(OPS)})")
    nodes, per_node = args.nodes, args.nranks
    sizes = sizes_mb(args.min_mb, args.max_mb)
    hs = {(op, size): [] for op in ops for size in sizes}
    gl = {(op, size): [] for op in ops for size in sizes}
    gl_how = {}
    loads = []
    print(f"# hsdpd across {nodes} daemons x {per_node} ranks vs torch Gloo, world {nodes * per_node}, "
          f"loopback, float32 sum; {args.rounds} alternating rounds, {args.iters} iters "
          f"(+{args.warmup} warm-up); machine: {os.cpu_count()} cores", flush=True)
    for rnd in range(args.rounds):
        order = ["hsdpd", "gloo"] if rnd % 2 == 0 else ["gloo", "hsdpd"]
        for side in order:
            before = loadavg()
            t0 = time.time()
            if side == "hsdpd":
                for op in ops:
                    res = run_hsdp(args.build_dir, op, nodes, per_node, sizes, args.iters,
                                   args.warmup)
                    for size in sizes:
                        hs[(op, size)].append(res[size])
            else:
                res = run_gloo(ops, nodes, per_node, sizes, args.iters, args.warmup)
                for key, (t, how) in res.items():
                    gl[key].append(t)
                    gl_how.setdefault(key, set()).add(how)
            loads.append({"round": rnd, "side": side, "loadavg_before": before,
                          "loadavg_after": loadavg(), "seconds": round(time.time() - t0, 1)})
            print(f"# round {rnd + 1} {side}: {loads[-1]['seconds']} s, load average "
                  f"{before} -> {loads[-1]['loadavg_after']}", flush=True)
    print(f"{'op':<15} {'size':>6} {'hsdpd':>7} {'(range)':>12} {'gloo':>7} {'(range)':>12} "
          f"{'ratio':>7} {'worst':>7}")
    rows = []
    for op in ops:
        f = bus_factor(op, nodes, per_node)
        for size in sizes:
            hb = [size / t / 1e9 * f for t in hs[(op, size)]]
            gb = [size / t / 1e9 * f for t in gl[(op, size)]]
            per_round = [h / g for h, g in zip(hb, gb)]
            ratio = statistics.median(hb) / statistics.median(gb)
            row = {"op": op, "size": size, "hsdpd_busbw": hb, "gloo_busbw": gb,
                   "hsdpd_median": statistics.median(hb), "gloo_median": statistics.median(gb),
                   "ratio": ratio, "worst_round_ratio": min(per_round),
                   "gloo_variant": sorted(gl_how.get((op, size), []))}
            rows.append(row)
            print(f"{op:<15} {size >> 20:>4}MB {row['hsdpd_median']:>7.2f} {fmt_range(hb):>12} "
                  f"{row['gloo_median']:>7.2f} {fmt_range(gb):>12} {ratio:>6.1f}x "
                  f"{min(per_round):>6.1f}x")
    print("# busbw in GB/s: median over rounds (min-max); ratio = hsdpd median / gloo median; "
          "worst = lowest hsdpd/gloo of a single round")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"nodes": nodes, "per_node": per_node, "rows": rows, "load": loads}, fh,
                      indent=1)
    return 0
