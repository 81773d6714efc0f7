#!/usr/bin/python3
"""deploy/docker-compose.yml is a valid two-node cluster (and, with
deploy/docker-compose.4nodes.yml, a valid four-node one).

`docker-compose config` must accept the file, and the values that make it a
cluster must hold in what it prints (every default and path resolved): two
daemons on one bridge network with fixed, distinct addresses; each mounts
its own deploy/cluster/node<i>.yaml whose cluster keys point at those
addresses (one coordinator, listen and data_address = the daemon's own
address, nodes = 2, distinct node ranks); peer authentication is a token
passed as a compose secret (never `insecure`); each trainer shares its
daemon's socket volume and IPC namespace, waits for it to be healthy, and
runs a distinct rank of a two-rank job whose store is on the rank-0
trainer. The netns runner's model of the file (netns_compose.py) must agree.
The checker itself is shown to fail on broken copies.

    compose_config_test.py SOURCE_DIR HSDPD_BINARY

Exit 77 (skipped) only when docker-compose is not installed.
"""
import copy
import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SRC = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.getcwd()
HSDPD = sys.argv[2] if len(sys.argv) > 2 else None
COMPOSE = os.path.join(SRC, "deploy", "docker-compose.yml")
COMPOSE4 = os.path.join(SRC, "deploy", "docker-compose.4nodes.yml")
sys.path.insert(0, os.path.join(SRC, "tools", "scripts"))

SECRET_DIR = "/run/secrets/"


def compose_config(env_extra):
    env = dict(os.environ, **env_extra)
    r = subprocess.run(["docker-compose", "-f", COMPOSE, "config"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    return r


def read(path):
    with open(path) as f:
        return f.read()


def load_yaml(text):
    import yaml
    return yaml.safe_load(text)


def mounts(svc):
    """container path -> host source (bind) or volume name."""
    out = {}
    for v in svc.get("volumes", []):
        parts = v.split(":")
        out[parts[1]] = parts[0]
    return out


def check_cluster(cfg, read_file=read, n_nodes=2):
    """Every problem that keeps `cfg` (docker-compose config, parsed) from
    being the intended cluster of `n_nodes` nodes; [] when there is none."""
    errs = []
    services = cfg.get("services", {})
    nets = cfg.get("networks", {})
    if len(nets) != 1:
        return [f"expected one network, got {sorted(nets)}"]
    net_name, net = next(iter(nets.items()))
    if net.get("driver") != "bridge":
        errs.append(f"network {net_name} is not a bridge")
    subnets = [c.get("subnet") for c in net.get("ipam", {}).get("config", [])]
    if len(subnets) != 1:
        return errs + [f"network {net_name}: expected one fixed subnet, got {subnets}"]
    subnet = ipaddress.IPv4Network(subnets[0])
    if not subnet.subnet_of(ipaddress.IPv4Network("198.18.0.0/15")):
        errs.append(f"network {net_name}: {subnet} is outside 198.18.0.0/15 (test networks)")
    if net.get("internal") is not True:
        errs.append(f"network {net_name} is not internal (a route out of the machine)")

    def addr(name):
        a = ((services[name].get("networks") or {}).get(net_name) or {}).get("ipv4_address")
        if a is None or ipaddress.IPv4Address(a) not in subnet:
            errs.append(f"{name}: address {a} is not fixed inside {subnet}")
        return a

    daemons = sorted(n for n, s in services.items()
                     if "/etc/hsdpd/node.yaml" in mounts(s))
    trainers = sorted(n for n in services if n not in daemons)
    if daemons != [f"hsdpd-node{i}" for i in range(n_nodes)]:
        errs.append(f"daemons: {daemons}, want hsdpd-node0..{n_nodes - 1}")
        return errs
    if trainers != [f"trainer-node{i}" for i in range(n_nodes)]:
        errs.append(f"trainers: {trainers}, want trainer-node0..{n_nodes - 1}")
        return errs
    addrs = {n: addr(n) for n in services}
    if len(set(addrs.values())) != len(addrs):
        errs.append(f"addresses are not distinct: {addrs}")
    secrets = cfg.get("secrets", {})
    nodes = {}
    for i, d in enumerate(daemons):
        svc = services[d]
        src = mounts(svc)["/etc/hsdpd/node.yaml"]
        want_dir = os.path.join(SRC, "deploy", "cluster", *(["4nodes"] if n_nodes == 4 else []))
        if os.path.basename(src) != f"node{i}.yaml" or os.path.dirname(src) != want_dir:
            errs.append(f"{d}: mounts {src}, want {want_dir}/node{i}.yaml")
        node = load_yaml(read_file(src))
        nodes[d] = node
        c = node.get("cluster") or {}
        port = str(c.get("listen", ":")).rsplit(":", 1)[-1]
        if c.get("coordinator") != f"{addrs['hsdpd-node0']}:{port}":
            errs.append(f"{d}: cluster.coordinator {c.get('coordinator')} is not "
                        f"hsdpd-node0's address {addrs['hsdpd-node0']}:{port}")
        if c.get("listen") != f"{addrs[d]}:{port}" or not port.isdigit():
            errs.append(f"{d}: cluster.listen {c.get('listen')} is not its address {addrs[d]}")
        if c.get("data_address") != addrs[d]:
            errs.append(f"{d}: cluster.data_address {c.get('data_address')} != {addrs[d]}")
        if c.get("nodes") != len(daemons):
            errs.append(f"{d}: cluster.nodes {c.get('nodes')} != {len(daemons)}")
        if c.get("node_rank") != i:
            errs.append(f"{d}: cluster.node_rank {c.get('node_rank')} != {i}")
        if c.get("insecure") or c.get("tls"):
            errs.append(f"{d}: expected token authentication only, not insecure/tls")
        token = str(c.get("token_file", ""))
        names = [s["source"] if isinstance(s, dict) else s for s in svc.get("secrets", [])]
        if not token.startswith(SECRET_DIR) or token[len(SECRET_DIR):] not in names:
            errs.append(f"{d}: cluster.token_file {token!r} is not one of its secrets {names}")
        elif token[len(SECRET_DIR):] not in secrets or "file" not in secrets[
                token[len(SECRET_DIR):]]:
            errs.append(f"{d}: secret {token[len(SECRET_DIR):]} has no file")
        if str(svc.get("image", "")).rsplit(":", 1)[0] != "hsdpd":
            errs.append(f"{d}: image {svc.get('image')}, want hsdpd (no torch)")
        if "hsdpctl" not in str(svc.get("healthcheck", {}).get("test")):
            errs.append(f"{d}: no hsdpctl health check")
    tokens = {nodes[d]["cluster"].get("token_file") for d in daemons if "cluster" in nodes[d]}
    if len(tokens) != 1:
        errs.append(f"the daemons use different token files: {tokens}")
    ranks = set()
    for i, t in enumerate(trainers):
        svc = services[t]
        d = daemons[i]
        env = svc.get("environment") or {}
        socket = (nodes[d].get("node") or {}).get("socket", "")
        m = mounts(svc)
        vol = m.get(os.path.dirname(socket))
        if vol is None or mounts(services[d]).get(os.path.dirname(socket)) != vol:
            errs.append(f"{t}: does not share {d}'s socket directory {os.path.dirname(socket)}")
        if env.get("HSDPD_SOCKET") != socket:
            errs.append(f"{t}: HSDPD_SOCKET {env.get('HSDPD_SOCKET')} != {d}'s {socket}")
        if str(svc.get("image", "")).rsplit(":", 1)[0] != "hsdpd-trainer":
            errs.append(f"{t}: image {svc.get('image')}, want hsdpd-trainer")
        if svc.get("ipc") != f"service:{d}":
            errs.append(f"{t}: ipc {svc.get('ipc')}, want service:{d}")
        if (svc.get("depends_on") or {}).get(d, {}).get("condition") != "service_healthy":
            errs.append(f"{t}: does not wait for {d} to be healthy")
        if env.get("WORLD_SIZE") != str(len(trainers)):
            errs.append(f"{t}: WORLD_SIZE {env.get('WORLD_SIZE')} != {len(trainers)}")
        ranks.add(env.get("RANK"))
        if env.get("MASTER_ADDR") != addrs["trainer-node0"]:
            errs.append(f"{t}: MASTER_ADDR {env.get('MASTER_ADDR')} is not trainer-node0's")
        if not env.get("HSDP_JOB_ID"):
            errs.append(f"{t}: no HSDP_JOB_ID")
    if ranks != {str(r) for r in range(len(trainers))}:
        errs.append(f"trainer ranks {sorted(map(str, ranks))} are not 0..{len(trainers) - 1}")
    return errs


class ComposeConfigTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hsdp-compose-")
        cls.token = os.path.join(cls.tmp, "token")
        fd = os.open(cls.token, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"compose config test token\n")
        os.close(fd)
        r = compose_config({"HSDP_CLUSTER_TOKEN_FILE": cls.token})
        if r.returncode != 0:
            raise AssertionError(f"docker-compose config failed:\n{r.stderr}")
        cls.cfg = load_yaml(r.stdout)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_is_a_two_node_cluster(self):
        self.assertEqual(check_cluster(self.cfg), [])

    def test_the_four_node_override(self):
        r = subprocess.run(["docker-compose", "-f", COMPOSE, "-f", COMPOSE4, "config"],
                           env=dict(os.environ, HSDP_CLUSTER_TOKEN_FILE=self.token),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        cfg = load_yaml(r.stdout)
        self.assertEqual(check_cluster(cfg, n_nodes=4), [])
        for i in range(4):
            argv = cfg["services"][f"trainer-node{i}"]["entrypoint"]
            self.assertIn("--hsdp", argv)
            self.assertEqual(argv[argv.index("--world") + 1], "4")
        self.assertTrue(check_cluster(cfg, n_nodes=2))  # not the two-node cluster
        if HSDPD:
            for i in range(4):
                path = os.path.join(SRC, "deploy", "cluster", "4nodes", f"node{i}.yaml")
                c = subprocess.run([HSDPD, "--check-config", path], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, timeout=60)
                self.assertEqual(c.returncode, 0, f"{path}: {c.stdout}")

    def test_expected_addresses(self):
        want = {"hsdpd-node0": "198.18.77.10", "hsdpd-node1": "198.18.77.11",
                "trainer-node0": "198.18.77.20", "trainer-node1": "198.18.77.21"}
        got = {n: s["networks"]["cluster"]["ipv4_address"]
               for n, s in self.cfg["services"].items()}
        self.assertEqual(got, want)
        self.assertEqual(self.cfg["networks"]["cluster"]["ipam"]["config"][0]["subnet"],
                         "198.18.77.0/24")

    def test_token_is_a_secret_file(self):
        self.assertEqual(self.cfg["secrets"]["cluster-token"]["file"], self.token)
        # Without the variable it is deploy/cluster/cluster-token, which git ignores.
        r = compose_config({"HSDP_CLUSTER_TOKEN_FILE": ""})
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(load_yaml(r.stdout)["secrets"]["cluster-token"]["file"],
                         os.path.join(SRC, "deploy", "cluster", "cluster-token"))
        with open(os.path.join(SRC, "deploy", "cluster", ".gitignore")) as f:
            self.assertIn("cluster-token", f.read().split())

    def test_node_yamls_pass_check_config(self):
        if not HSDPD:
            self.skipTest("no hsdpd binary given")
        for i in range(2):
            path = os.path.join(SRC, "deploy", "cluster", f"node{i}.yaml")
            r = subprocess.run([HSDPD, "--check-config", path], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=60)
            self.assertEqual(r.returncode, 0, f"{path}: {r.stdout}")

    def test_the_netns_runner_sees_the_same_topology(self):
        import netns_compose
        model = netns_compose.load(self.cfg, SRC, os.path.join(SRC, "build"))
        self.assertEqual([d.name for d in model["nodes"]], ["hsdpd-node0", "hsdpd-node1"])
        self.assertEqual([netns_compose.node_addresses(model, d) for d in model["nodes"]],
                         [["198.18.77.10", "198.18.77.20"], ["198.18.77.11", "198.18.77.21"]])
        for name in ("trainer-node0", "trainer-node1"):
            t = model["services"][name]
            self.assertIs(t.node, model["services"][name.replace("trainer", "hsdpd")])
            # The trainer's program is a file of this checkout, copied into the image.
            script = netns_compose.host_path(model, t, t.argv[1], "/nonexistent")
            self.assertEqual(script, os.path.join(SRC, "tools", "demo", "train_demo.py"))

    def test_the_checker_catches_broken_clusters(self):
        def broken(edit):
            cfg = copy.deepcopy(self.cfg)
            edit(cfg)
            return check_cluster(cfg)

        s = lambda cfg, n: cfg["services"][n]  # noqa: E731
        self.assertTrue(broken(lambda c: s(c, "hsdpd-node1").pop("secrets")))
        self.assertTrue(broken(lambda c: s(c, "trainer-node1")["environment"].update(RANK="0")))
        self.assertTrue(broken(lambda c: s(c, "hsdpd-node1")["networks"]["cluster"].update(
            ipv4_address="198.18.77.10")))
        self.assertTrue(broken(lambda c: s(c, "trainer-node0").update(ipc="service:hsdpd-node1")))
        self.assertTrue(broken(lambda c: c["services"].pop("hsdpd-node1")))
        self.assertTrue(broken(lambda c: c["networks"]["cluster"].pop("internal")))
        self.assertTrue(broken(lambda c: c["networks"]["cluster"]["ipam"]["config"][0].update(
            subnet="172.30.77.0/24")))
        self.assertTrue(broken(lambda c: s(c, "trainer-node0").update(image="hsdpd:latest")))

        def swap_yaml(c):  # node 1 mounts node 0's file: listen and rank are wrong
            vols = s(c, "hsdpd-node1")["volumes"]
            s(c, "hsdpd-node1")["volumes"] = [v.replace("node1.yaml", "node0.yaml") for v in vols]
        errs = broken(swap_yaml)
        self.assertTrue(any("cluster.listen" in e for e in errs), errs)
        self.assertTrue(any("node_rank" in e for e in errs), errs)
        insecure = check_cluster(self.cfg, read_file=lambda p: read(p).replace(
            "token_file:", "insecure: true\n  x_token_file:"))
        self.assertTrue(any("token" in e for e in insecure), insecure)


if __name__ == "__main__":
    if shutil.which("docker-compose") is None:
        print("SKIP: docker-compose is not installed (tools/scripts/bootstrap.sh installs it)")
        sys.exit(77)
    try:
        import yaml  # noqa: F401
    except ImportError:
        print("SKIP: python3-yaml is not installed (tools/scripts/bootstrap.sh installs it)")
        sys.exit(77)
    prog = unittest.main(argv=[sys.argv[0], "-v"], exit=False)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
