"""The chaos run's nodes: one hsdpd per node, each with its own directory,
socket, node.yaml and log (kept across restarts: a restarted daemon appends
to it). On loopback by default; with a Net (--netns, net.py) node i's daemon
runs in node i's namespace on its address (Gloo's data plane there too).
The store: embedded (node 0 the coordinator) or etcd (an Etcd, etcd.py: the
daemons meet in etcd, cluster.insecure on these private addresses).

Node.kill() is SIGKILL, Node.drain() is `hsdpctl drain` (the daemon exits 0
as for an upgrade), Node.start() starts it again with the same
configuration. Resource snapshots (fds, memfds, threads, RSS) come from
/proc: the OS's own accounting.
"""
import json
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from localproc import accepts, die_with_parent, free_ports  # noqa: E402
from localproc import stop as localproc_stop  # noqa: E402
from localproc import eventually as wait_for  # noqa: E402


def snapshot(pid):
    """{fds, memfds, threads, rss_kib, thread_names: {comm: count}} of a live
    process, from /proc; None if it is gone."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        memfds = 0
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:"):
                    memfds += 1
            except OSError:
                pass
        names = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    comm = f.read().strip()
                names[comm] = names.get(comm, 0) + 1
            except OSError:
                pass
        threads = sum(names.values())
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return {"fds": len(fds), "memfds": memfds, "threads": threads, "rss_kib": rss,
                "thread_names": names}
    except (OSError, StopIteration):
        return None


class Node:
    def __init__(self, build, root, index, cluster_yaml, collective_ms, prefix=(), spawn=None,
                 hsdpd=None):
        self.build = build
        self.index = index
        self.prefix = list(prefix)  # runs a command in the node's namespace ([]: the host's)
        # spawn(argv, log_path) -> a Popen-like (docker.py: a container in the
        # node's pod); None: a process of ours, in `prefix`.
        self.spawn = spawn
        self.hsdpd = hsdpd or os.path.join(build, "bin", "hsdpd")
        self.dir = os.path.join(root, f"node{index}")
        os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "hsdpd.sock")
        self.log_path = os.path.join(self.dir, "hsdpd.log")
        self.config = os.path.join(self.dir, "node.yaml")
        with open(self.config, "w") as f:
            f.write(f"cluster:\n{cluster_yaml}"
                    f"timeouts:\n  collective_ms: {collective_ms}\n  shutdown_grace_ms: 500\n"
                    "engine:\n  threads: 1\n")
        self.proc = None
        self.starts = 0

    def start(self):
        if os.path.exists(self.socket):
            os.unlink(self.socket)  # a killed daemon's socket file
        argv = [self.hsdpd, "--node-config", self.config, "--socket", self.socket,
                "--log-level", "info"]
        logf = open(self.log_path, "a")
        logf.write(f"=== chaos: start {self.starts + 1} at {time.time():.3f}\n")
        logf.flush()
        if self.spawn is not None:
            logf.close()
            self.proc = self.spawn(argv, self.log_path)
        else:
            # `ip netns exec` execs the daemon (no fork): proc.pid is hsdpd's own.
            self.proc = subprocess.Popen(self.prefix + argv, stdout=logf,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=die_with_parent)
            logf.close()
        self.starts += 1

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def ready(self):
        """The daemon accepts connections on its socket (it joined the cluster)."""
        return self.alive() and os.path.exists(self.socket) and accepts(self.socket)

    def kill(self):
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def drain(self, timeout_s=30):
        """`hsdpctl drain`; returns (exit code of hsdpctl, exit code of hsdpd or None)."""
        r = self.ctl("drain", "--timeout", str(timeout_s), timeout=timeout_s + 30)
        try:
            code = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        return r.returncode, code

    def stop(self):
        if self.proc is not None:
            localproc_stop(self.proc)

    def ctl(self, *args, timeout=15):
        """hsdpctl against this node; options (--json) before the command."""
        opts = [a for a in args if a == "--json"]
        rest = [a for a in args if a != "--json"]
        return subprocess.run([os.path.join(self.build, "bin", "hsdpctl"), "--socket",
                               self.socket, "--timeout", "5", *opts, *rest],
                              capture_output=True, text=True, timeout=timeout)

    def ctl_json(self, *args):
        try:
            r = self.ctl("--json", *args)
            return json.loads(r.stdout) if r.stdout.strip() else None
        except (subprocess.TimeoutExpired, ValueError):
            return None

    def alive_nodes(self):
        view = self.ctl_json("nodes") or {}
        return sum(1 for n in view.get("nodes", []) if n.get("state") == "alive")

    def formed(self, want):
        """This daemon sees `want` nodes alive and its cluster is not degraded."""
        view = self.ctl_json("nodes") or {}
        return view.get("state", "ok") == "ok" and \
            sum(1 for n in view.get("nodes", []) if n.get("state") == "alive") == want

    def snapshot(self):
        return snapshot(self.proc.pid) if self.alive() else None

    def sessions(self):
        """The trainer sessions this daemon holds (None: no answer)."""
        view = self.ctl_json("sessions")
        return None if view is None else len(view.get("sessions", []))

    def log_tail(self, n=3000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""


class Cluster:
    def __init__(self, build, root, nodes, heartbeat_ms=200, missed_heartbeats=15,
                 collective_ms=60000, net=None, etcd=None):
        """net: a net.Net (each daemon in its node's namespace), a docker.Pods
        (each daemon a container in its node's pod, the image's hsdpd) or None
        (loopback); etcd: an etcd.Etcd (cluster.store: etcd) or None (the
        embedded store)."""
        self.root = root
        self.net, self.etcd = net, etcd
        # How long a node that stops heartbeating stays alive in the others' views.
        self.lease_s = heartbeat_ms * missed_heartbeats / 1000.0
        if net is None:
            ports = free_ports(nodes)
            listen = [f"127.0.0.1:{p}" for p in ports]
        else:
            listen = [f"{a}:7070" for a in net.addrs]
        common = (f"  nodes: {nodes}\n  heartbeat_ms: {heartbeat_ms}\n"
                  f"  missed_heartbeats: {missed_heartbeats}\n  join_timeout_ms: 60000\n")
        if etcd is None:
            self.token_file = os.path.join(root, "token")
            with open(os.open(self.token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
                f.write("chaos cluster token\n")
            store = (f'  coordinator: "{listen[0]}"\n'
                     f'  token_file: "{self.token_file}"\n')
        else:
            endpoints = ", ".join(f'"{e}"' for e in etcd.endpoints())
            store = (f"  store: etcd\n  etcd:\n    endpoints: [{endpoints}]\n"
                     f'    prefix: "/hsdp/chaos/"\n  insecure: true\n')
        self.nodes = []
        for i in range(nodes):
            yaml = store + f'  listen: "{listen[i]}"\n  node_rank: {i}\n' + common
            if net is not None:
                yaml += f"  data_address: {net.addrs[i]}\n"
            pods = hasattr(net, "spawner")
            self.nodes.append(Node(build, root, i, yaml, collective_ms,
                                   net.prefix(i) if net is not None and not pods else (),
                                   spawn=net.spawner(i, "hsdpd") if pods else None,
                                   hsdpd="/usr/bin/hsdpd" if pods else None))

    def start(self, timeout=60):
        for n in self.nodes:
            if not n.alive():
                n.start()
        return self.wait_formed(timeout)

    def wait_formed(self, timeout=60):
        """True once every daemon runs, accepts trainers and sees every node alive
        (and, on etcd, no daemon reports the cluster degraded: etcd has a quorum)."""
        want = len(self.nodes)
        return bool(wait_for(lambda: all(n.ready() for n in self.nodes) and
                             all(n.formed(want) for n in self.nodes), timeout, 0.2))

    def quiesced_snapshots(self, timeout=60):
        """Each daemon's snapshot once it holds no session (bounded wait)."""
        deadline = time.monotonic() + timeout
        wait_for(lambda: all(n.sessions() == 0 for n in self.nodes), timeout, 0.5)
        # A session's memory goes right after it ends: until two snapshots 0.5 s
        # apart agree on fds, memfds and threads (bounded).
        def key(snaps):
            return [None if s is None else (s["fds"], s["memfds"], s["threads"]) for s in snaps]
        last = None
        while True:
            now = [n.snapshot() for n in self.nodes]
            if key(now) == last or time.monotonic() >= deadline:
                return now
            last = key(now)
            time.sleep(0.5)

    def stop(self):
        for n in self.nodes:
            n.stop()

    def logs(self, tail=3000):
        return "".join(f"--- node {n.index} hsdpd log (tail) ---\n{n.log_tail(tail)}\n"
                       for n in self.nodes)
