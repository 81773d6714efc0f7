"""The chaos run's etcd (--store etcd): a 3-member cluster, member m on node m
(in --netns mode inside node m's namespace on its address, ports 2379/2380;
otherwise on 127.0.0.1 with free ports), each with its own data directory and
log (appended across restarts) under <out>/etcd/, raft heartbeat 100 ms and
election 1000 ms (the C++ tests use 50/500 on idle machines; the chaos run
shares two cores with six trainers).

Etcd.kill(m) is SIGKILL; Etcd.start(m) starts a member again with its data
directory (--initial-cluster-state existing), as after a crash. Health is
etcdctl's `endpoint health` (a process of its own, run in the member's
namespace: the host's namespace has no route to the nodes' addresses).
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pylib"))
from localproc import die_with_parent, eventually, free_ports  # noqa: E402

MEMBERS = 3
# raft's timings here (--heartbeat-interval, --election-timeout).
HEARTBEAT_MS, ELECTION_MS = 100, 1000


class Etcd:
    def __init__(self, bin_dir, root, addrs=None, prefixes=None, spawners=None):
        """addrs[m]: member m's address (--netns: the node's), None: loopback;
        prefixes[m]: the command prefix that runs in member m's namespace;
        spawners[m]: spawn(argv, log_path) -> a Popen-like running member m
        (--docker: a container in node m's pod), None: a process of ours."""
        self.spawners = spawners
        self.etcd = os.path.join(bin_dir, "etcd")
        self.etcdctl = os.path.join(bin_dir, "etcdctl")
        self.dir = os.path.join(root, "etcd")
        os.makedirs(self.dir, exist_ok=True)
        if addrs is None:
            ports = free_ports(2 * MEMBERS)
            self.client = [f"127.0.0.1:{ports[2 * m]}" for m in range(MEMBERS)]
            self.peer = [f"127.0.0.1:{ports[2 * m + 1]}" for m in range(MEMBERS)]
        else:
            self.client = [f"{addrs[m]}:2379" for m in range(MEMBERS)]
            self.peer = [f"{addrs[m]}:2380" for m in range(MEMBERS)]
        self.prefixes = prefixes or [[] for _ in range(MEMBERS)]
        self.procs = [None] * MEMBERS
        self.starts = [0] * MEMBERS

    @staticmethod
    def available(bin_dir):
        return all(os.access(os.path.join(bin_dir, b), os.X_OK) for b in ("etcd", "etcdctl"))

    def endpoints(self):
        return list(self.client)

    def log_path(self, m):
        return os.path.join(self.dir, f"m{m}.log")

    def start(self, m):
        existing = self.starts[m] > 0
        initial = ",".join(f"m{j}=http://{self.peer[j]}" for j in range(MEMBERS))
        log = open(self.log_path(m), "a")
        log.write(f"=== chaos: start {self.starts[m] + 1} at {time.time():.3f}\n")
        log.flush()
        argv = [self.etcd, "--name", f"m{m}", "--data-dir", os.path.join(self.dir, f"m{m}.etcd"),
                "--listen-client-urls", f"http://{self.client[m]}",
                "--advertise-client-urls", f"http://{self.client[m]}",
                "--listen-peer-urls", f"http://{self.peer[m]}",
                "--initial-advertise-peer-urls", f"http://{self.peer[m]}",
                "--initial-cluster", initial,
                "--initial-cluster-state", "existing" if existing else "new",
                "--initial-cluster-token", "hsdp-chaos",
                "--heartbeat-interval", str(HEARTBEAT_MS), "--election-timeout", str(ELECTION_MS),
                "--logger", "zap", "--log-outputs", "stderr"]
        if self.spawners is not None:
            log.close()
            self.procs[m] = self.spawners[m](argv, self.log_path(m))
        else:
            self.procs[m] = subprocess.Popen(self.prefixes[m] + argv, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             preexec_fn=die_with_parent)
            log.close()
        self.starts[m] += 1

    def start_all(self, timeout=60):
        for m in range(MEMBERS):
            if not self.alive(m):
                self.start(m)
        return self.wait_healthy(timeout)

    def alive(self, m):
        return self.procs[m] is not None and self.procs[m].poll() is None

    def kill(self, m):
        """SIGKILL member m and reap it; its pid, or None if it was not running."""
        p = self.procs[m]
        if p is None or p.poll() is not None:
            return None
        p.send_signal(signal.SIGKILL)
        p.wait()
        return p.pid

    def healthy(self, m):
        """Member m answers a read (it has a leader: the cluster has a quorum)."""
        if not self.alive(m):
            return False
        try:
            r = subprocess.run(self.prefixes[m] + [
                self.etcdctl, "--dial-timeout=1s", "--command-timeout=2s",
                f"--endpoints={self.client[m]}", "endpoint", "health"],
                capture_output=True, text=True, timeout=10, env=dict(os.environ, ETCDCTL_API="3"))
        except subprocess.TimeoutExpired:
            return False
        return r.returncode == 0

    def wait_healthy(self, timeout=60):
        """True once every member runs and answers (bounded)."""
        return bool(eventually(lambda: all(self.healthy(m) for m in range(MEMBERS)), timeout,
                               0.3))

    def stop(self):
        for m in range(MEMBERS):
            p = self.procs[m]
            if p is not None and p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()

    def logs(self, tail=2000):
        out = []
        for m in range(MEMBERS):
            try:
                with open(self.log_path(m), errors="replace") as f:
                    out.append(f"--- etcd member {m} log (tail) ---\n{f.read()[-tail:]}\n")
            except OSError:
                pass
        return "".join(out)
