"""Judging a chaos run: the final parameters against the undisturbed run's, the
time each fault cost, and every daemon's resources against its baseline.

All inputs are files and /proc snapshots; nothing here changes the run.
"""
import os
import re
import statistics
import time

import numpy as np


def progress(out_dir):
    """[(unix time, kind, n)] from a job's progress.log (kind: step, resume, ...)."""
    rows = []
    try:
        with open(os.path.join(out_dir, "progress.log")) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[2].lstrip("-").isdigit():
                    rows.append((float(parts[0]), parts[1], int(parts[2])))
    except FileNotFoundError:
        pass
    return rows


def step_seconds(out_dir):
    """Median seconds between consecutive steps of one incarnation (no resume between)."""
    rows = progress(out_dir)
    gaps = [b[0] - a[0] for a, b in zip(rows, rows[1:])
            if a[1] == "step" and b[1] == "step" and b[2] == a[2] + 1]
    return statistics.median(gaps) if gaps else None


def time_lost(out_dir, fault_time):
    """Seconds from a fault (unix time) to the first step beyond every step
    completed before it (or the job's end); None when training never got past it."""
    # The job's end ("done N") counts as beyond step N: a fault after the last
    # step is recovered from when the job finishes.
    rows = [(t, n + (0.5 if kind == "done" else 0)) for t, kind, n in progress(out_dir)
            if kind in ("step", "done")]
    high = max((n for t, n in rows if t < fault_time), default=0)
    if high != int(high):
        return 0.0  # the job had finished its last step before the fault
    for t, n in rows:
        if t >= fault_time and n > high:
            return t - fault_time
    return None


def resumes(out_dir):
    """The steps each incarnation resumed from, in order."""
    return [n for _, kind, n in progress(out_dir) if kind == "resume"]


def compare_params(ref_dir, run_dir):
    """(equal bit for bit, a line saying so or naming the first difference)."""
    try:
        ref = np.load(os.path.join(ref_dir, "final.npz"))
        got = np.load(os.path.join(run_dir, "final.npz"))
    except FileNotFoundError as e:
        return False, f"missing final parameters: {e}"
    if sorted(ref.files) != sorted(got.files):
        return False, f"parameter names differ: {sorted(ref.files)} vs {sorted(got.files)}"
    for n in sorted(ref.files):
        a, b = ref[n], got[n]
        if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
            diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) \
                if a.shape == b.shape else float("nan")
            return False, f"parameter {n} differs (max |diff| {diff:.3g})"
    return True, f"{len(ref.files)} parameters bitwise equal to the undisturbed run's"


# What "back at its baseline" allows: the sessions' shared memory (memfds)
# and hsdpd's own named threads (hsdp-*) exactly, except the cross-node
# workers, a pool that grows to the most groups running at once and does not
# shrink, up to its bound (kMaxWorkers in
# daemon/engine/crossnode/hierarchical_engine.cc); gRPC's thread pools grow
# and shrink with load (event_engine, grpcpp_sync_ser, unnamed ones), so a
# few of those; a few fds (connections between daemons come and go with
# restarts); RSS within the allocator's slack.
THREAD_SLACK = 4
POOL_BOUNDS = {"hsdp-xworker": 64}
FD_SLACK = 8
RSS_SLACK_KIB = 32 * 1024


def _own(names):
    return {n: c for n, c in names.items() if n.startswith("hsdp-")}


def compare_resources(baseline, now):
    """Problems (lines) of one daemon's snapshot against its baseline."""
    if now is None:
        return ["not running"]
    out = []
    if now["memfds"] > baseline["memfds"]:
        out.append(f"memfds {now['memfds']} > baseline {baseline['memfds']}")
    own_now, own_base = _own(now["thread_names"]), _own(baseline["thread_names"])
    if any(c > POOL_BOUNDS.get(n, own_base.get(n, 0)) for n, c in own_now.items()):
        out.append(f"hsdpd's threads {own_now} > baseline {own_base} (pools up to "
                   f"{POOL_BOUNDS})")
    pooled = sum(max(0, now["thread_names"].get(n, 0) - baseline["thread_names"].get(n, 0))
                 for n in POOL_BOUNDS)
    if now["threads"] > baseline["threads"] + pooled + THREAD_SLACK:
        grew = {n: c - baseline["thread_names"].get(n, 0) for n, c in now["thread_names"].items()
                if c > baseline["thread_names"].get(n, 0)}
        out.append(f"threads {now['threads']} > baseline {baseline['threads']} + "
                   f"{pooled} pooled + {THREAD_SLACK} (more: {grew})")
    if now["fds"] > baseline["fds"] + FD_SLACK:
        out.append(f"fds {now['fds']} > baseline {baseline['fds']} + {FD_SLACK}")
    if now["rss_kib"] > baseline["rss_kib"] * 1.25 + RSS_SLACK_KIB:
        out.append(f"RSS {now['rss_kib']} KiB > 1.25 x baseline {baseline['rss_kib']} KiB "
                   f"+ {RSS_SLACK_KIB} KiB")
    return out


# --- Detection: when the daemons' logs, or the job's errors, show a fault. ---
# A daemon's log line: "<level> YYYY-MM-DD HH:MM:SS.uuuuuu <pid> file:line] text",
# local time (client/common/logging.cc).
LOG_LINE = re.compile(r"^[DIWE] (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\.(\d{6}) \d+ \S+\] (.*)$")

# What names a fault of each kind, in the logs of the other daemons and of
# the target's own daemon (a node cut off sees the others lost, or its lease
# gone); {i} is the fault's target. Kinds not here are not looked for.
_NODE_SEEN = [r"node {i} \([^)]*\) (was lost|restarted|lost)", r"connection to node {i} lost",
              r"node {i} hosting rank"]
DETECT = {
    # Node 0 cut off from an embedded store's members: they lose their coordinator.
    "link_down": {"others": _NODE_SEEN + [r"cluster degraded: the coordinator"],
                  "self": [r"cluster degraded", r"lease in .* expired", r"lost contact with"]},
    "kill_daemon": {"others": _NODE_SEEN},
    "drain_daemon": {"others": _NODE_SEEN},
    "kill_coordinator": {"others": _NODE_SEEN + [r"cluster degraded", r"lost contact with"]},
    "kill_etcd_member": {"all": [r"cluster degraded", r"waiting for"]},
    "etcd_quorum_lost": {"all": [r"cluster degraded", r"lease in .* expired"]},
}
# What names the target in a rank's error (the job's view).
JOB_NAMES = {"link_down": r"node {i}\b",
             "kill_daemon": r"node {i}\b|lost the connection to hsdpd",
             "drain_daemon": r"node {i}\b|drain", "kill_coordinator": r"node 0\b|coordinator",
             "kill_etcd_member": r"etcd", "etcd_quorum_lost": r"etcd"}


def detection_bound_s(kind, duration_s, lease_s, etcd_election_s=None):
    """Seconds from the fault within which a daemon's log must name a fault of
    `kind` that had its window to itself (lease_s: the cluster's heartbeat x
    missed heartbeats), or None: no bound. A daemon gone, drained or cut off
    from the others for longer than the lease, and etcd without a quorum for
    longer than the lease, must be seen within the lease + 1 s (what a member
    promises: a node that stops heartbeating is lost once its lease runs out,
    and the others hear of it at their next heartbeat). Not bounded: what
    hsdpd need not notice (a straggler, a slow link, a full checkpoint disk,
    one etcd member of three) and outages shorter than the lease plus that
    second, which membership rides through.

    With the store on etcd (etcd_election_s: its election timeout) a cut link
    also cuts off the etcd member on that node, and when that member leads
    raft, the node's renewals keep succeeding until it steps down and the
    others' leases are kept until a new leader is elected (etcd randomizes
    the election timeout between one and two times its value): the bound
    grows by twice the election timeout. Seed 401's hour-long run: the four
    links cut under the raft leader were named after 4.1-4.7 s, the other
    seventeen after 2.8-2.9 s (lease 3 s)."""
    bound = lease_s + 1.0
    if kind in ("kill_daemon", "drain_daemon", "kill_coordinator"):
        return bound
    if kind == "link_down" and duration_s > bound:
        return bound + (2 * etcd_election_s if etcd_election_s else 0.0)
    if kind == "etcd_quorum_lost" and duration_s > bound:
        return bound
    return None


def others_active(entry, injected, until, before_s=5.0):
    """The other faults active at any time from `before_s` before `entry` to
    `until`: started by then and not yet over (their duration counts) when
    that window began. A failure in that window may be theirs."""
    start = entry["at"] - before_s
    return [o for o in injected if o is not entry and o["at"] <= until and
            o["at"] + o.get("duration_s", 0) >= start]


# Faults that change what the daemons see of each other: one of these overlapping a
# fault can delay or hide the line that names it.
MEMBERSHIP_KINDS = ("kill_daemon", "drain_daemon", "kill_coordinator", "link_down", "link_slow",
                    "kill_etcd_member", "etcd_quorum_lost")


# A killed trainer: the ranks that share its job fail by themselves, naming it,
# within this (its session ends with its process; the daemon fails the group's
# epoch at once). Generous against a loaded machine: the figures are ~0.4 s.
KILLED_TRAINER_NAMED_WITHIN_S = 10.0


def log_lines(path):
    """[(unix time, text)] of a daemon's log (lines without a timestamp skipped)."""
    rows = []
    try:
        with open(path, errors="replace") as f:
            for line in f:
                m = LOG_LINE.match(line)
                if m:
                    t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
                    rows.append((t + int(m.group(2)) / 1e6, m.group(3)))
    except OSError:
        pass
    return rows


def daemon_detection(kind, target, at, logs, within_s=120.0, coordinator=None):
    """(seconds from the fault, node, the line) of the first daemon log line
    after `at` that names the fault, or None. logs: {node: [(t, text)]}.
    coordinator: the node that hosts the embedded store's coordinator (None on
    etcd): a daemon fault there is the coordinator's, and the others may
    name it as such (a coordinator back within the lease is "lost contact",
    then its node "joined", never "node 0 was lost")."""
    if kind in ("kill_daemon", "drain_daemon") and target == coordinator:
        kind = "kill_coordinator"
    spec = DETECT.get(kind)
    if spec is None:
        return None
    best = None
    for node, rows in logs.items():
        pats = list(spec.get("all", []))
        pats += spec.get("self", []) if node == target else spec.get("others", [])
        if not pats:
            continue
        rx = re.compile("|".join(p.format(i=target) for p in pats))
        for t, text in rows:
            if at <= t <= at + within_s and rx.search(text):
                if best is None or t - at < best[0]:
                    best = (t - at, node, text[:300])
                break
    return best


def job_detection(kind, target, at, failures, until):
    """(seconds from the fault to the job failing, the rank error that names
    it) from the supervisor's failure records (the first one failing in
    [at, until]), or None when no rank's error names the target."""
    pat = JOB_NAMES.get(kind)
    if pat is None:
        return None
    rx = re.compile(pat.format(i=target))
    for rec in failures:
        if not at <= rec["failing_at"] <= until:
            continue
        for rank, why in sorted(rec.get("errors", {}).items()):
            if rx.search(why or ""):
                return rec["failing_at"] - at, f"rank {rank}: {why[:300]}"
        return None  # the first failure after the fault does not name it
    return None


# A killed rank's peers may notice before the supervisor does (it polls): their
# recoveries count for the kill from this long before the supervisor saw it.
KILL_SEEN_LAG_S = 1.0


def warm_failures(recoveries, kills, steps, world, window_s=20.0):
    """The supervisor's failure records of a warm-recovering job, from the ranks'
    recoveries [(unix time, rank, why)], the kills it saw [{"rank", "at", "exit"}]
    and the times steps completed (rank 0's progress.log).

    One record per kill: the other ranks' first recovery from KILL_SEEN_LAG_S
    before it to window_s after (`failed_by_themselves`), `detect_s` (when the
    last of them noticed, or window_s when one did not), and `recovering`: the
    job was still recovering from an earlier failure (a recovery before the kill
    and no step completed since), so who noticed what is not the kill's alone.
    Then one record per remaining burst of recoveries (the first one and those
    within window_s of it). Fields as a whole-job restart's (`failing_at`,
    `errors`, `at`: when the record closed), sorted by `failing_at`."""
    rows = sorted(recoveries)
    steps = sorted(steps)
    used = set()
    records = []
    for k in sorted(kills, key=lambda k: k["at"]):
        at, dead = k["at"], k["rank"]
        first = {}
        for i, (t, rank, why) in enumerate(rows):
            if i not in used and at - KILL_SEEN_LAG_S <= t <= at + window_s and \
                    rank != dead and rank not in first:
                first[rank] = (t, why)
                used.add(i)
        noticed = {r: why for r, (t, why) in first.items()}
        detect = max((t - at for t, _ in first.values()), default=0.0) \
            if len(first) == world - 1 else window_s
        detect = max(detect, 0.0)
        before = [t for t, _, _ in rows if t < at - KILL_SEEN_LAG_S]
        recovering = bool(before) and not any(before[-1] < t < at for t in steps)
        records.append({"at": at + detect, "failing_at": at, "warm": True,
                        "first": f"failed: rank {dead} exit {k['exit']}", "detect_s": detect,
                        "recovering": recovering, "failed_by_themselves": noticed,
                        "errors": {**noticed, dead: f"killed (exit {k['exit']})"},
                        "still_running": sorted(set(range(world)) - set(first) - {dead})})
    i = 0
    while i < len(rows):
        if i in used:
            i += 1
            continue
        start = rows[i][0]
        first = {}
        while i < len(rows) and rows[i][0] <= start + window_s:
            if i not in used:
                first.setdefault(rows[i][1], rows[i][2])
            i += 1
        records.append({"at": start, "failing_at": start, "warm": True,
                        "first": "recovered without a rank leaving", "detect_s": 0.0,
                        "failed_by_themselves": first, "errors": first, "still_running": []})
    return sorted(records, key=lambda r: r["failing_at"])


def steps_during(out_dir, start, end):
    """Median seconds a step took between two unix times (None if < 2 steps)."""
    rows = [(t, n) for t, kind, n in progress(out_dir) if kind == "step" and start <= t <= end]
    gaps = [b[0] - a[0] for a, b in zip(rows, rows[1:]) if b[1] == a[1] + 1]
    return statistics.median(gaps) if gaps else None
