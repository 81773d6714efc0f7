"""The chaos run's Docker mode (--docker): every process of the cluster is a
container of the project's images on a real engine, the nodes on a Docker
bridge network, as deploy/docker-compose.yml runs them.

    pods = Pods(owner=os.getpid(), nodes=3, build=BUILD, tag=TAG)  # up
    pods.spawner(i, "hsdpd")   # argv, log -> a started Container in node i's pod
    pods.rank_spawner()        # the ranks' containers (job.py)
    pods.set_link(i, False); pods.shape(i); pods.down()

Node i is a pod, the way Kubernetes makes one: a container that only holds
the node's network namespace (`hsdpc<owner>-n<i>`, `sleep infinity` in the
hsdpd image, on the internal network `hsdpc<owner>` at 198.18.42.(10+i)),
and beside it, in that namespace (`--network container:`), the node's daemon
(the image's own /usr/bin/hsdpd) and with --store etcd its etcd member
(build/third_party/etcd, mounted read-only). A daemon killed or drained
stops its own container only; `docker start` brings it back in the same
namespace, with the same address. Each rank is a container of the trainer
image; over hsdpd it has no network at all (`--network none`): it reaches
its daemon through the socket in its node's directory and meets the other
ranks in a file store, as in the other modes. Over Gloo it joins its node's
pod (the ranks' own traffic then crosses the node's link).

Every container bind-mounts the run's directory at its own path, so logs,
sockets, checkpoints and progress are where the supervisor reads them; the
ranks also mount tools/ and BUILD/python (the code under test) at their
paths and torch's site-packages read-only (docker_images.torch_site), and
run the image's python3 (Debian's 3.11, the project environment's own).

The faults, the Docker way: a process is `docker kill`ed (-s KILL, STOP,
CONT) and `docker start`ed again; link_down sets the host's end of the
pod's veth down (a cable pulled: the node sees silence, not a vanished
interface); link_slow shapes the pod's eth0 and that veth (net.py's qdiscs).

Containers and the network carry the label org.hsdpd.chaos=<owner pid>;
Pods() first removes those whose owner no longer runs (a run killed with
SIGKILL), and Pods.down() removes its own on every exit of chaos.py.
Containers are created once (with the vfs storage driver every container is
a full copy of its image) and started again for every restart.
"""
import os
import shlex
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "scripts"))
import docker_engine  # noqa: E402
import docker_images  # noqa: E402
import net as net_mod  # noqa: E402 - the qdiscs of link_slow

SUBNET = "198.18.42"
LABEL = "org.hsdpd.chaos"
DOCKER = docker_engine.docker_cli()
IP = net_mod.IP


class DockerError(RuntimeError):
    pass


def docker(*args, timeout=120, check=True):
    r = subprocess.run([DOCKER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise DockerError(f"docker {' '.join(args[:3])}...: exit {r.returncode}: "
                          f"{r.stderr.strip()[-2000:]}")
    return r


def probe():
    """None when an engine answers here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if not docker_engine.answers():
        return f"no Docker engine answers on {docker_engine.SOCKET} " \
               "(tools/scripts/docker_engine.py start DIR)"
    return None


def _start_ticks(pid):
    """The process's start time in clock ticks, None if gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] in ("Z", "X") else fields[19]


class Container:
    """One container, used as subprocess.Popen is (pid, poll, wait,
    send_signal, kill, terminate): each start() runs its command again; pid is
    the host's pid of its first process; an exit by signal s reads as -s."""

    def __init__(self, name, owner, image, create_args, argv):
        self.name, self.owner, self.image = name, owner, image
        self.create_args, self.argv = list(create_args), list(argv)
        self.created = False
        self.pid, self._ticks, self.returncode = None, None, None

    def start(self):
        if not self.created:
            docker("rm", "-f", self.name, check=False)
            docker("create", "--name", self.name, "--label", f"{LABEL}={self.owner}",
                   *self.create_args, self.image, *self.argv, timeout=600)
            self.created = True
        docker("start", self.name)
        pid = int(docker("inspect", "-f", "{{.State.Pid}}", self.name).stdout.strip() or 0)
        self.pid, self.returncode = pid, None
        self._ticks = _start_ticks(pid) if pid > 0 else None
        return self

    def poll(self):
        if self.returncode is not None:
            return self.returncode
        if self.pid and self._ticks is not None and _start_ticks(self.pid) == self._ticks:
            return None
        # Gone: the engine has its exit code once it noticed (docker wait).
        r = docker("wait", self.name, timeout=60, check=False)
        try:
            code = int(r.stdout.strip())
        except ValueError:
            code = 255
        self.returncode = -(code - 128) if 128 < code < 160 else code
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            docker("kill", "-s", str(int(sig)), self.name, check=False)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def remove(self):
        if self.created:
            docker("rm", "-f", self.name, check=False)
            self.created = False


def sweep():
    """Removes the containers and networks of chaos runs whose owner is gone."""
    for kind in ("container", "network"):
        ls = "ps" if kind == "container" else "ls"
        extra = ["-a"] if kind == "container" else []
        r = docker(kind, ls, *extra, "--filter", f"label={LABEL}", "--format",
                   f'{{{{.ID}}}} {{{{.Label "{LABEL}"}}}}', check=False)
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                continue
            if not os.path.exists(f"/proc/{parts[1]}"):
                docker(kind, "rm", *(["-f"] if kind == "container" else []), parts[0],
                       check=False)


class Pods:
    def __init__(self, owner, nodes, build, tag, root):
        """Creates the network and starts node i's pod for every i (images
        hsdpd:<tag> and hsdpd-trainer:<tag>, docker_images.py)."""
        self.owner, self.build, self.root = owner, build, root
        self.images = {"hsdpd": f"hsdpd:{tag}", "trainer": f"hsdpd-trainer:{tag}"}
        for ref in self.images.values():
            if docker("image", "inspect", ref, check=False).returncode != 0:
                raise DockerError(f"no image {ref}: tools/scripts/docker_images.py build "
                                  f"--build-dir {build} --tag {tag}")
        self.torch_site = docker_images.torch_site(build)
        sweep()
        self.network = f"hsdpc{owner}"
        self.addrs = [f"{SUBNET}.{10 + i}" for i in range(nodes)]
        self.containers = {}
        self.launch_dir = os.path.join(root, "launch")
        os.makedirs(self.launch_dir, exist_ok=True)
        docker("network", "create", "--internal", "--subnet", f"{SUBNET}.0/24",
               "--label", f"{LABEL}={owner}", self.network)
        try:
            self.pods = [self._container(f"n{i}", self.images["hsdpd"],
                                         ["--network", self.network, "--ip", self.addrs[i],
                                          "--hostname", f"node{i}", "--entrypoint", "sleep"],
                                         ["infinity"]).start() for i in range(nodes)]
            self.veths = [self._host_veth(i) for i in range(nodes)]
            self.shaping = self._probe_netem()
        except BaseException:
            self.down()
            raise

    def _container(self, role, image, create_args, argv):
        c = self.containers.get(role)
        if c is None:
            c = Container(f"hsdpc{self.owner}-{role}", self.owner, image, create_args, argv)
            self.containers[role] = c
        return c

    def _launch(self, role, image, create_args, argv, log_path, env=None):
        """Starts `argv` (with `env`, its output appended to log_path) in the
        container of `role`. The container runs a launch script the
        supervisor rewrites before every start, so one container serves every
        start, whatever its command line this time (an etcd member restarts
        with --initial-cluster-state existing, a rank with the incarnation's
        job id)."""
        script = os.path.join(self.launch_dir, f"{role}.sh")
        with open(script, "w") as f:
            for k, v in sorted((env or {}).items()):
                f.write(f"export {k}={shlex.quote(v)}\n")
            f.write("exec " + " ".join(shlex.quote(a) for a in argv) +
                    f" >>{shlex.quote(log_path)} 2>&1\n")
        return self._container(role, image, [*create_args, "--entrypoint", "/bin/sh"],
                               [script]).start()

    def _in_pod(self, i):
        return ["nsenter", "-t", str(self.pods[i].pid), "-n"]

    def prefix(self, i):
        """Runs a host command in node i's network namespace (etcdctl's health check)."""
        return self._in_pod(i)

    def _run(self, cmd):
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           timeout=20)
        if r.returncode != 0:
            raise net_mod.NetError(f"{' '.join(cmd)}: {r.stderr.strip() or r.returncode}")
        return r.stdout

    def _host_veth(self, i):
        """The host's end of pod i's eth0 (its peer's index names it)."""
        line = self._run(self._in_pod(i) + [IP, "-o", "link", "show", "eth0"])
        peer = line.split(":")[1].strip().split("@if")[1]
        for row in self._run([IP, "-o", "link"]).splitlines():
            if row.split(":")[0].strip() == peer:
                return row.split(":")[1].strip().split("@")[0]
        raise net_mod.NetError(f"pod {i}: no host interface with index {peer}")

    def _probe_netem(self):
        r = subprocess.run(self._in_pod(0) + ["tc", "qdisc", "add", "dev", "lo", "root", "netem",
                                              "delay", "1ms"], capture_output=True, text=True,
                           timeout=20)
        if r.returncode != 0:
            return "tbf"
        self._run(self._in_pod(0) + ["tc", "qdisc", "del", "dev", "lo", "root"])
        return "netem"

    def _mounts(self, *paths, ro=()):
        out = []
        for p in paths:
            out += ["-v", f"{p}:{p}"]
        for p in ro:
            out += ["-v", f"{p}:{p}:ro"]
        return out

    def spawner(self, i, role):
        """spawn(argv, log_path) -> a started Container running argv in node i's
        pod: role "hsdpd" (argv[0] the image's hsdpd) or "etcd" (argv[0]
        build/third_party/etcd's, mounted read-only)."""
        ro = [os.path.join(self.build, "third_party", "etcd")] if role == "etcd" else []
        create = ["--network", f"container:{self.pods[i].name}",
                  *self._mounts(self.root, ro=ro)]
        return lambda argv, log_path: self._launch(f"n{i}-{role}", self.images["hsdpd"],
                                                   create, argv, log_path)

    def rank_spawner(self):
        """spawn(rank, node, argv, env, log_path, gloo) -> a started Container of
        the trainer image running `python3 argv...` with env: over Gloo in node
        `node`'s pod, else without a network."""
        ro = [os.path.join(ROOT, "tools"), os.path.join(self.build, "python")]

        def spawn(rank, node, argv, env, log_path, gloo):
            network = f"container:{self.pods[node].name}" if gloo else "none"
            return self._launch(f"rank{rank}{'-gloo' if gloo else ''}", self.images["trainer"],
                                ["--network", network, *self._mounts(self.root, ro=ro),
                                 "-v", f"{self.torch_site}:{docker_images.TORCH_MOUNT}:ro"],
                                ["python3", *argv], log_path, env)
        return spawn

    def port(self, i):
        """What link_down takes down for node i (the report names it)."""
        return f"host veth {self.veths[i]}"

    def set_link(self, i, up):
        self._run([IP, "link", "set", self.veths[i], "up" if up else "down"])

    def _qdisc_targets(self, i):
        return [(self._in_pod(i), "eth0"), ([], self.veths[i])]

    def shape(self, i):
        q = net_mod.NETEM if self.shaping == "netem" else net_mod.TBF
        for pre, dev in self._qdisc_targets(i):
            self._run(pre + ["tc", "qdisc", "replace", "dev", dev, "root", *q])
        return " ".join(q)

    def unshape(self, i):
        for pre, dev in self._qdisc_targets(i):
            subprocess.run(pre + ["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True,
                           timeout=20)

    def down(self):
        """Every container and the network of this run."""
        r = docker("ps", "-aq", "--filter", f"label={LABEL}={self.owner}", check=False)
        ids = r.stdout.split()
        if ids:
            docker("rm", "-f", *ids, timeout=300, check=False)
        docker("network", "rm", self.network, check=False)
