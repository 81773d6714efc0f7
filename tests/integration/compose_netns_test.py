#!/usr/bin/python3
"""deploy/docker-compose.yml's cluster runs for real in network namespaces.

tools/scripts/netns_cluster.py runs the compose topology from this build:
two daemons (node 0 the coordinator) and two torch trainers, each pair in
its node's namespace on the compose addresses; the trainers' two-rank DDP
job must finish with a lower loss. Also: the runner removes its namespaces
and processes after a success, after a run that overruns --timeout, and
when it is stopped with SIGTERM mid-run.

    compose_netns_test.py SOURCE_DIR BUILD_DIR

Exit 77 (skipped) where docker-compose is missing or network namespaces
cannot be created (e.g. not root).
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

SRC = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.getcwd()
BUILD = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(SRC, "build")
RUNNER = os.path.join(SRC, "tools", "scripts", "netns_cluster.py")
sys.path.insert(0, os.path.join(SRC, "tools", "scripts"))
import netns_topology  # noqa: E402

# Short heartbeats: a lost node shows within a second.
FAST = ["--set", "cluster.heartbeat_ms=200", "--set", "cluster.missed_heartbeats=5"]


def daemons_under(pid):
    """hsdpd processes descended from `pid` (the runner starts them in its namespaces)."""
    parent, comm = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        head, _, rest = stat.rpartition(")")
        comm[int(entry)] = head.split("(", 1)[1]
        parent[int(entry)] = int(rest.split()[1])
    found = 0
    for p, name in comm.items():
        if name != "hsdpd":
            continue
        while p in parent and p not in (0, 1, pid):
            p = parent[p]
        found += p == pid
    return found


def namespaces_of(pid):
    return [n for n in netns_topology.list_namespaces()
            if n.startswith(f"{netns_topology.PREFIX}{pid}-")]


class ComposeNetnsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hsdp-compose-run-")
        self.token = os.path.join(self.tmp, "token")
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, os.urandom(24).hex().encode() + b"\n")
        os.close(fd)
        self.keep = os.path.join(self.tmp, "run")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def start(self, *extra):
        env = dict(os.environ, HSDP_CLUSTER_TOKEN_FILE=self.token)
        return subprocess.Popen(
            ["/usr/bin/python3", RUNNER, "--build-dir", BUILD, "--keep", self.keep, *FAST,
             *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finish(self, p, timeout):
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            self.fail(f"the runner did not finish within {timeout} s:\n{out}")
        return out

    def log(self, name):
        with open(os.path.join(self.keep, f"{name}.log"), errors="replace") as f:
            return f.read()

    def test_the_compose_job_runs_across_two_namespaces(self):
        p = self.start("--timeout", "180")
        out = self.finish(p, 240)
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("netns cluster OK: 2 nodes", out)
        # Each service ran in its node's namespace on its compose address.
        for svc, addr in (("hsdpd-node0", "198.18.77.10"), ("hsdpd-node1", "198.18.77.11"),
                          ("trainer-node0", "198.18.77.20"), ("trainer-node1", "198.18.77.21")):
            self.assertRegex(out, rf"start {svc} in \S+-n{svc[-1]} \({addr}")
        # Both ranks trained through their own node's daemon and the loss fell.
        for rank in (0, 1):
            log = self.log(f"trainer-node{rank}")
            self.assertIn(f"rank {rank} of 2", log)
            m = re.search(r"loss ([0-9.]+) -> ([0-9.]+)", log)
            self.assertIsNotNone(m, log)
            self.assertLess(float(m.group(2)), float(m.group(1)), log)
        # The member joined the coordinator over the bridge.
        self.assertRegex(self.log("hsdpd-node1"), r"198\.18\.77\.10:7070")
        self.assertEqual(namespaces_of(p.pid), [])

    def test_cleans_up_after_a_timeout(self):
        start = time.monotonic()
        p = self.start("--timeout", "1")  # far shorter than starting torch
        out = self.finish(p, 60)
        self.assertEqual(p.returncode, 1, out)
        self.assertIn("FAILED", out)
        self.assertLess(time.monotonic() - start, 40, out)
        self.assertEqual(namespaces_of(p.pid), [], out)

    def test_cleans_up_on_sigterm(self):
        p = self.start("--timeout", "180")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(namespaces_of(p.pid)) < 3:
            time.sleep(0.1)
        self.assertEqual(len(namespaces_of(p.pid)), 3, "the runner never made its namespaces")
        # Both daemons are running in their namespaces before the runner is stopped.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and daemons_under(p.pid) < 2:
            time.sleep(0.1)
        self.assertEqual(daemons_under(p.pid), 2, "the runner never started its daemons")
        p.send_signal(signal.SIGTERM)
        out = self.finish(p, 60)
        self.assertEqual(p.returncode, 1, out)
        self.assertIn("signal", out)
        self.assertEqual(namespaces_of(p.pid), [], out)


if __name__ == "__main__":
    if shutil.which("docker-compose") is None:
        print("SKIP: docker-compose is not installed (tools/scripts/bootstrap.sh installs it)")
        sys.exit(77)
    why = netns_topology.probe()
    if why:
        print(f"SKIP: network namespaces cannot be created here: {why}")
        sys.exit(77)
    prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
