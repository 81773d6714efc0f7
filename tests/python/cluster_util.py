"""A cluster of real hsdpd processes on loopback, for the cross-node Python tests.

Node 0 is the coordinator; every daemon has its own directory, socket and
node.yaml (free loopback ports, a shared token file, short heartbeats so a
lost node shows within about half a second). Trainers select their node's
daemon through HSDPD_SOCKET (`env_for`). `stop()` always ends every daemon
this object started (SIGTERM, then SIGKILL after 10 s).
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import time

from conftest import BUILD, Daemon
from localproc import free_ports  # noqa: F401 (the tests import it from here)
from waiting import eventually

HEARTBEAT_MS = 100
MISSED_HEARTBEATS = 5
FORM_TIMEOUT_S = 30.0


def node_yaml(coordinator, listen, nodes, node_rank, token_file, collective_ms,
              missed_heartbeats=MISSED_HEARTBEATS):
    return (f'cluster:\n  coordinator: "{coordinator}"\n  listen: "{listen}"\n'
            f"  nodes: {nodes}\n  node_rank: {node_rank}\n  token_file: \"{token_file}\"\n"
            f"  heartbeat_ms: {HEARTBEAT_MS}\n  missed_heartbeats: {missed_heartbeats}\n"
            f"  join_timeout_ms: {int(FORM_TIMEOUT_S * 1000)}\n"
            f"timeouts:\n  collective_ms: {collective_ms}\n"
            "engine:\n  threads: 2\n")


def nodes_view(socket_path):
    """`hsdpctl nodes --json` of one daemon as a dict, or None (exit 1 = degraded is fine)."""
    hsdpctl = os.path.join(BUILD, "bin", "hsdpctl")
    try:
        r = subprocess.run([hsdpctl, "--socket", socket_path, "--timeout", "2", "--json",
                            "nodes"], capture_output=True, text=True, timeout=10)
        return json.loads(r.stdout) if r.stdout.strip() else None
    except (subprocess.TimeoutExpired, ValueError):
        return None


def alive_nodes(view):
    return sum(1 for n in (view or {}).get("nodes", []) if n.get("state") == "alive")


def queued_ops(socket_path):
    """Operations the daemon holds right now (queued in groups or running), all
    jobs together: the QUEUED column of `hsdpctl top`; None if it did not answer."""
    hsdpctl = os.path.join(BUILD, "bin", "hsdpctl")
    try:
        r = subprocess.run([hsdpctl, "--socket", socket_path, "--timeout", "2", "top",
                            "--interval", "0.05"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return None
    if r.returncode != 0:
        return None
    # A job's row ends with QUEUED, then the slowest rank ("rank N (x s)" or "-").
    rows = re.findall(r"\s(\d+)\s+(?:rank \d+ \([^)]*\)|-)\s*$", r.stdout, re.MULTILINE)
    return sum(int(q) for q in rows)


class Cluster:
    """`nodes` hsdpd daemons forming one cluster on 127.0.0.1."""

    def __init__(self, nodes, collective_ms=60000, missed_heartbeats=MISSED_HEARTBEATS):
        binary = os.path.join(BUILD, "bin", "hsdpd")
        if not os.access(binary, os.X_OK):
            raise RuntimeError(f"{binary} not found: build first (HSDP_BUILD_DIR={BUILD})")
        self.nodes = nodes
        self.dir = tempfile.mkdtemp(prefix="hsdp-cluster-")
        self.daemons = []
        self.token_file = os.path.join(self.dir, "token")
        with open(os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
            f.write("python cluster test token\n")
        ports = free_ports(nodes)
        self.coordinator = f"127.0.0.1:{ports[0]}"
        try:
            for i in range(nodes):
                d = os.path.join(self.dir, f"node{i}")
                os.mkdir(d)
                cfg = os.path.join(d, "node.yaml")
                with open(cfg, "w") as f:
                    f.write(node_yaml(self.coordinator, f"127.0.0.1:{ports[i]}", nodes, i,
                                      self.token_file, collective_ms, missed_heartbeats))
                # Not waited for one by one: a member's socket opens only once it joined.
                self.daemons.append(Daemon(binary, d, ("--node-config", cfg, "--log-level",
                                                       "info"), wait=False))
            for d in self.daemons:
                d.wait_ready(FORM_TIMEOUT_S)
            self._wait_formed()
        except BaseException:
            self.stop()
            raise

    def _wait_formed(self):
        """Until every daemon sees all nodes alive (bounded)."""
        deadline = time.monotonic() + FORM_TIMEOUT_S
        for d in self.daemons:
            if not eventually(lambda: alive_nodes(nodes_view(d.socket)) == self.nodes,
                              max(0.0, deadline - time.monotonic()), interval=0.1):
                raise RuntimeError(f"cluster of {self.nodes} did not form in "
                                   f"{FORM_TIMEOUT_S} s:\n{self.logs()}")

    @property
    def sockets(self):
        return [d.socket for d in self.daemons]

    def env_for(self, placement):
        """Per-rank environments: rank r talks to the daemon of node placement[r]."""
        return [{"HSDPD_SOCKET": self.daemons[n].socket, "LOCAL_RANK":
                 str(placement[:r].count(n))} for r, n in enumerate(placement)]

    def logs(self, tail=4000):
        return "".join(f"--- node {i} log (tail) ---\n{d.log_text(tail)}\n"
                       for i, d in enumerate(self.daemons))

    def alive(self):
        return all(d.proc.poll() is None for d in self.daemons)

    def stop(self):
        for d in self.daemons:
            d.stop()
        self.daemons = []
        shutil.rmtree(self.dir, ignore_errors=True)
