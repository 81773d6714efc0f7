"""Checks deploy/grafana/hsdpd.json: valid JSON, and every hsdpd_* metric its
queries use is one hsdpd exports (as listed in daemon/observability/metrics.cc)."""
import json
import re
import sys

dashboard, metrics_cc = sys.argv[1], sys.argv[2]
d = json.load(open(dashboard))
exported = set(re.findall(r'"(hsdpd_[a-z_]+)"', open(metrics_cc).read()))
used = set()
for p in d["panels"]:
    for t in p.get("targets", []):
        used.update(re.findall(r"\b(hsdpd_[a-z_]+)", t["expr"]))
for v in d["templating"]["list"]:
    used.update(re.findall(r"\b(hsdpd_[a-z_]+)", v.get("query", "") or ""))
# Histogram series carry _bucket/_count/_sum suffixes.
unknown = {m for m in used if re.sub(r"_(bucket|count|sum)$", "", m) not in exported}
if not used or unknown:
    sys.exit(f"dashboard uses unknown metrics: {sorted(unknown)} (exported: {sorted(exported)})")
print(f"dashboard ok: {len(d['panels'])} panels, {len(used)} metrics")
