#!/usr/bin/env python3
"""Checks that daemon/ is layered: every folder under daemon/ has a place in
LAYERS (lowest first), and a file may include only its own folder and the
folders below it. The client side has an order of its own (CLIENT_TIERS):
the public types (client/include/hsdp/) < the shared code (client/common/:
hsdp/common/, hsdp/kernels/) < the wire and shared-memory formats (proto/:
hsdp/shm/, hsdp/v1/) < the client library (client/src/) and the Python
extension (python_client/src/); a file includes only its own tier and those
below. client/, proto/ and python_client/ never include daemon/. No source
(.cc, .h, .cu, .py) under daemon/, client/, proto/, python_client/ or tools/
is longer than MAX_LINES unless its opening comment says why it reads best
whole (a line with "Read whole:").

The picture and the reasons are in docs/architecture.md; this list is the one
definition of the order. Exit status 1 names every offending line.

  check_layers.py [--root DIR]   check a checkout (default: this one)
  check_layers.py --self-test    check that each rule can fail
"""
import argparse
import os
import re
import sys
import tempfile

# Lowest first. A layer may include itself and anything before it.
LAYERS = [
    "util",           # the control executor, systemd notification, bounded key names, per-uid shares
    "config",         # node.yaml: parsing and validation
    "auth",           # who is calling: the Authenticator interface, peer credentials
    "device",         # device memory and streams: the DeviceApi, CUDA and the fake
    "engine",         # engines: CPU, NCCL, the hierarchical cross-node engine
    "session",        # one client's session: its ring, buffers, device buffers
    "dataplane",      # descriptors validated, matched into group ops, to the engine
    "jobs",           # the node's sessions, jobs, groups and their placement
    "cluster",        # daemons together: membership, coordinator, key/value store
    "observability",  # metrics, traces, stragglers
    "server",         # gRPC services, listeners, the Daemon that wires it all
]
TOP = "main.cc"  # daemon/main.cc sits above every layer
MAX_LINES = 600
SOURCE = re.compile(r"\.(cc|h|cu)$")
SIZED = re.compile(r"\.(cc|h|cu|py)$")
SIZED_TOPS = ("daemon", "client", "proto", "python_client", "tools")
INCLUDE = re.compile(r'^\s*#\s*include\s+"daemon/([^/"]+)/')
ANY_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')

# The client side, lowest first: (tier, the folders whose files are in it,
# the include prefixes that name its headers). A bare "hsdp/x.h" is public.
CLIENT_TIERS = [
    ("public types", ("client/include/hsdp",), ()),
    ("client/common", ("client/common",), ("hsdp/common/", "hsdp/kernels/")),
    ("proto", ("proto",), ("hsdp/shm/", "hsdp/v1/", "hsdp/grpc/")),
    ("client library", ("client/src", "python_client/src"), ("client/src/", "src/")),
]
PUBLIC_HEADER = re.compile(r"^hsdp/[^/]+\.h$")


def sources(root, top, pattern=SOURCE):
    base = os.path.join(root, top)
    for dirpath, dirnames, names in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", "build"))
        for name in sorted(names):
            if pattern.search(name):
                path = os.path.join(dirpath, name)
                yield os.path.relpath(path, root)


def read_lines(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def check(root):
    errors = []
    rank = {name: i for i, name in enumerate(LAYERS)}
    daemon = os.path.join(root, "daemon")
    for entry in sorted(os.listdir(daemon)):
        if os.path.isdir(os.path.join(daemon, entry)) and entry not in rank:
            errors.append(f"daemon/{entry}/: a folder with no layer: add it to LAYERS in "
                          f"tools/scripts/check_layers.py and to docs/architecture.md")
    for rel in sources(root, "daemon"):
        parts = rel.split(os.sep)
        own = parts[1] if len(parts) > 2 else None  # None: daemon/main.cc, the top
        for n, line in enumerate(read_lines(root, rel), 1):
            m = INCLUDE.match(line)
            if not m or own not in rank and own is not None:
                continue
            target = m.group(1)
            if target not in rank:
                errors.append(f"{rel}:{n}: includes daemon/{target}/, which has no layer")
            elif own is not None and rank[target] > rank[own]:
                errors.append(f"{rel}:{n}: layer '{own}' includes daemon/{target}/ above it "
                              f"(order: {' < '.join(LAYERS)}); give '{own}' an interface "
                              f"that '{target}' implements")
    for top in ("client", "proto", "python_client"):
        if not os.path.isdir(os.path.join(root, top)):
            continue
        for rel in sources(root, top):
            for n, line in enumerate(read_lines(root, rel), 1):
                if INCLUDE.match(line):
                    errors.append(f"{rel}:{n}: {top}/ must not include daemon/")
    errors += check_client_tiers(root)
    for top in SIZED_TOPS:
        if not os.path.isdir(os.path.join(root, top)):
            continue
        for rel in sources(root, top, SIZED):
            lines = read_lines(root, rel)
            if len(lines) > MAX_LINES and not any("Read whole:" in l for l in lines[:40]):
                errors.append(f"{rel}: {len(lines)} lines (over {MAX_LINES}): split it along "
                              f"its jobs, or say in its opening comment why it reads best "
                              f"whole ('Read whole: ...')")
    return errors


def tier_of_file(rel):
    path = rel.replace(os.sep, "/")
    for i, (_, folders, _) in enumerate(CLIENT_TIERS):
        if any(path == f or path.startswith(f + "/") for f in folders):
            return i
    return None


def tier_of_include(target):
    if PUBLIC_HEADER.match(target):
        return 0
    for i, (_, _, prefixes) in enumerate(CLIENT_TIERS):
        if any(target.startswith(p) for p in prefixes):
            return i
    return None  # a third-party or same-folder header: not ordered here


def check_client_tiers(root):
    errors = []
    names = [t[0] for t in CLIENT_TIERS]
    for top in ("client", "proto", "python_client"):
        if not os.path.isdir(os.path.join(root, top)):
            continue
        for rel in sources(root, top):
            own = tier_of_file(rel)
            if own is None:
                continue
            for n, line in enumerate(read_lines(root, rel), 1):
                m = ANY_INCLUDE.match(line)
                if not m:
                    continue
                target = tier_of_include(m.group(1))
                if target is not None and target > own:
                    errors.append(f"{rel}:{n}: {names[own]} includes {m.group(1)} of "
                                  f"{names[target]} above it (order: {' < '.join(names)})")
    return errors


def self_test():
    """Each rule fails on a tree made to break it, and passes on a clean one."""
    def tree(files):
        d = tempfile.mkdtemp(prefix="check_layers.")
        for rel, text in files.items():
            path = os.path.join(d, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        return d

    clean = {
        "daemon/engine/a.h": '#include "daemon/device/b.h"\n',
        "daemon/device/b.h": '#include "daemon/auth/c.h"\n',
        "daemon/auth/c.h": "\n",
        "daemon/main.cc": '#include "daemon/server/s.h"\n',
        "daemon/server/s.h": '#include "daemon/engine/a.h"\n',
        "client/x.cc": '#include "hsdp/client.h"\n',
        "client/include/hsdp/types.h": "\n",
        "client/include/hsdp/client.h": '#include "hsdp/types.h"\n',
        "client/common/hsdp/common/log.h": '#include "hsdp/types.h"\n',
        "proto/hsdp/shm/layout.h": '#include "hsdp/common/log.h"\n#include "hsdp/types.h"\n',
        "client/src/client.cc": '#include "hsdp/shm/layout.h"\n#include "hsdp/client.h"\n',
        "python_client/hsdp/m.py": "x = 1\n",
        "tools/bench/b.cc": "\n",
    }
    cases = {
        "upward include": {"daemon/device/b.h": '#include "daemon/engine/a.h"\n'},
        "unknown folder": {"daemon/misc/m.h": "\n"},
        "include of an unknown folder": {"daemon/engine/a.h": '#include "daemon/misc/m.h"\n'},
        "client includes daemon": {"client/x.cc": '#include "daemon/engine/a.h"\n'},
        "long file": {"daemon/engine/long.cc": "int x;\n" * (MAX_LINES + 1)},
        "long Python file": {"python_client/hsdp/m.py": "x = 1\n" * (MAX_LINES + 1)},
        "long tool": {"tools/bench/b.cc": "int x;\n" * (MAX_LINES + 1)},
        "long proto source": {"proto/hsdp/shm/l.cc": "int x;\n" * (MAX_LINES + 1)},
        "public header includes client/common": {
            "client/include/hsdp/client.h": '#include "hsdp/common/log.h"\n'},
        "client/common includes proto": {
            "client/common/hsdp/common/log.h": '#include "hsdp/shm/layout.h"\n'},
        "proto includes the client library": {
            "proto/hsdp/shm/layout.h": '#include "client/src/arena.h"\n'},
        "proto includes daemon": {"proto/hsdp/shm/layout.h": '#include "daemon/engine/a.h"\n'},
        "python extension includes daemon": {
            "python_client/src/m.cc": '#include "daemon/engine/a.h"\n'},
    }
    ok = True
    if check(tree(clean)):
        print("self-test: the clean tree failed:", check(tree(clean)))
        ok = False
    long_ok = dict(clean)
    long_ok["daemon/engine/long.cc"] = "// Read whole: one job.\n" + "int x;\n" * MAX_LINES
    if check(tree(long_ok)):
        print("self-test: a long file that says why failed")
        ok = False
    for name, change in cases.items():
        files = dict(clean)
        files.update(change)
        errors = check(tree(files))
        if not errors:
            print(f"self-test: '{name}' was not caught")
            ok = False
        else:
            print(f"self-test: '{name}' caught: {errors[0]}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                   "..", ".."))
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return 0 if self_test() else 1
    errors = check(os.path.abspath(args.root))
    for e in errors:
        print(e)
    if errors:
        print(f"check_layers: {len(errors)} problem(s)")
        return 1
    print(f"check_layers: daemon/ is layered ({' < '.join(LAYERS)} < main.cc); "
          f"the client side too ({' < '.join(t[0] for t in CLIENT_TIERS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
