#!/usr/bin/python3
"""deploy/docker-compose.yml on a real Docker engine.

    compose_docker_test.py setup   SRC BUILD STATE   # engine up, images built (ctest fixture)
    compose_docker_test.py cleanup SRC BUILD STATE   # images, leftovers, the engine we started
    compose_docker_test.py up|failures|four_nodes|etcd|chaos|teardown SRC BUILD STATE

`setup` starts dockerd when no engine answers (docker_engine.py; `cleanup`
stops the one it started), removes what earlier runs left (projects whose
owner process is gone, images of old tags) and builds hsdpd:<tag> and
hsdpd-trainer:<tag> from BUILD (docker_images.py; the base is cached per
machine; torch is BUILD/venv's, mounted read-only into the trainers). The tests then run the compose file as a user would:

- up: `docker-compose -f deploy/docker-compose.yml up -d`; both trainers
  exit 0 within a bound, the loss fell, the member joined the coordinator,
  and `down -v` leaves no container, network or volume.
- failures: the same file with a test override (200 ms heartbeats, 6 s
  collective timeout, trainers that run until stopped): a trainer container
  restarted, a daemon killed (`docker kill`), a node cut off (`docker network
  disconnect`) and reconnected, a daemon started with a wrong token. The
  survivors fail within bounds naming the rank or node, nothing hangs, the
  cut-off node rejoins, and the job runs again after each. The measured
  times are printed as "FIGURE" lines (docs/cluster.md).
- four_nodes: with deploy/docker-compose.4nodes.yml, the HSDP mesh (FSDP2 on
  a 2 x 2 replicate x shard mesh) across four nodes trains and exits 0.
- etcd: with deploy/docker-compose.etcd.yml (cluster.store: etcd, three
  etcd containers with users and auth), the job trains; killing one etcd
  member and node 0's daemon leaves node 1 "ok", seeing node 0 lost.
- chaos: the chaos job (tools/chaos/chaos.py --docker: every daemon, etcd
  member and rank a container of these images, the nodes pods on a Docker
  network) meets a seeded schedule of every fault kind and ends with the
  parameters of its undisturbed run, bitwise; nothing of it is left.
- teardown: a test run stopped with SIGTERM removes its project; one killed
  with SIGKILL (what a ctest timeout does) is removed by the next sweep.

Every project is named hsdpt<pid of its owner> and every wait is bounded.
Exit 77 (skipped) where no engine can run here (not root, no dockerd) -- but
with HSDP_REQUIRE_DOCKER=1 (.ci/run sets it) that is a failure instead.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from datetime import datetime

CMD = sys.argv[1] if len(sys.argv) > 1 else ""
SRC = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.getcwd()
BUILD = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else os.path.join(SRC, "build")
STATE = os.path.abspath(sys.argv[4]) if len(sys.argv) > 4 else os.path.join(BUILD, "docker",
                                                                           "ctest")
sys.path.insert(0, os.path.join(SRC, "tools", "scripts"))
import docker_engine  # noqa: E402
import docker_images  # noqa: E402
from docker_engine import unavailable  # noqa: E402

COMPOSE = os.path.join(SRC, "deploy", "docker-compose.yml")
COMPOSE4 = os.path.join(SRC, "deploy", "docker-compose.4nodes.yml")
COMPOSE_ETCD = os.path.join(SRC, "deploy", "docker-compose.etcd.yml")
PROJECT_RE = re.compile(r"^hsdpt(\d+)$")
PROJECT_LABEL = "com.docker.compose.project"
DOCKER = docker_engine.docker_cli()
FIGURES = []


def docker(*args, timeout=120, check=True):
    r = subprocess.run([DOCKER, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: exit {r.returncode}: {r.stdout[-3000:]}")
    return r.stdout


def figure(text):
    FIGURES.append(text)
    print(f"FIGURE: {text}", flush=True)


# --- leftovers ---------------------------------------------------------------
def _alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def project_resources(project):
    """{"containers": [...], "networks": [...], "volumes": [...]} of a project."""
    f = f"label={PROJECT_LABEL}={project}"
    return {"containers": docker("ps", "-aq", "--filter", f).split(),
            "networks": docker("network", "ls", "-q", "--filter", f).split(),
            "volumes": docker("volume", "ls", "-q", "--filter", f).split()}


def remove_project(project):
    res = project_resources(project)
    if res["containers"]:
        docker("rm", "-f", "-v", *res["containers"], timeout=300, check=False)
    if res["networks"]:
        docker("network", "rm", *res["networks"], check=False)
    if res["volumes"]:
        docker("volume", "rm", "-f", *res["volumes"], check=False)


def sweep():
    """Removes the projects of owners that no longer run (a killed test)."""
    names = set()
    for kind in (["ps", "-a"], ["network", "ls"], ["volume", "ls"]):
        out = docker(*kind, "--filter", f"label={PROJECT_LABEL}",
                     "--format", f'{{{{.Label "{PROJECT_LABEL}"}}}}')
        names.update(out.split())
    gone = []
    for name in sorted(names):
        m = PROJECT_RE.match(name)
        if m and not _alive(int(m.group(1))):
            remove_project(name)
            gone.append(name)
    return gone


def sweep_images():
    """Removes hsdpd[-trainer]:ct<pid> images of setups that no longer run
    (a setup killed before it recorded its tag), and the torch bases that
    earlier versions built (3.4 GB each; torch is mounted now); the base
    stays."""
    gone = []
    out = docker("images", "--format", "{{.Repository}}:{{.Tag}}")
    for ref in out.split():
        repo, _, tag = ref.partition(":")
        m = re.match(r"^ct(\d+)$", tag)
        if repo == "hsdpd-base-torch" or (
                repo in ("hsdpd", "hsdpd-trainer") and m and not _alive(int(m.group(1)))):
            docker("rmi", "-f", ref, check=False)
            gone.append(ref)
    return gone


# --- a compose project -------------------------------------------------------
class Project:
    """One `docker-compose -p hsdpt<pid>` run of the compose file(s)."""

    def __init__(self, files, token, env=None, owner=None):
        self.name = f"hsdpt{owner or os.getpid()}"
        self.files = files
        state = read_state()
        self.env = dict(os.environ, HSDP_CLUSTER_TOKEN_FILE=token, HSDP_IMAGE_TAG=state["tag"],
                        HSDP_TORCH_SITE=state["torch_site"], **(env or {}))
        self.network = f"{self.name}_cluster"

    def compose(self, *args, timeout=300, check=True):
        argv = ["docker-compose", "-p", self.name]
        for f in self.files:
            argv += ["-f", f]
        r = subprocess.run(argv + list(args), env=self.env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"docker-compose {' '.join(args)}: exit {r.returncode}:\n"
                                 f"{r.stdout[-4000:]}")
        return r.stdout

    def container(self, svc):
        return f"{self.name}_{svc}_1"

    def state(self, svc):
        out = docker("inspect", "-f", "{{json .State}}", self.container(svc))
        return json.loads(out)

    def logs(self, svc, timestamps=False):
        return docker("logs", *(["-t"] if timestamps else []), self.container(svc))

    def wait_exit(self, svc, timeout):
        """The exit code of `svc`'s container, which must stop within `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.state(svc)
            if not st["Running"] and st["Status"] in ("exited", "dead"):
                return st["ExitCode"]
            time.sleep(0.2)
        raise AssertionError(f"{svc} still runs after {timeout} s (a hang):\n"
                             f"{self.logs(svc)[-3000:]}")

    def wait_log(self, svc, pattern, timeout, since=0):
        """The first match of `pattern` in `svc`'s log after character `since`."""
        deadline = time.monotonic() + timeout
        rx = re.compile(pattern)
        while time.monotonic() < deadline:
            log = self.logs(svc)
            m = rx.search(log, since)
            if m:
                return m
            if not self.state(svc)["Running"]:
                raise AssertionError(f"{svc} exited before /{pattern}/:\n{log[-3000:]}")
            time.sleep(0.3)
        raise AssertionError(f"no /{pattern}/ in {svc}'s log within {timeout} s:\n"
                             f"{self.logs(svc)[-3000:]}")

    def hsdpctl(self, svc, *args, check=False):
        r = subprocess.run([DOCKER, "exec", self.container(svc), "hsdpctl", "--socket",
                            "/run/hsdpd/hsdpd.sock", *args], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=30)
        return r.returncode, r.stdout

    def nodes(self, svc):
        """`hsdpctl nodes --json` on `svc`'s daemon, parsed (None when it fails)."""
        _, out = self.hsdpctl(svc, "nodes", "--json")
        try:
            return json.loads(out[out.index("{"):])
        except ValueError:
            return None

    def down(self):
        try:
            self.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=300, check=False)
        finally:
            remove_project(self.name)


def read_state():
    try:
        with open(os.path.join(STATE, "images.json")) as f:
            return json.load(f)
    except OSError:
        unavailable(f"no images: the fixture cluster.docker_setup did not build them "
                    f"({STATE}/images.json is missing)")


def error_time(log_ts, pattern, since):
    """The docker timestamp (seconds) of the first line of `log_ts` (docker logs
    -t) written at or after `since` (time.time()) that matches `pattern`, and
    the line without its timestamp. A container's log spans its restarts."""
    for line in log_ts.splitlines():
        ts, _, text = line.partition(" ")
        # RFC 3339 with nanoseconds: keep microseconds for datetime.
        m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z", ts)
        if not m:
            continue
        t = datetime.fromisoformat(m.group(1) + (m.group(2) or ".0")[:7] + "+00:00").timestamp()
        if t >= since and re.search(pattern, text):
            return t, text
    return None, None


class DockerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="hsdp-docker-test-")
        self.token = os.path.join(self.tmp, "token")
        fd = os.open(self.token, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, os.urandom(24).hex().encode() + b"\n")
        os.close(fd)
        self.project = None

    def tearDown(self):
        if self.project is not None:
            self.project.down()
            left = project_resources(self.project.name)
            self.assertEqual(left, {"containers": [], "networks": [], "volumes": []})
        subprocess.run(["rm", "-rf", self.tmp])

    def write(self, name, text, mode=0o644):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
        return path

    def check_trained(self, p, n):
        for rank in range(n):
            code = p.wait_exit(f"trainer-node{rank}", 300)
            log = p.logs(f"trainer-node{rank}")
            self.assertEqual(code, 0, log[-3000:])
            self.assertIn(f"rank {rank} of {n}", log)
            m = re.search(r"loss ([0-9.]+) -> ([0-9.]+)", log)
            self.assertIsNotNone(m, log[-3000:])
            self.assertLess(float(m.group(2)), float(m.group(1)), log[-3000:])
        return p.logs("trainer-node0")


class ComposeUp(DockerTest):
    def test_the_compose_file_trains_across_two_containers_nodes(self):
        p = self.project = Project([COMPOSE], self.token)
        t0 = time.monotonic()
        p.compose("up", "-d", timeout=600)
        log0 = self.check_trained(p, 2)
        figure(f"2-node compose job: up -d to both trainers exited 0 in "
               f"{time.monotonic() - t0:.0f} s")
        self.assertIn("FSDP2", log0 + p.logs("trainer-node1"))
        # The member joined the coordinator over the compose network.
        self.assertRegex(p.logs("hsdpd-node1"), r"198\.18\.77\.10:7070")
        # The daemons still run, healthy, and both see two live nodes.
        for d in ("hsdpd-node0", "hsdpd-node1"):
            self.assertTrue(p.state(d)["Running"], p.logs(d)[-2000:])
            nodes = p.nodes(d)
            self.assertIsNotNone(nodes, p.hsdpctl(d, "nodes", "--json"))
            self.assertEqual(len(nodes.get("nodes", [])), 2, nodes)
        p.compose("down", "-v", "-t", "5")
        self.assertEqual(project_resources(p.name),
                         {"containers": [], "networks": [], "volumes": []})


class ComposeEtcd(DockerTest):
    """deploy/docker-compose.etcd.yml on top of the two-node file: the
    cluster on cluster.store: etcd (three etcd containers, users and auth
    set by etcd-auth). The job trains; then one etcd member and node 0's
    daemon are killed: node 1 sees node 0 lost and stays "ok" (no
    coordinator to lose), and etcd still answers through its other members."""

    def test_the_cluster_on_etcd_trains_and_survives_node_0(self):
        password = self.write("etcd-password", os.urandom(16).hex() + "\n", 0o600)
        p = self.project = Project(
            [COMPOSE, COMPOSE_ETCD], self.token,
            env={"HSDP_ETCD_PASSWORD_FILE": password,
                 "HSDP_ETCD_DIR": os.path.join(BUILD, "third_party", "etcd")})
        t0 = time.monotonic()
        p.compose("up", "-d", timeout=600)
        self.check_trained(p, 2)
        figure(f"2-node compose job on etcd: up -d to both trainers exited 0 in "
               f"{time.monotonic() - t0:.0f} s")
        self.assertEqual(p.wait_exit("etcd-auth", 60), 0, p.logs("etcd-auth")[-2000:])
        for d in ("hsdpd-node0", "hsdpd-node1"):
            self.assertRegex(p.logs(d), r"joined through etcd \(198\.18\.77\.30:2379")
            nodes = p.nodes(d)
            self.assertIsNotNone(nodes, p.hsdpctl(d, "nodes", "--json"))
            self.assertEqual(nodes.get("state"), "ok", nodes)
            self.assertEqual(len(nodes.get("nodes", [])), 2, nodes)
        docker("kill", p.container("etcd-0"))
        docker("kill", p.container("hsdpd-node0"))
        t_kill = time.monotonic()
        deadline = t_kill + 30
        seen = None
        while time.monotonic() < deadline:
            nodes = p.nodes("hsdpd-node1") or {}
            states = {int(n.get("node_rank", n.get("nodeRank", 0))): n.get("state")
                      for n in nodes.get("nodes", [])}
            if nodes.get("state") == "ok" and states.get(0) == "lost":
                seen = time.monotonic() - t_kill
                break
            time.sleep(0.2)
        self.assertIsNotNone(seen, f"{nodes}\n{p.logs('hsdpd-node1')[-3000:]}")
        figure(f"etcd store, compose: node 0 and one etcd member killed; node 1 saw node 0 "
               f"lost in {seen:.1f} s and stayed ok")


FAST = {"heartbeat_ms": 200, "missed_heartbeats": 5}
COLLECTIVE_MS = 6000
# A trainer's error line: train_demo.py prints "demo FAILED: rank R: <error>".
FAILED = r"demo FAILED: rank \d+: "


class ComposeFailures(DockerTest):
    """Faults on the real containers. One project, a test override: short
    heartbeats (lost after 1 s) and collective timeout (6 s), as the netns
    tests; trainers that train until they fail or are stopped."""

    def override(self):
        import yaml
        files = {}
        for i in range(2):
            with open(os.path.join(SRC, "deploy", "cluster", f"node{i}.yaml")) as f:
                doc = yaml.safe_load(f)
            doc["cluster"].update(FAST)
            doc.setdefault("timeouts", {})["collective_ms"] = COLLECTIVE_MS
            files[i] = self.write(f"node{i}.yaml", yaml.safe_dump(doc))
        trainer = ["python3", "/opt/hsdp/demo/train_demo.py", "--steps", "1000000",
                   "--timeout", "60"]
        services = {f"hsdpd-node{i}": {"volumes": [f"{files[i]}:/etc/hsdpd/node.yaml:ro"]}
                    for i in range(2)}
        services.update({f"trainer-node{i}": {"entrypoint": trainer} for i in range(2)})
        return self.write("override.yml", yaml.safe_dump({"services": services}))

    def start_job(self, p):
        """Runs the job again: both trainers (re)started, it must train."""
        since = len(p.logs("trainer-node0"))
        for svc in ("trainer-node0", "trainer-node1"):
            if p.state(svc)["Running"]:
                docker("kill", p.container(svc))
            p.wait_exit(svc, 30)
        docker("start", p.container("trainer-node0"), p.container("trainer-node1"))
        p.wait_log("trainer-node0", r"step +3 ", 180, since)

    def fail_time(self, p, svc, t_fault, pattern, bound):
        """Seconds from the fault to `svc`'s error line, which must match
        `pattern` and come within `bound` s; the container must exit non-zero."""
        code = p.wait_exit(svc, bound + 30)
        log_ts = p.logs(svc, timestamps=True)
        t, line = error_time(log_ts, FAILED, t_fault)
        self.assertIsNotNone(t, f"{svc} exited {code} with no error line after the fault:\n"
                                f"{log_ts[-3000:]}")
        self.assertNotEqual(code, 0, log_ts[-2000:])
        self.assertRegex(line, pattern)
        self.assertLess(t - t_fault, bound, line)
        return t - t_fault, line

    def cluster_ok(self, p, svc, n, timeout):
        """Waits until `svc` sees `n` live nodes and state ok; the seconds taken."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            nodes = p.nodes(svc)
            if nodes and nodes.get("state") == "ok" and sum(
                    1 for x in nodes.get("nodes", []) if x.get("state") == "alive") == n:
                return time.monotonic() - t0
            time.sleep(0.1)
        self.fail(f"{svc} does not see {n} live nodes within {timeout} s: {p.nodes(svc)}")

    def test_faults(self):
        p = self.project = Project([COMPOSE, self.override()], self.token)
        p.compose("up", "-d", timeout=600)
        p.wait_log("trainer-node0", r"step +3 ", 240)
        self.cluster_ok(p, "hsdpd-node0", 2, 30)

        # 1. A trainer container restarted: its daemon ends its session, the
        # other rank's collective fails naming it; then the job runs again.
        t = time.time()
        docker("restart", "-t", "0", p.container("trainer-node1"))
        # Which cause reaches rank 0 first is a race: the epoch's end relayed
        # by the coordinator ("rank 1 left the job"), or node 1's daemon
        # aborting the running cross-node operation, which rank 0 sees as its
        # link to node 1 breaking. Either names the peer.
        dt, line = self.fail_time(p, "trainer-node0", t,
                                  r"rank 1 left the job|connection to node 1 lost", 15)
        figure(f"trainer-node1 restarted: rank 0 failed after {dt:.2f} s: {line}")
        self.start_job(p)
        self.cluster_ok(p, "hsdpd-node0", 2, 10)

        # 2. A daemon killed mid-collective: the survivor fails at once naming
        # the node; the node's own trainer fails too. Restarted, it rejoins.
        t = time.time()
        docker("kill", p.container("hsdpd-node1"))
        dt, line = self.fail_time(p, "trainer-node0", t,
                                  r"connection to node 1 lost|node 1 hosting rank", 10)
        figure(f"hsdpd-node1 killed: rank 0 failed after {dt:.2f} s: {line}")
        dt1, line1 = self.fail_time(p, "trainer-node1", t, r"lost the connection to hsdpd", 15)
        figure(f"hsdpd-node1 killed: rank 1 (its own node) failed after {dt1:.2f} s: {line1}")
        t = time.monotonic()
        docker("start", p.container("hsdpd-node1"))
        self.cluster_ok(p, "hsdpd-node0", 2, 60)
        figure(f"hsdpd-node1 restarted: node 0 sees both nodes alive {time.monotonic() - t:.2f} s "
               f"after `docker start`")
        self.start_job(p)

        # 3. A node cut off (its daemon and trainer leave the network): the
        # coordinator's side fails within heartbeat x missed naming the node;
        # the cut-off side fails at collective_ms. Reconnected, it rejoins.
        epoch = int(p.nodes("hsdpd-node0")["epoch"])
        t = time.time()
        for svc in ("hsdpd-node1", "trainer-node1"):
            docker("network", "disconnect", p.network, p.container(svc))
        dt, line = self.fail_time(p, "trainer-node0", t, r"node 1 hosting rank\(s\) \[1\]", 5)
        figure(f"node 1 cut off: rank 0 failed after {dt:.2f} s: {line}")
        dt1, line1 = self.fail_time(p, "trainer-node1", t, r"DeadlineExceeded|timeouts\.collective_ms",
                                    COLLECTIVE_MS / 1000 + 10)
        self.assertGreater(dt1, COLLECTIVE_MS / 1000 - 1, line1)
        figure(f"node 1 cut off: rank 1 (cut off) failed after {dt1:.2f} s: {line1}")
        n0 = p.nodes("hsdpd-node0")
        self.assertEqual([x.get("state") for x in n0["nodes"]
                          if int(x.get("nodeRank", x.get("node_rank", 0))) == 1], ["lost"], n0)
        self.assertGreater(int(n0["epoch"]), epoch, n0)
        code, out = p.hsdpctl("hsdpd-node1", "nodes")
        self.assertEqual(code, 1, out)
        self.assertIn("degraded", out)
        for svc, ip in (("trainer-node1", "198.18.77.21"), ("hsdpd-node1", "198.18.77.11")):
            t = time.monotonic()
            docker("network", "connect", "--ip", ip, p.network, p.container(svc))
        self.cluster_ok(p, "hsdpd-node0", 2, 30)
        rejoin = time.monotonic() - t
        self.cluster_ok(p, "hsdpd-node1", 2, 30)
        figure(f"node 1 reconnected: node 0 sees 2 live nodes {rejoin:.2f} s after "
               f"`docker network connect` of its daemon began")
        self.start_job(p)

        # 4. A daemon with a wrong token: refused, exit 1, the reason in its log;
        # the cluster does not change.
        epoch = int(p.nodes("hsdpd-node0")["epoch"])
        wrong = self.write("wrong-token", "not the cluster token\n", 0o600)
        import yaml
        with open(os.path.join(SRC, "deploy", "cluster", "node1.yaml")) as f:
            doc = yaml.safe_load(f)
        doc["cluster"].update(listen="198.18.77.12:7070", data_address="198.18.77.12")
        doc["cluster"].pop("node_rank", None)
        cfg = self.write("intruder.yaml", yaml.safe_dump(doc))
        name = f"{p.name}_intruder"
        t = time.monotonic()
        docker("run", "-d", "--name", name, "--label", f"{PROJECT_LABEL}={p.name}",
               "--network", p.network, "--ip", "198.18.77.12",
               "-v", f"{wrong}:/run/secrets/cluster-token:ro",
               "-v", f"{cfg}:/etc/hsdpd/node.yaml:ro", f"hsdpd:{read_state()['tag']}")
        code = docker("wait", name, timeout=90).strip()
        took = time.monotonic() - t
        log = docker("logs", name)
        self.assertEqual(code, "1", log)
        self.assertRegex(log, r"wrong cluster token")
        figure(f"wrong token: the daemon exited 1 after {took:.2f} s (incl. container start): "
               f"{[ln for ln in log.splitlines() if 'wrong cluster token' in ln][0]}")
        self.assertRegex(p.logs("hsdpd-node0"), r"wrong cluster token")
        n0 = p.nodes("hsdpd-node0")
        self.assertEqual(int(n0["epoch"]), epoch, n0)
        self.cluster_ok(p, "hsdpd-node0", 2, 5)
        # The job still runs.
        p.wait_log("trainer-node0", r"step +\d+ ", 10, len(p.logs("trainer-node0")) - 200)


class ComposeFourNodes(DockerTest):
    def test_the_hsdp_mesh_trains_across_four_nodes(self):
        p = self.project = Project([COMPOSE, COMPOSE4], self.token)
        t0 = time.monotonic()
        p.compose("up", "-d", timeout=600)
        log0 = self.check_trained(p, 4)
        figure(f"4-node compose job (HSDP 2x2): up -d to all four trainers exited 0 in "
               f"{time.monotonic() - t0:.0f} s")
        self.assertIn("HSDP 2-D mesh", log0)
        for i in range(1, 4):
            self.assertRegex(p.logs(f"hsdpd-node{i}"), rf"joined 198\.18\.77\.10:7070 as node {i} "
                             r"of 4")
        nodes = p.nodes("hsdpd-node0")
        self.assertEqual(sorted((x["node_rank"], x["state"]) for x in nodes["nodes"]),
                         [(i, "alive") for i in range(4)], nodes)


class ComposeChaos(unittest.TestCase):
    """The chaos harness in its Docker mode against this build's images: the
    short run of tests/python/test_chaos.py (seed 60, 60 s of faults at 8 a
    minute, every kind), with the daemons, etcd members and ranks in
    containers and the faults made the Docker way (docker kill / start, the
    pod's veth down, its eth0 and veth shaped)."""

    def test_the_chaos_job_in_containers_ends_with_the_undisturbed_parameters(self):
        sys.path.insert(0, os.path.join(SRC, "tools", "chaos"))
        import schedule
        python = os.path.join(BUILD, "venv", "bin", "python")
        etcd = os.path.join(BUILD, "third_party", "etcd", "usr", "bin")
        if not all(os.access(os.path.join(etcd, b), os.X_OK) for b in ("etcd", "etcdctl")):
            unavailable(f"no etcd in {etcd} (tools/scripts/etcd_env.sh)")
        out = tempfile.mkdtemp(prefix="hsdp-docker-chaos-")
        try:
            r = subprocess.run(
                [python, os.path.join(SRC, "tools", "chaos", "chaos.py"), "--seed", "60",
                 "--seconds", "60", "--rate", "8", "--steps", "160", "--ckpt-every", "8",
                 "--docker", "--image-tag", read_state()["tag"], "--store", "etcd",
                 "--build", BUILD, "--out", out, "--deadline-s", "600", "--keep"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
            print(r.stdout[-6000:])
            self.assertEqual(r.returncode, 0, r.stdout[-8000:])
            self.assertIn("containers up: node pods on 198.18.42.10", r.stdout)
            self.assertIn("bitwise equal to the undisturbed run's", r.stdout)
            self.assertIn("verdict: OK", r.stdout)
            with open(os.path.join(out, "report.json")) as f:
                report = json.load(f)
            self.assertEqual(report["problems"], [])
            injected = [e for e in report["faults"] if not e["did"].startswith("skipped")]
            # The schedule has each of the ten kinds once; a fault whose target was
            # not running at its time (a rank between restarts) is skipped.
            self.assertEqual(len(report["faults"]), 11, report["faults"])
            self.assertGreaterEqual(len(injected), 8, [e["did"] for e in report["faults"]])
            # The link and etcd faults, made the Docker way.
            self.assertTrue(any(e["kind"] == "link_down" and "host veth" in e["did"]
                                for e in injected), injected)
            self.assertTrue(any(e["kind"] in schedule.ETCD_KINDS for e in injected), injected)
            figure(f"chaos job in containers (seed 60, {len(injected)} faults): "
                   f"{report['chaos_seconds']:.0f} s against {report['reference_seconds']:.0f} s "
                   f"undisturbed, {report['incarnations']} incarnation(s), verdict OK")
        finally:
            # Nothing of the run is left: containers and network carry its label.
            left = docker("ps", "-aq", "--filter", "label=org.hsdpd.chaos", check=False).split()
            nets = docker("network", "ls", "-q", "--filter", "label=org.hsdpd.chaos",
                          check=False).split()
            subprocess.run(["rm", "-rf", out])
        self.assertEqual((left, nets), ([], []))


class ComposeTeardown(unittest.TestCase):
    """A compose run that is stopped removes what it made; one that is killed
    (ctest's timeout kills) is removed by the next sweep (cluster.docker_setup
    and cluster.docker_cleanup run it)."""

    def hold(self):
        p = subprocess.Popen(["/usr/bin/python3", os.path.abspath(__file__), "hold", SRC, BUILD,
                              STATE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
        project = f"hsdpt{p.pid}"
        deadline = time.monotonic() + 180
        line = ""
        while time.monotonic() < deadline and "READY" not in line:
            line = p.stdout.readline()
            if not line and p.poll() is not None:
                break
        if "READY" not in line:
            p.kill()
            out, _ = p.communicate()
            remove_project(project)
            self.fail(f"the held project never came up: {line}{out}")
        res = project_resources(project)
        self.assertEqual(len(res["containers"]), 2, res)
        self.assertEqual(len(res["networks"]), 1, res)
        return p, project

    def test_sigterm_removes_the_project(self):
        p, project = self.hold()
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            remove_project(project)
            self.fail("a SIGTERM'd run did not finish within 120 s")
        self.assertEqual(project_resources(project),
                         {"containers": [], "networks": [], "volumes": []}, out)
        figure(f"SIGTERM: the run removed its containers, network and volumes in "
               f"{time.monotonic() - t0:.1f} s")

    def test_a_killed_run_is_swept(self):
        p, project = self.hold()
        p.kill()
        p.communicate(timeout=30)
        self.assertNotEqual(project_resources(project)["containers"], [])
        self.assertIn(project, sweep())
        self.assertEqual(project_resources(project),
                         {"containers": [], "networks": [], "volumes": []})


def hold():
    """Brings the two daemons of a project up, then waits to be stopped."""
    tmp = tempfile.mkdtemp(prefix="hsdp-docker-hold-")
    token = os.path.join(tmp, "token")
    fd = os.open(token, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b"hold token\n")
    os.close(fd)
    p = Project([COMPOSE], token)

    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    try:
        p.compose("up", "-d", "hsdpd-node0", "hsdpd-node1", timeout=300)
        print("READY", flush=True)
        time.sleep(300)
        return 1
    except KeyboardInterrupt as e:
        print(f"stopping: {e}", flush=True)
        return 1
    finally:
        p.down()
        subprocess.run(["rm", "-rf", tmp])


def main_unittest(cls):
    if not docker_engine.answers():
        unavailable("no Docker engine answers (cluster.docker_setup starts one as root)")
    read_state()  # the images of cluster.docker_setup (skip or fail here without them)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    stop = {"sig": None}

    def on_signal(signum, _frame):
        stop["sig"] = signum
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_signal)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    for f in FIGURES:
        print(f"FIGURE: {f}")
    return 0 if result.wasSuccessful() and stop["sig"] is None else 1


def setup():
    os.makedirs(STATE, exist_ok=True)
    try:
        how = docker_engine.start(STATE)
    except docker_engine.EngineError as e:
        unavailable(str(e))
    print(f"docker engine: {how}")
    gone = sweep()
    if gone:
        print(f"removed leftover projects: {gone}")
    # Images of earlier runs of this build folder (a run killed before cleanup).
    old = os.path.join(STATE, "images.json")
    if os.path.exists(old):
        with open(old) as f:
            print(f"removed old images: {docker_images.remove(json.load(f)['tag'])}")
        os.unlink(old)
    gone = sweep_images()
    if gone:
        print(f"removed leftover images: {gone}")
    tag = f"ct{os.getpid()}"
    t0 = time.monotonic()
    info = docker_images.build(BUILD, tag)
    info["tag"] = tag
    info["build_s"] = round(time.monotonic() - t0, 1)
    with open(old, "w") as f:
        json.dump(info, f, indent=1)
    print(json.dumps(info, indent=1))
    return 0


def cleanup():
    rc = 0
    if docker_engine.answers():
        print(f"removed leftover projects: {sweep()}")
        path = os.path.join(STATE, "images.json")
        if os.path.exists(path):
            with open(path) as f:
                print(f"removed images: {docker_images.remove(json.load(f)['tag'])}")
            os.unlink(path)
    if docker_engine.answers() and docker_engine.started_here(STATE):
        # BuildKit keeps every build's context and layers (about 0.5 GB a run
        # here); the bases are images and stay. Only on an engine we run.
        out = docker("builder", "prune", "-f", timeout=600, check=False).strip()
        print(out.splitlines()[-1] if out else "build cache: nothing to prune")
    if docker_engine.stop(STATE):
        print("stopped the dockerd that cluster.docker_setup started")
    return rc


if __name__ == "__main__":
    if CMD == "setup":
        sys.exit(setup())
    if CMD == "cleanup":
        sys.exit(cleanup())
    if CMD == "hold":
        sys.exit(hold())
    classes = {"up": "ComposeUp", "failures": "ComposeFailures",
               "four_nodes": "ComposeFourNodes", "teardown": "ComposeTeardown",
               "etcd": "ComposeEtcd", "chaos": "ComposeChaos"}
    if CMD not in classes:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main_unittest(globals()[classes[CMD]]))
