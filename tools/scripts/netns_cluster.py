#!/usr/bin/python3
"""Runs deploy/docker-compose.yml's cluster as processes in network namespaces.

    sudo tools/scripts/netns_cluster.py [--compose deploy/docker-compose.yml]
        [--build-dir build] [--timeout 240] [--set cluster.heartbeat_ms=200 ...]
        [--keep DIR]

No Docker engine needed: the topology comes from `docker-compose config`
(every value resolved as Docker would use it; see netns_compose.py). Each
daemon service is a node: a network namespace holding the compose
addresses of the daemon and of its trainers, joined to the others through a
bridge (netns_topology.py). The daemons run from this build (the image's
entrypoint with its node.yaml, whose container paths are rewritten to a
private run directory: socket volume, token secret; the image's files are
its COPY'd files and, for a RUN that installs the Debian package, this
build's `cmake --install` into the run directory), the trainers run their
compose command and environment in their node's namespace once the
services they depend on are started / healthy (their health check, run
there). `--set KEY=VALUE` overrides a node.yaml key on every node (a test's
short heartbeats).

Exit status 0 when every trainer exited 0 within --timeout and no daemon
died meanwhile, 1 otherwise (with each service's log tail), 2 for a bad
compose file, 77 when network namespaces cannot be created here (e.g. not
root). Namespaces, veths and every process are removed on every exit,
including a failure, a timeout, SIGINT or SIGTERM.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_compose  # noqa: E402
import netns_topology  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SKIP = 77
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


class Stop(Exception):
    pass


def _install_package(build_dir, root):
    """{container path: host path} of the Debian package's files: this build
    installed as the package installs it (`cmake --install --prefix /usr`
    with DESTDIR=root: /usr/bin, /usr/lib, /etc/hsdpd, /lib/systemd)."""
    r = subprocess.run(["cmake", "--install", build_dir, "--prefix", "/usr"],
                       env=dict(os.environ, DESTDIR=root), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    if r.returncode != 0:
        raise netns_compose.ComposeError(f"cmake --install {build_dir} failed:\n"
                                         f"{r.stdout[-2000:]}")
    files = {}
    for dp, _, fs in os.walk(root):
        for f in fs:
            path = os.path.join(dp, f)
            files["/" + os.path.relpath(path, root)] = path
    return files


def add_run_files(model, dockerfile, build_dir, run_dir):
    """Adds to each stage of model["images"] the files of the Debian package
    its RUN lines install (netns_compose maps COPY and the RUN that copies a
    stage's files, `--mount=type=bind,from=STAGE,target=T ... cp -a T/. /`):
    `RUN --mount=type=bind,source=build/packages,... dpkg -i ...` installs
    this build (_install_package). Any other RUN: ComposeError."""
    with open(dockerfile) as f:
        lines = f.read().replace("\\\n", " ").splitlines()
    stages = model["images"]
    added = {}
    package = None
    stage = None
    for line in lines:
        word, _, rest = line.strip().partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            stage = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else None
            if stage is not None:
                added[stage] = dict(added.get(parts[0], {}))
            continue
        if word != "RUN" or stage is None:
            continue
        args = rest.split()
        mounts = []
        while args and args[0].startswith("--mount="):
            mounts.append(dict(kv.partition("=")[::2] for kv in args.pop(0)[8:].split(",")))
        cmd = " ".join(args)
        for m in mounts:
            if m.get("type") != "bind":
                raise netns_compose.ComposeError(f"{dockerfile}: RUN mount {m}: not a bind mount")
            if m.get("source") == "build/packages" and "dpkg -i" in cmd:
                if package is None:
                    package = _install_package(build_dir, os.path.join(run_dir, "package"))
                added[stage].update(package)
            elif m.get("from") in stages and f"cp -a {m.get('target')}/. /" in cmd:
                pass  # a stage's files: netns_compose.parse_dockerfile maps them
            else:
                raise netns_compose.ComposeError(f"{dockerfile}: cannot map RUN {rest[:120]}")
    for name, files in added.items():
        if name in stages:
            for target, host in files.items():
                stages[name]["files"].setdefault(target, host)


def _on_signal(signum, _frame):
    raise Stop(f"signal {signum}")


def _set_key(doc, dotted, value):
    keys = dotted.split(".")
    cur = doc
    for k in keys[:-1]:
        cur = cur.setdefault(k, {})
    cur[keys[-1]] = yaml.safe_load(value)


def _map_value(model, svc, value, run_dir):
    """`value` with container paths (also in PATH-like lists) made local."""
    if not isinstance(value, str) or not value.startswith("/"):
        return value
    parts = value.split(":")
    out = []
    for p in parts:
        h = netns_compose.host_path(model, svc, p, run_dir) if p.startswith("/") else None
        out.append(h if h is not None else p)
    return ":".join(out)


def _rewrite_tree(model, svc, node, run_dir):
    if isinstance(node, dict):
        return {k: _rewrite_tree(model, svc, v, run_dir) for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite_tree(model, svc, v, run_dir) for v in node]
    return _map_value(model, svc, node, run_dir)


class Runner:
    def __init__(self, model, run_dir, overrides, timeout_s):
        self.model = model
        self.run_dir = run_dir
        self.overrides = overrides
        self.timeout_s = timeout_s
        self.owner = os.getpid()
        self.topology = None
        self.procs = {}  # service name -> Popen
        self.logs = {}
        self.namespaces = {}  # daemon service name -> namespace

    # --- files -------------------------------------------------------------
    def prepare(self):
        for vol in {v for s in self.model["services"].values() for v in s.named_volumes()}:
            os.makedirs(os.path.join(self.run_dir, "volumes", vol), exist_ok=True)
        for svc in self.model["services"].values():
            for kind, src in svc.mounts.values():
                if kind != "secret":
                    continue
                file = self.model["secrets"].get(src)
                if not file or not os.path.isfile(file):
                    raise netns_compose.ComposeError(
                        f"secret {src}: file {file} does not exist (generate it, see "
                        f"docs/cluster.md)")
                dest = os.path.join(self.run_dir, "secrets", svc.name, src)
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                with open(file, "rb") as f:
                    data = f.read()
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
        for d in self.model["nodes"]:
            src = netns_compose.host_path(self.model, d, d.node_config, self.run_dir)
            with open(src) as f:
                doc = yaml.safe_load(f) or {}
            doc = _rewrite_tree(self.model, d, doc, self.run_dir)
            for k, v in self.overrides:
                _set_key(doc, k, v)
            dest = os.path.join(self.run_dir, d.name, "node.yaml")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "w") as f:
                yaml.safe_dump(doc, f, sort_keys=False)
            d.local_config = dest

    def argv_of(self, svc, argv):
        out = []
        for i, a in enumerate(argv):
            if i == 0 and a in ("python3", "python") and os.environ.get("HSDP_PYTHON"):
                # The image's python has torch: here, the project's environment
                # (build/venv, tools/scripts/python_env.sh).
                a = os.environ["HSDP_PYTHON"]
            elif i == 0 and not a.startswith("/"):
                # The image's PATH first (its binaries are this build's).
                for d in svc.image["env"].get(
                        "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin").split(":"):
                    h = netns_compose.host_path(self.model, svc, f"{d}/{a}", self.run_dir)
                    if h and os.path.exists(h):
                        a = h
                        break
                else:
                    # Not the image's own: a Debian package's program, as in
                    # the image (never whatever /usr/local or $PATH has here).
                    a = shutil.which(a, path=SYSTEM_PATH) or a
            elif i > 0 and argv[i - 1] == "--node-config" and svc.node_config:
                a = svc.local_config
            else:
                a = _map_value(self.model, svc, a, self.run_dir)
            out.append(a)
        return out

    def env_of(self, svc):
        env = {"PATH": SYSTEM_PATH,
               "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
        for k, v in svc.image["env"].items():
            if k != "PATH":
                env[k] = _map_value(self.model, svc, v, self.run_dir)
        for k, v in (svc.spec.get("environment") or {}).items():
            env[k] = _map_value(self.model, svc, str(v if v is not None else ""), self.run_dir)
        return env

    # --- processes ---------------------------------------------------------
    def start(self, svc):
        ns = self.namespaces[svc.node.name]
        argv = [netns_topology.IP, "netns", "exec", ns] + self.argv_of(svc, svc.argv)
        log_path = os.path.join(self.run_dir, f"{svc.name}.log")
        self.logs[svc.name] = log_path
        log = open(log_path, "ab")
        print(f"netns: start {svc.name} in {ns} ({', '.join(svc.addresses)}): "
              f"{' '.join(argv[4:])}", flush=True)
        # `ip netns exec` execs the command in place: the pid is the service's.
        self.procs[svc.name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=self.env_of(svc),
                                                start_new_session=True)
        log.close()

    def healthy(self, svc, deadline):
        hc = svc.spec.get("healthcheck")
        if not hc or hc.get("disable"):
            return True
        test = hc["test"]
        if test[0] == "CMD-SHELL":
            cmd = ["/bin/sh", "-c", test[1]]
        elif test[0] == "CMD":
            cmd = self.argv_of(svc, test[1:])
        else:
            return True
        ns = self.namespaces[svc.node.name]
        while time.monotonic() < deadline:
            if self.procs[svc.name].poll() is not None:
                raise Stop(f"{svc.name} exited with {self.procs[svc.name].returncode} "
                           f"before it was healthy")
            r = subprocess.run([netns_topology.IP, "netns", "exec", ns] + cmd,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=self.env_of(svc), timeout=30)
            if r.returncode == 0:
                return True
            time.sleep(0.2)
        raise Stop(f"{svc.name} was not healthy within the deadline")

    def run(self):
        start = time.monotonic()
        deadline = start + self.timeout_s
        nodes = self.model["nodes"]
        self.prepare()
        self.topology = netns_topology.up(
            self.owner, [netns_compose.node_addresses(self.model, d) for d in nodes],
            self.model["prefix_len"])
        for d, n in zip(nodes, self.topology["nodes"]):
            self.namespaces[d.name] = n["namespace"]
            print(f"netns: node {d.name}: namespace {n['namespace']}, "
                  f"{', '.join(n['addresses'])}", flush=True)
        # Start in dependency order; a dependency on a healthy service waits
        # for its health check (bounded by the deadline).
        pending = dict(self.model["services"])
        healthy = set()
        while pending:
            ready = [s for s in pending.values()
                     if all(dep in self.procs for dep in (s.spec.get("depends_on") or {}))]
            if not ready:
                raise netns_compose.ComposeError(f"depends_on cycle among {sorted(pending)}")
            for s in sorted(ready, key=lambda s: s.name):
                for dep, cond in (s.spec.get("depends_on") or {}).items():
                    if (cond or {}).get("condition") == "service_healthy" and dep not in healthy:
                        self.healthy(self.model["services"][dep], deadline)
                        healthy.add(dep)
                self.start(s)
                del pending[s.name]
        trainers = [s for s in self.model["services"].values() if not s.node_config]
        daemons = [s for s in self.model["services"].values() if s.node_config]
        failed = []
        while time.monotonic() < deadline:
            for d in daemons:
                if self.procs[d.name].poll() is not None:
                    failed.append(f"daemon {d.name} exited with {self.procs[d.name].returncode}")
            if failed or all(self.procs[t.name].poll() is not None for t in trainers):
                break
            time.sleep(0.1)
        for t in trainers:
            rc = self.procs[t.name].poll()
            if rc is None:
                failed.append(f"trainer {t.name} still running after {self.timeout_s:.0f} s")
            elif rc != 0:
                failed.append(f"trainer {t.name} exited with {rc}")
        elapsed = time.monotonic() - start
        return failed, elapsed

    def stop(self):
        """Stops every process (SIGTERM, then SIGKILL) and removes the namespaces."""
        for name, p in self.procs.items():
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        end = time.monotonic() + 10
        for name, p in self.procs.items():
            try:
                p.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass  # down() below kills whatever is left in the namespaces
        netns_topology.down(self.owner)

    def tails(self, lines=25):
        out = []
        for name, path in sorted(self.logs.items()):
            try:
                with open(path, errors="replace") as f:
                    text = f.read().splitlines()
            except OSError:
                continue
            out.append(f"--- {name} (last {lines} lines) ---")
            out += text[-lines:]
        return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compose", default=os.path.join(ROOT, "deploy", "docker-compose.yml"))
    ap.add_argument("--build-dir", default=os.environ.get("HSDP_BUILD_DIR",
                                                          os.path.join(ROOT, "build")))
    ap.add_argument("--timeout", type=float, default=240,
                    help="seconds for the whole run (start, health, trainers)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a node.yaml key on every node (e.g. cluster.heartbeat_ms=200)")
    ap.add_argument("--keep", metavar="DIR", help="run directory to use and keep (logs)")
    ap.add_argument("--docker-compose", default="docker-compose")
    args = ap.parse_args(argv)
    overrides = []
    for s in args.set:
        k, eq, v = s.partition("=")
        if not eq or not k:
            ap.error(f"--set {s}: expected KEY=VALUE")
        overrides.append((k, v))
    why = netns_topology.probe()
    if why:
        print(f"SKIP: network namespaces cannot be created here: {why}")
        return SKIP
    try:
        config = netns_compose.compose_config(args.compose, args.docker_compose)
        model = netns_compose.load(config, ROOT, os.path.abspath(args.build_dir))
    except (netns_compose.ComposeError, ValueError, KeyError) as e:
        print(f"netns_cluster: {args.compose}: {e}", file=sys.stderr)
        return 2
    run_dir = args.keep or tempfile.mkdtemp(prefix="hsdpnet-")
    os.makedirs(run_dir, exist_ok=True)
    try:
        add_run_files(model, os.path.join(ROOT, "deploy", "Dockerfile"),
                      os.path.abspath(args.build_dir), run_dir)
    except (netns_compose.ComposeError, OSError) as e:
        print(f"netns_cluster: deploy/Dockerfile: {e}", file=sys.stderr)
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        return 2
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    runner = Runner(model, run_dir, overrides, args.timeout)
    failed = []
    try:
        failed, elapsed = runner.run()
    except (Stop, netns_compose.ComposeError, netns_topology.TopologyError, OSError) as e:
        failed, elapsed = [f"{type(e).__name__}: {e}"], 0.0
    finally:
        # The cleanup itself is bounded (about 15 s): a second signal must
        # not interrupt it halfway and leave namespaces behind.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            runner.stop()
        except netns_topology.TopologyError as e:
            failed.append(f"cleanup: {e}")
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    if failed:
        print(runner.tails())
        print("netns cluster FAILED:\n  " + "\n  ".join(failed))
    else:
        print(f"netns cluster OK: {len(model['nodes'])} nodes, every trainer exited 0 "
              f"in {elapsed:.1f} s")
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
