#!/usr/bin/env python3
"""Checks that docs/configuration.md documents exactly the keys and defaults
`hsdpd --print-default-config` prints: the daemon's schema is the one source
of the defaults (daemon/config/node_config*.cc), the doc's tables follow it.

  check_config_docs.py --hsdpd build/bin/hsdpd [--doc docs/configuration.md]

Exit status 1 names every key that is missing on one side or whose default
differs. Stdlib only.
"""
import argparse
import re
import subprocess
import sys

SECTION = re.compile(r"^([a-z_]+):\s*(#.*)?$")
KEY = re.compile(r"^  ([a-z_]+): (.*?)\s*(#.*)?$")
DOC_SECTION = re.compile(r"^### `([a-z_]+)`")
DOC_ROW = re.compile(r"^\| `([a-z_]+)` \| [^|]* \| ([^|]*) \|")
BACKTICKED = re.compile(r"`([^`]*)`")


def normalize(value):
    """A default as both sides write it: quotes around strings dropped."""
    v = value.strip()
    if len(v) >= 2 and v[0] == v[-1] == '"' and '"' not in v[1:-1]:
        v = v[1:-1]
    return v


def defaults(hsdpd):
    text = subprocess.run([hsdpd, "--print-default-config"], check=True, capture_output=True,
                          text=True).stdout
    out, section = {}, None
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = SECTION.match(line)
        if m:
            section = m.group(1)
            continue
        m = KEY.match(line)
        if m and section:
            out[f"{section}.{m.group(1)}"] = normalize(m.group(2))
    return out


def documented(doc):
    out, section = {}, None
    with open(doc, encoding="utf-8") as f:
        for line in f:
            m = DOC_SECTION.match(line)
            if m:
                section = m.group(1)
                continue
            if line.startswith("## "):
                section = None
            m = DOC_ROW.match(line)
            if m and section:
                d = BACKTICKED.search(m.group(2))
                out[f"{section}.{m.group(1)}"] = normalize(d.group(1)) if d else None
    return out


def compare(printed, doc):
    errors = []
    for key in sorted(printed.keys() - doc.keys()):
        errors.append(f"{key}: printed by --print-default-config ({printed[key]!r}) but not "
                      f"documented in docs/configuration.md")
    for key in sorted(doc.keys() - printed.keys()):
        errors.append(f"{key}: documented but not a key of the daemon's schema")
    for key in sorted(printed.keys() & doc.keys()):
        if printed[key] != doc[key]:
            errors.append(f"{key}: default {printed[key]!r} (daemon) but {doc[key]!r} "
                          f"(docs/configuration.md)")
    return errors


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hsdpd", required=True)
    ap.add_argument("--doc", default="docs/configuration.md")
    args = ap.parse_args()
    printed, doc = defaults(args.hsdpd), documented(args.doc)
    if len(printed) < 10 or len(doc) < 10:
        print(f"check_config_docs: parsed only {len(printed)} printed and {len(doc)} documented "
              f"keys: the formats changed, fix this script")
        return 1
    errors = compare(printed, doc)
    for e in errors:
        print(e)
    if errors:
        print(f"check_config_docs: {len(errors)} problem(s)")
        return 1
    print(f"check_config_docs: {len(printed)} keys, documented with the daemon's defaults")
    return 0


if __name__ == "__main__":
    sys.exit(main())
