#!/usr/bin/python3
"""hsdpd vs torch Gloo across nodes whose links are shaped with tc.

    sudo tools/bench/shaped_net.py --nodes 2 --nranks 2 --rate 1gbit [--delay-us 50]
        [--ops all_reduce,all_gather,reduce_scatter,composite] [--min-bytes 64K]
        [--max-bytes 256M] [--rounds 2] [--bytes-size 16M] [--json FILE]
        [--build-dir build] [--python PY]

Each node is a network namespace (tools/scripts/netns_topology.py; addresses
198.18.79.10+i/24) joined to the others through a bridge; every node's link
is shaped in both directions: its eth0 egress (what it sends) by netem
(--delay-us one-way) with a tbf child at --rate, the bridge port's egress
(what it receives) by a tbf at --rate. Traffic inside a node is not shaped.
--delay-us 0: tbf alone (kernels without sch_netem, like the 2-core VMs
of docs/benchmarks.md: "Specified qdisc kind is unknown").

- hsdpd: one daemon per node in its namespace (cluster on the node
  addresses, Gloo on data_address = the node address), `hsdp-bench
  --sockets` with --nranks ranks per node (unix sockets and shared memory
  cross namespaces; only the daemons' traffic crosses the links).
- Gloo: nodes x nranks torch.distributed processes (backend gloo, torch of
  --python, one thread each), the ranks of node i in namespace i
  (GLOO_SOCKET_IFNAME=eth0), native all_reduce, all_gather_into_tensor,
  reduce_scatter_tensor; the composite is reduce_scatter_tensor in the shard
  group (the ranks of a node) then all_reduce of the shard in the replicate
  group (one rank per node).

The two sides alternate round by round (hsdpd first in even rounds). Sizes go
by 4x; iterations per size shrink with the size (ITERS). Bus bandwidth uses
the nccl-tests factors of compare_cluster.py. Then, at --bytes-size, each
side runs every op again while the nodes' eth0 tx_bytes are read before and
after: bytes per op per node next to the model's (bytes_model below).
Needs root; namespaces and daemons are removed on every exit.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "scripts"))
sys.path.insert(0, HERE)
import netns_topology  # noqa: E402
from compare_cluster import bus_factor, HSDP_OP, OPS  # noqa: E402
from gloo_world import mean_seconds  # noqa: E402

IP = netns_topology.IP
# (largest size, iterations, warm-up) -- the first row whose size fits.
ITERS = [(1 << 20, 20, 3), (16 << 20, 5, 1), (64 << 20, 3, 1), (1 << 40, 2, 1)]


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def iters_of(size):
    for top, it, wu in ITERS:
        if size <= top:
            return it, wu
    raise AssertionError


def bytes_model(side, op, size, k, l):
    """Bytes one node sends to the other nodes per op (large sizes).
    hsdpd: the node's partial reduce-scattered among the K daemons, the
    results all-gathered (all-reduce 2(K-1)/K S), the node's S/K of an
    all-gather or its partial blocks of a reduce-scatter ((K-1)/K S), the
    composite's shard group local and its L shards all-reduced across nodes
    (2(K-1)/K S). Gloo: rings over the n = K L ranks in rank order, one edge
    per node crossing to the next node (all-reduce 2(n-1)/n S, all-gather
    (n-1)/n S); torch's Gloo reduce_scatter_tensor all-reduces the whole
    input and keeps its block (2(n-1)/n S, as the interface counters show:
    not the (n-1)/n of a ring reduce-scatter); the composite's shard group
    local and its replicate all-reduce a ring of K ranks per local index
    (2(K-1)/K S)."""
    n = k * l
    if side == "hsdpd":
        f = {"all_reduce": 2 * (k - 1) / k, "all_gather": (k - 1) / k,
             "reduce_scatter": (k - 1) / k, "composite": 2 * (k - 1) / k}[op]
    else:
        f = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
             "reduce_scatter": 2 * (n - 1) / n, "composite": 2 * (k - 1) / k}[op]
    return f * size


class Bench:
    def __init__(self, args):
        self.a = args
        self.owner = os.getpid()
        self.tmp = tempfile.mkdtemp(prefix="hsdp-shaped-")
        self.daemons = []
        self.topo = None
        self.addrs = [f"198.18.79.{10 + i}" for i in range(args.nodes)]

    # --- network -------------------------------------------------------------
    def up(self):
        self.topo = netns_topology.up(self.owner, [[a] for a in self.addrs], 24)
        rate = self.a.rate
        burst = max(256 << 10, int(_rate_bps(rate) / 8 / 1000))  # >= 1 ms of traffic
        for node in self.topo["nodes"]:
            ns, port = node["namespace"], node["switch_port"]
            sh = [IP, "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0"]
            if self.a.delay_us:
                _run(sh + ["root", "handle", "1:", "netem", "delay", f"{self.a.delay_us}us",
                           "limit", "100000"])
                _run(sh + ["parent", "1:1", "handle", "10:", "tbf", "rate", rate, "burst",
                           str(burst), "latency", "20ms"])
            else:
                _run(sh + ["root", "tbf", "rate", rate, "burst", str(burst), "latency", "20ms"])
            _run([IP, "netns", "exec", self.topo["switch"], "tc", "qdisc", "add", "dev", port,
                  "root", "tbf", "rate", rate, "burst", str(burst), "latency", "20ms"])

    def tx_bytes(self):
        out = []
        for node in self.topo["nodes"]:
            r = _run([IP, "-n", node["namespace"], "-s", "-j", "link", "show", "eth0"])
            out.append(json.loads(r)[0]["stats64"]["tx"]["bytes"])
        return out

    def down(self):
        for p in self.daemons:
            if p.poll() is None:
                p.terminate()
        for p in self.daemons:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        netns_topology.down(self.owner)
        subprocess.run(["rm", "-rf", self.tmp])

    # --- hsdpd ---------------------------------------------------------------
    def start_daemons(self):
        token = os.path.join(self.tmp, "token")
        fd = os.open(token, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, os.urandom(16).hex().encode() + b"\n")
        os.close(fd)
        self.sockets = []
        for i, node in enumerate(self.topo["nodes"]):
            d = os.path.join(self.tmp, f"node{i}")
            os.makedirs(d)
            sock = os.path.join(d, "hsdpd.sock")
            cfg = os.path.join(d, "node.yaml")
            with open(cfg, "w") as f:
                f.write(f"node: {{name: node{i}, socket: {sock}}}\n"
                        f"engine: {{kind: cpu}}\n"
                        f"cluster:\n  coordinator: \"{self.addrs[0]}:7070\"\n"
                        f"  listen: \"{self.addrs[i]}:7070\"\n  nodes: {len(self.addrs)}\n"
                        f"  node_rank: {i}\n  data_address: {self.addrs[i]}\n"
                        f"  token_file: {token}\n  heartbeat_ms: 500\n"
                        f"  missed_heartbeats: 20\n  join_timeout_ms: 30000\n")
            log = open(os.path.join(d, "hsdpd.log"), "wb")
            self.daemons.append(subprocess.Popen(
                [IP, "netns", "exec", node["namespace"],
                 os.path.join(self.a.build_dir, "bin", "hsdpd"), "--node-config", cfg],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            self.sockets.append(sock)
        deadline = time.monotonic() + 60
        for sock in self.sockets:
            while True:
                r = subprocess.run([os.path.join(self.a.build_dir, "bin", "hsdpctl"), "--socket",
                                    sock, "health"], capture_output=True)
                if r.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"daemon {sock} not healthy: {self.daemon_logs()}")
                time.sleep(0.3)

    def daemon_logs(self):
        out = ""
        for i in range(len(self.addrs)):
            with open(os.path.join(self.tmp, f"node{i}", "hsdpd.log"), errors="replace") as f:
                out += f"--- node{i}\n" + "".join(f.readlines()[-10:])
        return out

    def run_hsdp(self, op, sizes):
        """{size: seconds per op}."""
        res = {}
        groups = {}
        for s in sizes:
            groups.setdefault(iters_of(s), []).append(s)
        for (it, wu), ss in groups.items():
            cmd = [os.path.join(self.a.build_dir, "bin", "hsdp-bench"), "--op", HSDP_OP[op],
                   "--sockets", ",".join(self.sockets), "--nranks", str(self.a.nranks),
                   "--min-bytes", str(min(ss)), "--max-bytes", str(max(ss)), "--step-factor",
                   "4", "--iters", str(it), "--warmup", str(wu), "--json"]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
            if r.returncode != 0:
                raise RuntimeError(f"hsdp-bench failed: {r.stderr[-2000:]}\n{self.daemon_logs()}")
            for row in json.loads(r.stdout):
                res[row["size"]] = row["time_us"] * 1e-6
        return res

    # --- Gloo ----------------------------------------------------------------
    def run_gloo(self, ops, sizes):
        """{(op, size): seconds per op}."""
        n = self.a.nodes * self.a.nranks
        init = os.path.join(self.tmp, f"gloo-init-{time.monotonic_ns()}")
        out = os.path.join(self.tmp, "gloo.json")
        procs = []
        for r in range(n):
            ns = self.topo["nodes"][r // self.a.nranks]["namespace"]
            env = dict(os.environ, GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
            procs.append(subprocess.Popen(
                [IP, "netns", "exec", ns, self.a.python, os.path.abspath(__file__),
                 "gloo-worker", json.dumps({"rank": r, "nodes": self.a.nodes,
                                            "per_node": self.a.nranks, "init": init,
                                            "ops": ops, "sizes": sizes, "out": out})],
                env=env, start_new_session=True))
        deadline = time.monotonic() + 3600
        for p in procs:
            p.wait(max(1, deadline - time.monotonic()))
        if any(p.returncode != 0 for p in procs):
            raise RuntimeError(f"gloo workers failed: {[p.returncode for p in procs]}")
        with open(out) as f:
            return {(o, int(s)): t for o, s, t in json.load(f)}


def gloo_worker(spec):
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank, k, l = spec["rank"], spec["nodes"], spec["per_node"]
    n = k * l
    dist.init_process_group("gloo", init_method="file://" + spec["init"], rank=rank,
                            world_size=n)
    shard_groups = [dist.new_group(list(range(i * l, (i + 1) * l))) for i in range(k)]
    repl_groups = [dist.new_group(list(range(j, n, l))) for j in range(l)]
    shard, repl = shard_groups[rank // l], repl_groups[rank % l]
    out = []
    for op in spec["ops"]:
        for size in spec["sizes"]:
            e = size // 4
            if op == "all_reduce":
                t = torch.ones(e)
                fn = lambda: dist.all_reduce(t)  # noqa: E731
            elif op == "all_gather":
                src, dst = torch.ones(e // n), torch.empty(e)
                fn = lambda: dist.all_gather_into_tensor(dst, src)  # noqa: E731
            elif op == "reduce_scatter":
                src, dst = torch.ones(e), torch.empty(e // n)
                fn = lambda: dist.reduce_scatter_tensor(dst, src)  # noqa: E731
            else:
                src, dst = torch.ones(e), torch.empty(e // l)

                def fn():
                    dist.reduce_scatter_tensor(dst, src, group=shard)
                    dist.all_reduce(dst, group=repl)
            it, wu = iters_of(size)
            out.append((op, size, mean_seconds(fn, it, wu)))
    if rank == 0:
        with open(spec["out"], "w") as f:
            json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


def _rate_bps(rate):
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, m in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * m
    raise ValueError(f"rate {rate}: use kbit, mbit or gbit")


def _run(argv):
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--nranks", type=int, default=2)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay-us", type=int, default=50)
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--min-bytes", default="64K")
    ap.add_argument("--max-bytes", default="256M")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bytes-size", default="16M")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--python", default=os.environ.get("HSDP_PYTHON", sys.executable))
    ap.add_argument("--json")
    a = ap.parse_args()
    a.build_dir = os.path.abspath(a.build_dir)
    ops = a.ops.split(",")
    sizes = []
    s = parse_size(a.min_bytes)
    while s <= parse_size(a.max_bytes):
        sizes.append(s)
        s *= 4
    b = Bench(a)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    k, l = a.nodes, a.nranks
    hs = {(o, s): [] for o in ops for s in sizes}
    gl = {(o, s): [] for o in ops for s in sizes}
    rounds = []
    try:
        b.up()
        b.start_daemons()
        print(f"# {k} nodes x {l} ranks, links {a.rate} + {a.delay_us} us each way, "
              f"{a.rounds} alternating rounds", flush=True)
        for rnd in range(a.rounds):
            for side in (["hsdpd", "gloo"] if rnd % 2 == 0 else ["gloo", "hsdpd"]):
                t0 = time.time()
                la = os.getloadavg()[0]
                if side == "hsdpd":
                    for o in ops:
                        for size, t in b.run_hsdp(o, sizes).items():
                            hs[(o, size)].append(t)
                else:
                    for key, t in b.run_gloo(ops, sizes).items():
                        gl[key].append(t)
                rounds.append({"round": rnd, "side": side, "seconds": round(time.time() - t0, 1),
                               "loadavg_before": la, "loadavg_after": os.getloadavg()[0]})
                print(f"# round {rnd + 1} {side}: {rounds[-1]['seconds']} s", flush=True)
        # Bytes on the wire at one size: eth0 tx_bytes of every node around one run.
        bsize = parse_size(a.bytes_size)
        it, wu = iters_of(bsize)
        wire = []
        for o in ops:
            for side in ("hsdpd", "gloo"):
                before = b.tx_bytes()
                if side == "hsdpd":
                    b.run_hsdp(o, [bsize])
                else:
                    b.run_gloo([o], [bsize])
                after = b.tx_bytes()
                per_op = [(y - x) / (it + wu) for x, y in zip(before, after)]
                wire.append({"op": o, "side": side, "size": bsize,
                             "measured_per_node": per_op,
                             "model_per_node": bytes_model(side, o, bsize, k, l)})
    finally:
        b.down()
    rows = []
    print(f"# {k} nodes x {l} ranks, links {a.rate} + {a.delay_us} us each way")
    print(f"{'op':<15} {'size':>8} {'hsdpd GB/s':>10} {'gloo GB/s':>10} {'ratio':>6} "
          f"{'hsdpd us':>10} {'gloo us':>10}")
    for o in ops:
        f = bus_factor(o, k, l)
        for size in sizes:
            th, tg = statistics.median(hs[(o, size)]), statistics.median(gl[(o, size)])
            row = {"op": o, "size": size, "hsdpd_s": hs[(o, size)], "gloo_s": gl[(o, size)],
                   "hsdpd_busbw": size / th / 1e9 * f, "gloo_busbw": size / tg / 1e9 * f,
                   "ratio": tg / th}
            rows.append(row)
            sz = f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"
            print(f"{o:<15} {sz:>8} {row['hsdpd_busbw']:>10.3f} {row['gloo_busbw']:>10.3f} "
                  f"{row['ratio']:>5.2f}x {th * 1e6:>10.0f} {tg * 1e6:>10.0f}")
    print("# bytes each node sent per op (eth0 tx, incl. headers and acks) vs the model:")
    for w in wire:
        m = statistics.mean(w["measured_per_node"])
        print(f"{w['op']:<15} {w['side']:<6} measured {m / w['size']:.3f} x size, "
              f"model {w['model_per_node'] / w['size']:.3f} x size")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"nodes": k, "per_node": l, "rate": a.rate, "delay_us": a.delay_us,
                       "rows": rows, "wire": wire, "rounds": rounds,
                       "iters": ITERS}, fh, indent=1)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "gloo-worker":
        gloo_worker(json.loads(sys.argv[2]))
        sys.exit(0)
    sys.exit(main())
