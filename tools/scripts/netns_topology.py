#!/usr/bin/python3
"""Network namespaces that stand in for the nodes of a test cluster.

One namespace per node plus a "switch" namespace holding a bridge; each node
is joined to the bridge by a veth pair (`eth0` inside the node, `n<i>` on
the bridge). Every interface and address lives inside namespaces created
here: the host's own namespace gets nothing but the namespace names, so the
addresses can never clash with, or leak to, a real network.

    netns_topology.py up --owner PID --prefix-len 24 --node 198.18.78.10 \\
        --node 198.18.78.11,198.18.78.21        # prints the topology as JSON
    netns_topology.py down --owner PID           # processes, veths, namespaces
    netns_topology.py probe                      # exit 0 iff namespaces work here

Names are `hsdpnet<owner>-sw` and `hsdpnet<owner>-n<i>`, where <owner> is the
pid of the process that owns the topology (a test, a runner). `up` first
removes the namespaces of owners that no longer run (a test killed by a
timeout), never those of a live owner. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN)
and iproute2; stdlib only.
"""
import argparse
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time

PREFIX = "hsdpnet"
NAME_RE = re.compile(r"^%s(\d+)-(sw|n\d+)$" % PREFIX)
IP = "/usr/sbin/ip" if os.path.exists("/usr/sbin/ip") else "ip"


class TopologyError(RuntimeError):
    pass


def _ip(*args, check=True):
    r = subprocess.run([IP, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True, timeout=20)
    if check and r.returncode != 0:
        raise TopologyError(f"ip {' '.join(args)}: {r.stderr.strip() or r.returncode}")
    return r


def switch_name(owner):
    return f"{PREFIX}{owner}-sw"


def node_name(owner, i):
    return f"{PREFIX}{owner}-n{i}"


def list_namespaces():
    r = _ip("netns", "list", check=False)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def namespace_pids(ns):
    r = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def kill_namespace_processes(ns, grace_s=3.0):
    """SIGTERM, then SIGKILL, every process inside `ns` (a namespace this
    script created, so only processes started into it)."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        pids = namespace_pids(ns)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and namespace_pids(ns):
            time.sleep(0.05)


def down(owner):
    """Removes everything of `owner`'s topology; quiet when nothing is there."""
    errors = []
    mine = [ns for ns in list_namespaces()
            if (m := NAME_RE.match(ns)) and int(m.group(1)) == owner]
    # Nodes first (their processes), then the switch; deleting a namespace
    # destroys its interfaces and so both ends of each veth pair.
    for ns in sorted(mine, key=lambda n: n.endswith("-sw")):
        kill_namespace_processes(ns)
        r = _ip("netns", "del", ns, check=False)
        if r.returncode != 0 and ns in list_namespaces():
            errors.append(f"{ns}: {r.stderr.strip()}")
    if errors:
        raise TopologyError("could not remove " + "; ".join(errors))


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale():
    """Removes topologies whose owner process is gone."""
    owners = {int(m.group(1)) for ns in list_namespaces() if (m := NAME_RE.match(ns))}
    for owner in sorted(owners):
        if not _alive(owner):
            down(owner)


def up(owner, nodes, prefix_len):
    """Creates the switch and one namespace per entry of `nodes` (each a list
    of IPv4 addresses for that node's eth0). Returns the topology dict. On
    any failure, removes what it created and raises TopologyError."""
    sweep_stale()
    if any(NAME_RE.match(ns) and int(NAME_RE.match(ns).group(1)) == owner
           for ns in list_namespaces()):
        raise TopologyError(f"owner {owner} already has a topology (run down first)")
    seen = set()
    for addrs in nodes:
        for a in addrs:
            ipaddress.IPv4Address(a)  # ValueError on anything else
            if a in seen:
                raise TopologyError(f"address {a} given twice")
            seen.add(a)
    sw = switch_name(owner)
    topo = {"owner": owner, "switch": sw, "bridge": "br0", "nodes": []}
    try:
        _ip("netns", "add", sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for i, addrs in enumerate(nodes):
            ns = node_name(owner, i)
            _ip("netns", "add", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            port = f"n{i}"
            _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns)
            _ip("-n", sw, "link", "set", port, "master", "br0")
            _ip("-n", sw, "link", "set", port, "up")
            for a in addrs:
                _ip("-n", ns, "addr", "add", f"{a}/{prefix_len}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            topo["nodes"].append({"namespace": ns, "interface": "eth0", "switch_port": port,
                                  "addresses": list(addrs)})
    except BaseException:
        down(owner)
        raise
    return topo


def probe():
    """None when namespaces can be created here, else why not."""
    if os.geteuid() != 0:
        return "not root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    name = f"{PREFIX}{os.getpid()}-n0"
    try:
        r = _ip("netns", "add", name, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        return f"cannot run {IP}: {e}"
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    try:
        veth = _ip("-n", name, "link", "add", "p0", "type", "veth", "peer", "name", "p1",
                   check=False)
        if veth.returncode != 0:
            return f"cannot create a veth pair: {veth.stderr.strip()}"
    finally:
        _ip("netns", "del", name, check=False)
    return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="create the namespaces; print the topology as JSON")
    u.add_argument("--owner", type=int, required=True, help="pid owning the topology")
    u.add_argument("--node", action="append", required=True,
                   help="a node's addresses, comma-separated (repeat per node)")
    u.add_argument("--prefix-len", type=int, default=24)
    d = sub.add_parser("down", help="remove an owner's namespaces (and their processes)")
    d.add_argument("--owner", type=int, required=True)
    sub.add_parser("probe", help="exit 0 iff namespaces can be created here")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "up":
            nodes = [[a for a in n.split(",") if a] for n in args.node]
            print(json.dumps(up(args.owner, nodes, args.prefix_len)))
        elif args.cmd == "down":
            down(args.owner)
        else:
            why = probe()
            if why:
                print(f"network namespaces unavailable: {why}")
                return 1
            print("network namespaces available")
    except (TopologyError, ValueError) as e:
        print(f"netns_topology: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
