#!/usr/bin/env python3
"""Plots and tabulates tools/bench/shaped_net.py results.

    PY=$(tools/scripts/bench_env.sh)    # matplotlib, pinned (build/bench-venv)
    $PY tools/bench/plot_shaped.py OUT.png RESULT.json... [--markdown]

The PNG: one row per link rate, one column per op, bus bandwidth (GB/s, log)
against size (log) for hsdpd (solid) and torch Gloo (dashed), one colour per
nodes x ranks layout, the link rate as a dotted line. --markdown prints the
tables of docs/benchmarks.md (busbw, ratio, time at the smallest size, the
bytes each node sent per op against the model).
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shaped_net import bytes_model  # noqa: E402 - the model, as the script states it


def size_label(s):
    return f"{s >> 20} MB" if s >= 1 << 20 else f"{s >> 10} KB"


def rate_gbytes(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, m in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * m / 8 / 1e9
    raise ValueError(rate)


def load(paths):
    return [json.load(open(p)) for p in paths]


def plot(out, results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rates = sorted({r["rate"] for r in results}, key=rate_gbytes, reverse=True)
    ops = []
    for r in results:
        for row in r["rows"]:
            if row["op"] not in ops:
                ops.append(row["op"])
    layouts = sorted({(r["nodes"], r["per_node"]) for r in results})
    colours = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    fig, axes = plt.subplots(len(rates), len(ops), figsize=(4.2 * len(ops), 3.6 * len(rates)),
                             squeeze=False, sharex=True)
    for i, rate in enumerate(rates):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            for r in results:
                if r["rate"] != rate:
                    continue
                c = colours[layouts.index((r["nodes"], r["per_node"])) % len(colours)]
                rows = [x for x in r["rows"] if x["op"] == op]
                xs = [x["size"] for x in rows]
                lay = f"{r['nodes']}x{r['per_node']}"
                ax.plot(xs, [x["hsdpd_busbw"] for x in rows], "-o", color=c, ms=3,
                        label=f"hsdpd {lay}")
                ax.plot(xs, [x["gloo_busbw"] for x in rows], "--s", color=c, ms=3,
                        label=f"Gloo {lay}")
            ax.axhline(rate_gbytes(rate), color="grey", ls=":", lw=1,
                       label="link rate (each way)")
            ax.set_xscale("log", base=2)
            ticks = sorted({x["size"] for r in results for x in r["rows"]})
            ax.set_xticks(ticks)
            ax.set_xticklabels([size_label(t).replace(" ", "") for t in ticks], fontsize=7)
            ax.set_yscale("log")
            ax.set_title(f"{op}, links {rate}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if j == 0:
                ax.set_ylabel("bus bandwidth (GB/s)")
            if i == len(rates) - 1:
                ax.set_xlabel("size")
            if i == 0 and j == 0:
                ax.legend(fontsize=7)
    fig.suptitle("hsdpd vs torch Gloo across nodes, shaped links (tbf), same run, alternating")
    fig.tight_layout()
    fig.savefig(out, dpi=90)


def markdown(results):
    for r in results:
        k, l = r["nodes"], r["per_node"]
        print(f"\n**{k} nodes x {l} ranks, links {r['rate']}** (busbw GB/s, median of "
              f"{len(r['rows'][0]['hsdpd_s'])} rounds; ratio = Gloo time / hsdpd time)\n")
        sizes = sorted({x["size"] for x in r["rows"]})
        ops = []
        for row in r["rows"]:
            if row["op"] not in ops:
                ops.append(row["op"])
        print("| op | " + " | ".join(size_label(s) for s in sizes) + " |")
        print("| --- |" + " ---: |" * len(sizes))
        for op in ops:
            cells = []
            for s in sizes:
                x = next(x for x in r["rows"] if x["op"] == op and x["size"] == s)
                cells.append(f"{x['hsdpd_busbw']:.3f} / {x['gloo_busbw']:.3f} "
                             f"(**{x['ratio']:.2f}x**)")
            print(f"| {op} | " + " | ".join(cells) + " |")
        s0 = sizes[0]
        print(f"\nTime per op at {size_label(s0)} (ms, median), hsdpd / Gloo: " + "; ".join(
            f"{x['op']} {statistics.median(x['hsdpd_s']) * 1e3:.2f} / "
            f"{statistics.median(x['gloo_s']) * 1e3:.2f}"
            for x in r["rows"] if x["size"] == s0))
        print(f"\nBytes each node sent per op at {size_label(r['wire'][0]['size'])} "
              "(eth0 tx_bytes, all nodes averaged), in units of size:\n")
        print("| op | hsdpd measured | hsdpd model | Gloo measured | Gloo model | Gloo/hsdpd "
              "bytes | busbw ratio at that size |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for op in ops:
            h = next(w for w in r["wire"] if w["op"] == op and w["side"] == "hsdpd")
            g = next(w for w in r["wire"] if w["op"] == op and w["side"] == "gloo")
            hm = sum(h["measured_per_node"]) / len(h["measured_per_node"]) / h["size"]
            gm = sum(g["measured_per_node"]) / len(g["measured_per_node"]) / g["size"]
            ratio = next(x["ratio"] for x in r["rows"] if x["op"] == op and x["size"] == h["size"])
            hmod = bytes_model("hsdpd", op, h["size"], k, l) / h["size"]
            gmod = bytes_model("gloo", op, g["size"], k, l) / g["size"]
            print(f"| {op} | {hm:.3f} | {hmod:.3f} | {gm:.3f} | {gmod:.3f} | {gm / hm:.2f} | "
                  f"{ratio:.2f}x |")


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    results = load(args[1:])
    plot(args[0], results)
    if "--markdown" in argv:
        markdown(results)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
