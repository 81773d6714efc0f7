"""The model of a compose cluster that tools/scripts/netns_cluster.py runs.

Reads what `docker-compose config` prints (the file with every default,
variable and relative path resolved) and the image's Dockerfile, and turns
them into nodes: one per daemon service (a service whose command passes
`--node-config`), with the trainers that share its IPC or network namespace
or a named volume, the fixed addresses of each on the compose network, and
per service the command, environment, health check and the files it sees,
mapped from container paths to paths on this machine:

- the files of the service's image (the deploy/Dockerfile stage its image is
  named after: hsdpd, hsdpd-trainer), from its `COPY` lines, where `build/...`
  is the local build directory and other sources are in the checkout (the
  context tools/scripts/docker_images.py stages has the same paths);
- named volumes (a directory per volume under the run directory), bind
  mounts (their host path), secrets (a private 0600 copy under
  /run/secrets/<target>).

Stdlib and PyYAML (Debian's python3-yaml, which docker-compose needs too).
"""
import ipaddress
import json
import os
import posixpath
import shlex
import subprocess

import yaml


class ComposeError(RuntimeError):
    pass


def compose_config(compose_file, docker_compose="docker-compose"):
    """`docker-compose -f FILE config`, parsed."""
    try:
        r = subprocess.run([docker_compose, "-f", compose_file, "config"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    except FileNotFoundError as e:
        raise ComposeError(f"{docker_compose} is not installed ({e})") from e
    if r.returncode != 0:
        raise ComposeError(f"docker-compose config failed: {r.stderr.strip()}")
    return yaml.safe_load(r.stdout)


def _json_or_shell(rest):
    rest = rest.strip()
    if rest.startswith("["):
        return json.loads(rest)
    return ["/bin/sh", "-c", rest]


def _stage_files(src, dest, context, build_dir):
    """{container path: host path} of one COPY source: `build/...` is the
    local build directory (docker_images.py stages it so), anything else the
    checkout."""
    if src == "build" or src.startswith("build/"):
        host = os.path.join(build_dir, src[len("build"):].lstrip("/"))
    else:
        host = os.path.join(context, src)
    target = (posixpath.join(dest, posixpath.basename(src.rstrip("/")))
              if dest.endswith("/") and not src.endswith("/") else dest)
    return target, host


def parse_dockerfile(path, context, build_dir):
    """Every stage's ENV, ENTRYPOINT, CMD and COPY'd files.

    Returns {stage name: {"env": {...}, "entrypoint": [...], "cmd": [...],
    "files": {container_path: host_path}}} (paths of files or directories).
    A stage FROM another stage starts with its values; `COPY --from=STAGE`
    takes the files STAGE copied (only `/` to `/` is supported)."""
    with open(path) as f:
        lines = f.read().replace("\\\n", " ").splitlines()
    stages = {}
    img = None
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            parts = rest.split()
            parent = stages.get(parts[0])
            img = (json.loads(json.dumps(parent)) if parent else
                   {"env": {}, "entrypoint": [], "cmd": [], "files": {}})
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else str(len(stages))
            stages[name] = img
        elif img is None:
            continue
        elif word == "ENV":
            parts = shlex.split(rest)
            if len(parts) == 2 and "=" not in parts[0]:
                img["env"][parts[0]] = parts[1]
            else:
                for p in parts:
                    k, _, v = p.partition("=")
                    img["env"][k] = v
        elif word == "ENTRYPOINT":
            img["entrypoint"] = _json_or_shell(rest)
            img["cmd"] = []
        elif word == "CMD":
            img["cmd"] = _json_or_shell(rest)
        elif word == "RUN":
            # `RUN --mount=type=bind,from=STAGE,target=T ... cp -a T/. /`
            # copies STAGE's files (deploy/Dockerfile's trainer: one layer).
            # Other RUNs (the package install): netns_cluster.add_run_files.
            args = rest.split()
            while args and args[0].startswith("--mount="):
                m = dict(kv.partition("=")[::2] for kv in args.pop(0)[8:].split(","))
                if m.get("from") in stages and f"cp -a {m.get('target')}/. /" in " ".join(args):
                    img["files"].update(stages[m["from"]]["files"])
        elif word == "COPY":
            args = shlex.split(rest)
            from_stage = None
            while args and args[0].startswith("--"):
                if args[0].startswith("--from="):
                    from_stage = args[0][len("--from="):]
                args = args[1:]
            *srcs, dest = args
            if from_stage is not None:
                if from_stage not in stages or srcs != ["/"] or dest != "/":
                    raise ComposeError(f"{path}: cannot map COPY --from={from_stage} {srcs}")
                img["files"].update(stages[from_stage]["files"])
                continue
            for src in srcs:
                target, host = _stage_files(src, dest, context, build_dir)
                img["files"][target] = host
    return stages


class Service:
    """One compose service as the runner starts it."""

    def __init__(self, name, spec):
        self.name = name
        self.spec = spec
        self.addresses = []
        self.mounts = {}  # container path -> ("volume"|"bind"|"secret", source)
        self.argv = []
        self.node_config = None  # the container path after --node-config
        self.node = None  # the daemon service of its node

    def shared_with(self):
        """Services whose IPC or network namespace this one joins."""
        out = []
        for key in ("ipc", "network_mode"):
            v = self.spec.get(key) or ""
            if v.startswith("service:"):
                out.append(v[len("service:"):])
        return out

    def named_volumes(self):
        return {src for kind, src in self.mounts.values() if kind == "volume"}


def _parse_mounts(svc, spec):
    for v in spec.get("volumes", []):
        if isinstance(v, dict):
            kind = "bind" if v.get("type") == "bind" else "volume"
            svc.mounts[v["target"]] = (kind, v["source"])
            continue
        parts = v.split(":")
        src, target = parts[0], parts[1]
        svc.mounts[target] = ("bind" if src.startswith("/") else "volume", src)
    for s in spec.get("secrets", []):
        source = s["source"] if isinstance(s, dict) else s
        target = (s.get("target") if isinstance(s, dict) else None) or source
        path = target if target.startswith("/") else f"/run/secrets/{target}"
        svc.mounts[path] = ("secret", source)


def load(config, context, build_dir):
    """The cluster of a parsed compose config: {"network": ..., "prefix_len",
    "images": deploy/Dockerfile's stages, "services": {name: Service}, "nodes": [daemon
    Service, ...] in the order of their addresses, "secrets": {name: file}}."""
    services = config.get("services") or {}
    networks = config.get("networks") or {}
    if len(networks) != 1:
        raise ComposeError(f"expected one network, found {sorted(networks)}")
    net_name, net = next(iter(networks.items()))
    subnets = [c["subnet"] for c in (net.get("ipam") or {}).get("config", []) if "subnet" in c]
    if len(subnets) != 1:
        raise ComposeError(f"network {net_name}: expected one fixed subnet, found {subnets}")
    subnet = ipaddress.IPv4Network(subnets[0])
    stages = parse_dockerfile(os.path.join(context, "deploy", "Dockerfile"), context, build_dir)
    model = {"network": net_name, "subnet": str(subnet), "prefix_len": subnet.prefixlen,
             "images": stages, "services": {}, "nodes": [],
             "secrets": {k: v["file"] for k, v in (config.get("secrets") or {}).items()}}
    seen = {}
    for name, spec in services.items():
        # An image of deploy/Dockerfile: its repository is the stage's name.
        repo = str(spec.get("image", "")).rsplit(":", 1)[0]
        if repo not in stages:
            raise ComposeError(f"service {name}: image {spec.get('image')} is not one of "
                               f"deploy/Dockerfile's ({', '.join(sorted(stages))})")
        svc = Service(name, spec)
        svc.image = image = stages[repo]
        for n, v in (spec.get("networks") or {}).items():
            if n != net_name or not v or "ipv4_address" not in v:
                raise ComposeError(f"service {name}: needs a fixed ipv4_address on {net_name}")
            addr = ipaddress.IPv4Address(v["ipv4_address"])
            if addr not in subnet:
                raise ComposeError(f"service {name}: {addr} is outside {subnet}")
            if str(addr) in seen:
                raise ComposeError(f"service {name}: {addr} is also {seen[str(addr)]}'s")
            seen[str(addr)] = name
            svc.addresses.append(str(addr))
        _parse_mounts(svc, spec)
        entry = spec.get("entrypoint", image["entrypoint"])
        if isinstance(entry, str):
            entry = ["/bin/sh", "-c", entry]
        # As in Docker: a service entrypoint drops the image's CMD.
        cmd = spec.get("command", [] if "entrypoint" in spec else image["cmd"])
        if isinstance(cmd, str):
            cmd = shlex.split(cmd)
        svc.argv = list(entry) + list(cmd)
        if "--node-config" in svc.argv[:-1]:
            svc.node_config = svc.argv[svc.argv.index("--node-config") + 1]
        model["services"][name] = svc
    daemons = [s for s in model["services"].values() if s.node_config]
    if not daemons:
        raise ComposeError("no daemon service (a command with --node-config)")
    for s in model["services"].values():
        if s.node_config:
            s.node = s
            if s.node_config not in s.mounts:
                raise ComposeError(f"service {s.name}: {s.node_config} is not mounted")
            continue
        owners = {d for d in s.shared_with() if d in model["services"]
                  and model["services"][d].node_config}
        if not owners:
            owners = {d.name for d in daemons if d.named_volumes() & s.named_volumes()}
        if len(owners) != 1:
            raise ComposeError(f"service {s.name}: cannot tell its node (daemons it shares "
                               f"a namespace or volume with: {sorted(owners)})")
        s.node = model["services"][owners.pop()]
    model["nodes"] = sorted(daemons, key=lambda d: ipaddress.IPv4Address(d.addresses[0]))
    return model


def node_addresses(model, daemon):
    """Every address of the node of `daemon`: its own, then its trainers'."""
    out = list(daemon.addresses)
    for s in model["services"].values():
        if s.node is daemon and s is not daemon:
            out += s.addresses
    return out


def host_path(model, svc, path, run_dir):
    """The local path a container path of `svc` names, or None: the longest
    matching mount, else the image's files."""
    table = {}
    for target, (kind, src) in svc.mounts.items():
        if kind == "volume":
            table[target] = os.path.join(run_dir, "volumes", src)
        elif kind == "bind":
            table[target] = src
        else:
            table[target] = os.path.join(run_dir, "secrets", svc.name, src)
    for target, host in svc.image["files"].items():
        table.setdefault(target, host)
    best = None
    for target in table:
        if path == target or path.startswith(target.rstrip("/") + "/"):
            if best is None or len(target) > len(best):
                best = target
    if best is None:
        return None
    return table[best] + path[len(best):]
