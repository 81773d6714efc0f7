"""A plain `torchrun --nnodes 2` elastic job over hsdpd (through hsdprun) that
survives a worker restart (docs/torch-defaults.md).

Two nodes, each a network namespace of the project's netns topology
(tools/scripts/netns_topology.py: a bridge, a veth and an address per node)
holding its hsdpd and its torchrun agent; where namespaces cannot be made
(not root) the same two daemons run on loopback (cluster_util.Cluster). One
torchrun agent per node (`python -m hsdp.run --nnodes 2 --nproc-per-node 1
--rdzv-backend c10d --rdzv-endpoint <node 0>:port --local-addr <its node>
--max-restarts 3`), each agent's worker attached to its
node's daemon (HSDPD_SOCKET), so the world group spans both daemons. The
training script is stock: init_process_group() with no backend, a linear
model, gradients all-reduced (SUM, then halved), SGD, a checkpoint written by
rank 0 after every step and loaded at start (how elastic jobs resume).

In the first attempt, node 1's worker stops after step 2 (it announces its
pid and waits to be killed); the test SIGKILLs it. torchrun restarts the
group on both nodes (a new rendezvous round, new hsdpd sessions), the workers
resume from the checkpoint, and the job finishes: both agents exit 0, node
1's worker of the last round saw TORCHELASTIC_RESTART_COUNT >= 1, both
started from the checkpoint, their groups were hsdpd's, MASTER_ADDR was node
0's address, and the final parameters are bitwise those of the same training
done in this process without any restart.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap

import pytest

from cluster_util import Cluster, free_ports
from waiting import wait_until

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "scripts"))
import netns_topology  # noqa: E402

STEPS = 6
KILL_AFTER = 2  # node 1's worker waits to be killed after this many steps (attempt 0)

TRAIN = textwrap.dedent("""
    import json, os, sys, time
    import torch
    import torch.distributed as dist

    STEPS, KILL_AFTER, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    torch.set_num_threads(1)
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD

    def batch(step, r):
        g = torch.Generator().manual_seed(1000 * step + r)
        return torch.randn(16, 32, generator=g), torch.randn(16, 4, generator=g)

    torch.manual_seed(0)
    model = torch.nn.Linear(32, 4)
    ckpt = os.path.join(OUT, "ckpt.pt")
    start = 0
    if os.path.exists(ckpt):
        state = torch.load(ckpt)
        model.load_state_dict(state["model"])
        start = state["step"]
    for step in range(start, STEPS):
        x, y = batch(step, rank)
        model.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.1 * p.grad
        if rank == 0:
            tmp = ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "step": step + 1}, tmp)
            os.replace(tmp, ckpt)
        dist.barrier()
        if attempt == 0 and rank == 1 and step + 1 == KILL_AFTER:
            with open(os.path.join(OUT, "victim.json"), "w") as f:
                json.dump({"pid": os.getpid()}, f)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # until the test kills this process
                time.sleep(0.05)
            sys.exit("not killed")
    with open(os.path.join(OUT, f"done-{rank}.json"), "w") as f:
        json.dump({"attempt": attempt, "start": start, "name": pg.name(),
                   "master": os.environ.get("MASTER_ADDR"),
                   "ops": pg.hsdp_stats()["ops"] if hasattr(pg, "hsdp_stats") else None,
                   "params": {k: v.tolist() for k, v in model.state_dict().items()}}, f)
    dist.destroy_process_group()
""")


def _reference():
    """The same training in one process: per-rank gradients, summed, halved."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Linear(32, 4)
    for step in range(STEPS):
        grads = []
        for r in range(2):
            g = torch.Generator().manual_seed(1000 * step + r)
            x, y = torch.randn(16, 32, generator=g), torch.randn(16, 4, generator=g)
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for p, g0, g1 in zip(model.parameters(), grads[0], grads[1]):
                p -= 0.1 * ((g0 + g1) / 2)
    return {k: v.tolist() for k, v in model.state_dict().items()}


class NetnsCluster:
    """Two hsdpd, each in its own network namespace (tools/scripts/netns_topology.py: a
    bridge, one veth per node), node 0 the coordinator; `prefix` runs a command in a
    node's namespace. Unix sockets are paths, so the test reaches each daemon directly."""

    ADDRS = ("198.18.79.10", "198.18.79.11")
    PORT = 7070

    def __init__(self):
        from conftest import BUILD, _die_with_parent, _wait_for_socket
        from cluster_util import alive_nodes, node_yaml, nodes_view
        from waiting import eventually
        self.owner = os.getpid()
        self.topo = netns_topology.up(self.owner, [[a] for a in self.ADDRS], 24)
        self.dir = tempfile.mkdtemp(prefix="hsdp-netns-elastic-")
        self.sockets, self.procs, self._logs = [], [], []
        token = os.path.join(self.dir, "token")
        with open(os.open(token, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("elastic test token\n")
        coordinator = f"{self.ADDRS[0]}:{self.PORT}"
        try:
            for i, addr in enumerate(self.ADDRS):
                cfg = os.path.join(self.dir, f"node{i}.yaml")
                with open(cfg, "w") as f:
                    f.write(node_yaml(coordinator, f"{addr}:{self.PORT}", 2, i, token, 60000))
                sock = os.path.join(self.dir, f"node{i}.sock")
                log = open(os.path.join(self.dir, f"node{i}.log"), "w")
                self._logs.append(log)
                self.sockets.append(sock)
                self.procs.append(subprocess.Popen(
                    self.prefix(i) + [os.path.join(BUILD, "bin", "hsdpd"), "--socket", sock,
                                      "--node-config", cfg, "--log-level", "info"],
                    stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))
            for sock, proc in zip(self.sockets, self.procs):
                if not _wait_for_socket(sock, proc, 30):
                    raise RuntimeError(f"hsdpd in a namespace did not start:\n{self.logs()}")
            for sock in self.sockets:
                if not eventually(lambda: alive_nodes(nodes_view(sock)) == 2, 30, 0.1):
                    raise RuntimeError(f"the netns cluster did not form:\n{self.logs()}")
        except BaseException:
            self.stop()
            raise

    def prefix(self, node):
        return [netns_topology.IP, "netns", "exec", self.topo["nodes"][node]["namespace"]]

    def address(self, node):
        return self.ADDRS[node]

    def logs(self, tail=4000):
        out = []
        for i in range(len(self.sockets)):
            path = os.path.join(self.dir, f"node{i}.log")
            with open(path, errors="replace") as f:
                out.append(f"--- node {i} log (tail) ---\n{f.read()[-tail:]}")
        return "\n".join(out)

    def alive(self):
        return all(p.poll() is None for p in self.procs)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for log in self._logs:
            log.close()
        netns_topology.down(self.owner)
        shutil.rmtree(self.dir, ignore_errors=True)


class LoopbackCluster(Cluster):
    """cluster_util.Cluster with the interface of NetnsCluster (everything on 127.0.0.1)."""

    def prefix(self, node):
        return []

    def address(self, node):
        return "127.0.0.1"


@pytest.fixture
def cluster():
    """The netns cluster where namespaces can be made here (root), else the same two
    daemons on loopback."""
    why = netns_topology.probe()
    c = NetnsCluster() if why is None else LoopbackCluster(2)
    c.kind = "netns" if why is None else f"loopback ({why})"
    try:
        yield c
    finally:
        c.stop()


def test_two_node_elastic_job_survives_a_worker_restart(cluster, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    out = tmp_path / "out"
    out.mkdir()
    port = free_ports(1)[0]
    agents, logs = [], []
    for node in range(2):
        env = dict(os.environ, HSDPD_SOCKET=cluster.sockets[node])
        for k in ("HSDP_DEFAULT_BACKEND", "HSDP_REPLACE_GLOO", "HSDP_COMM_BUFFERS"):
            env.pop(k, None)
        log = open(tmp_path / f"agent{node}.log", "w")
        logs.append(log)
        cmd = cluster.prefix(node) + [
               sys.executable, "-m", "hsdp.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{cluster.address(0)}:{port}",
               "--rdzv-id", "elastic-test", "--local-addr", cluster.address(node),
               "--rdzv-conf", f"is_host={'true' if node == 0 else 'false'}",
               "--max-restarts", "3", "--monitor-interval", "0.2",
               str(script), str(STEPS), str(KILL_AFTER), str(out)]
        agents.append(subprocess.Popen(cmd, env=env, cwd=str(tmp_path), stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True))

    def agent_logs():
        for f in logs:
            f.flush()
        return "\n".join(f"--- agent {i} ---\n{(tmp_path / f'agent{i}.log').read_text()[-5000:]}"
                         for i in range(2)) + "\n" + cluster.logs()

    try:
        victim = out / "victim.json"
        wait_until(lambda: victim.exists() and victim.read_text().strip(), 240,
                   lambda: "the first attempt never reached the kill point:\n" + agent_logs())
        os.kill(json.loads(victim.read_text())["pid"], signal.SIGKILL)
        for i, a in enumerate(agents):
            try:
                rc = a.wait(300)
            except subprocess.TimeoutExpired:
                pytest.fail(f"agent {i} did not finish ({cluster.kind}):\n{agent_logs()}")
            assert rc == 0, f"agent {i} exited {rc}:\n{agent_logs()}"
    finally:
        for a in agents:
            if a.poll() is None:
                os.killpg(a.pid, signal.SIGKILL)
                a.wait()
        for f in logs:
            f.close()
    assert cluster.alive(), cluster.logs()
    done = [json.loads((out / f"done-{r}.json").read_text()) for r in range(2)]
    ref = _reference()
    # Node 1's agent restarted its failed worker (its restart count); node 0's agent
    # restarted its healthy one for the new rendezvous round (no failure of its own, so
    # its count stays 0): both workers of the last round resumed from the checkpoint.
    assert done[1]["attempt"] >= 1, done[1]
    for r, d in enumerate(done):
        assert d["start"] >= KILL_AFTER, d
        assert d["name"] == "hsdpd" and d["ops"] > 0, d
        assert d["master"] == cluster.address(0), (cluster.kind, d["master"])
        assert d["params"] == ref, f"rank {r}: parameters differ from the reference"
