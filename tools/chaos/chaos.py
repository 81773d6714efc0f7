#!/usr/bin/env python3
"""A chaos run: an HSDP training job across several hsdpd nodes meets a seeded
schedule of faults and must end with the parameters of an undisturbed run.

    tools/chaos/chaos.py --seed 7 --seconds 120 [--nodes 3] [--ranks-per-node 2]
        [--steps 60] [--ckpt-every 5] [--kinds kill_trainer,stop_trainer,...]
        [--netns | --docker [--image-tag T]] [--store embedded|etcd] [--backend hsdpd|gloo]
        [--recovery warm|restart] [--build build] [--python build/venv/bin/python] [--out DIR] [--keep]

1. The cluster: one hsdpd per node (cluster.py), on loopback, or with --netns
   each in its own network namespace on 198.18.40.(10+i) (net.py; root), or
   with --docker every daemon, etcd member and rank a container of the
   project's images, node i a pod on a Docker network at 198.18.42.(10+i)
   (docker.py; root and an engine: tools/scripts/docker_engine.py start);
   node 0 the embedded coordinator, or with --store etcd a 3-member etcd
   (etcd.py: member m on node m) where the daemons meet.
2. The undisturbed run: the job (trainer.py: FSDP2 on a nodes x ranks mesh,
   DCP checkpoints) from step 0 to --steps; its final parameters are the
   reference, its per-step time the baseline; then each daemon's resources
   (fds, memfds, threads, RSS from /proc) are its baseline.
3. The chaos run: the same job from scratch while the faults of
   schedule.draw(seed, ...) hit it (faults.py). With --recovery warm (the
   default with hsdpd) the supervisor (job.py) starts a killed rank again
   alone and the others recover in their processes (trainer.py); with
   --recovery restart (Gloo's only choice), and in warm mode when a rank
   gives up, it restarts the job from its last checkpoint whenever a rank
   fails or it stops making progress (the stacks of every rank are dumped
   first).
4. The verdict (verdict.py): the job reached its last step; its parameters
   are bitwise equal to the reference; every fault was followed by new
   progress within --recover-s; after the job every daemon is back at its
   baseline (a restarted one: against the node's baseline); no trainer is left;
   with etcd, every member is healthy again. Reported, not judged: how soon
   each fault showed in the daemons' logs and in the job's errors.

Fault kinds: LOOPBACK_KINDS anywhere; the link kinds (link_down, link_slow)
only with --netns or --docker; the etcd kinds (kill_etcd_member, etcd_quorum_lost) only
with --store etcd. --kinds defaults to every kind the mode allows.

Prints the schedule, what each fault did, the time each cost, and the
verdict; writes report.json in --out. The namespaces (and every process in
them) are removed on every exit: the end, an error, SIGINT, SIGTERM; after a
SIGKILL, by the next run (netns_topology's owner pid). Exit 0 when the verdict holds, 1 when
it does not, 2 for bad arguments, 77 when it cannot run here.
A run is replayed exactly (the same schedule) by passing the same --seed,
--seconds, --kinds, --nodes and --ranks-per-node.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import cluster as cluster_mod  # noqa: E402
import etcd as etcd_mod  # noqa: E402
import faults as faults_mod  # noqa: E402
import job as job_mod  # noqa: E402
import net as net_mod  # noqa: E402
import schedule as schedule_mod  # noqa: E402
import verdict as verdict_mod  # noqa: E402

SKIP = 77
LOOPBACK_KINDS = schedule_mod.TRAINER_KINDS + schedule_mod.DAEMON_KINDS + ("disk_full",)


def kinds_of(networked, store):
    """The fault kinds a mode supports (networked: --netns or --docker)."""
    return LOOPBACK_KINDS + (schedule_mod.LINK_KINDS if networked else ()) + \
        (schedule_mod.ETCD_KINDS if store == "etcd" else ())


ALONE_S = 10.0  # a fault "alone": no other fault from its start to its end + this


class Terminated(BaseException):
    """SIGTERM: unwinds main() through its finally (the teardown)."""


def say(line):
    print(f"[chaos {time.strftime('%H:%M:%S')}] {line}", flush=True)


def run_job(job, cl, deadline, injector=None, plan=(), t0=None, report=None, detect_s=20.0):
    """Drives `job` to its end (or the deadline): restarts it when it fails or
    stalls, injects `plan`'s faults at their times (from t0). Returns 'done' or why not."""
    plan = list(plan)
    pending = {}  # warm recovery: rank -> unix time its exit was seen, until it is restarted
    restart_wanted, next_formed_check = True, 0.0
    failing_since, failing_at, first_exit, first_state = None, 0.0, {}, None
    while time.monotonic() < deadline:
        now_s = time.monotonic() - (t0 or 0)
        if injector is not None:
            while plan and plan[0].at_s <= now_s:
                f = plan.pop(0)
                if job.state() == "done":
                    report["faults"].append({"fault": f.describe(), "kind": f.kind,
                                             "did": "skipped: the job had finished"})
                    continue
                did = injector.inject(f, now_s)
                entry = {"fault": f.describe(), "kind": f.kind, "target": f.target,
                         "duration_s": f.duration_s, "at": time.time(),
                         "did": did or "skipped: its target was not running"}
                report["faults"].append(entry)
                say(f"fault {f.describe()}: {entry['did']}")
            for line in injector.undo_due(now_s):
                say(line)
        st = job.state()
        if st.startswith("failed") and job.recovery == "warm":
            waiting = warm_restart(job, cl, pending, report)
            st = job.state()
            if waiting and st.startswith("failed"):
                # Every failed rank was killed and waits for its node's daemon:
                # the others recover in their processes meanwhile, so the
                # detect_s clock of a failing incarnation does not run.
                failing_since = None
                st = "waiting"
        if st == "done":
            if report is not None:
                for f in plan:  # the job finished before their time
                    report["faults"].append({"fault": f.describe(), "kind": f.kind,
                                             "did": "skipped: the job had finished"})
            return "done"
        if st.startswith("failed"):
            # The survivors get detect_s to fail by themselves (what hsdpd tells
            # them is part of the verdict); then the rest are ended.
            if failing_since is None:
                failing_since, first_state = time.monotonic(), st
                failing_at = time.time()
                first_exit = {r: c for r, c in job.exits().items() if c is not None}
            exits = job.exits()
            if all(c is not None for c in exits.values()) or \
                    time.monotonic() - failing_since > detect_s:
                if any(c is None for c in exits.values()):
                    job.dump_stacks()  # where the ranks that noticed nothing wait
                record = {"incarnation": job.incarnation, "at": time.time(), "first": first_state,
                          "failing_at": failing_at,
                          "detect_s": time.monotonic() - failing_since,
                          "failed_by_themselves": {
                              r: job.last_error(r) for r, c in exits.items()
                              if c not in (None, 0) and r not in first_exit},
                          "errors": {r: job.last_error(r) for r, c in exits.items()
                                     if c not in (None, 0)},
                          "still_running": [r for r, c in exits.items() if c is None]}
                if report is not None:
                    report["failures"].append(record)
                say(f"job incarnation {job.incarnation} {first_state}; "
                    f"{len(record['failed_by_themselves'])} more failed by themselves within "
                    f"{time.monotonic() - failing_since:.1f} s, "
                    f"{len(record['still_running'])} ended: restarting")
                job.end(first_state)
                pending.clear()
                failing_since = None
                restart_wanted = True
        elif job.stalled():
            say(f"job incarnation {job.incarnation} made no progress for {job.stall_s} s: "
                "dumping its stacks and ending it")
            job.dump_stacks()
            job.end("stalled")
            pending.clear()
            if report is not None:
                report["stalls"] += 1
            restart_wanted = True
        if restart_wanted and (injector is None or not injector.daemons_down()) and \
                time.monotonic() >= next_formed_check:
            next_formed_check = time.monotonic() + 1.0
            if all(n.alive() for n in cl.nodes) and cl.wait_formed(0):
                job.start([n.socket for n in cl.nodes])
                restart_wanted = False
                say(f"job incarnation {job.incarnation} started")
        time.sleep(0.1)
    return "deadline"


def warm_restart(job, cl, pending, report):
    """Warm recovery: a rank killed by a signal is started again alone (once its
    node's daemon is up); the others recover in their processes. A rank that
    exited by itself (it gave up) or a job with a finished rank leaves the
    failure to the whole-job restart. Returns True while every rank that
    ended was killed and still waits for its node's daemon, for at most
    job.stall_s each (then the whole-job restart takes over)."""
    exits = job.exits()
    if any(c is not None and c >= 0 for c in exits.values()):
        return False
    for r, c in exits.items():
        if c is not None and r not in pending:
            pending[r] = time.time()
            if report is not None:
                report["kills_seen"].append({"rank": r, "at": pending[r], "exit": c})
    for r in sorted(pending):
        if cl.nodes[job.node_of(r)].alive():
            job.restart_rank(r, [n.socket for n in cl.nodes])
            say(f"job incarnation {job.incarnation}: rank {r} exit {exits[r]}: started it "
                f"again alone {time.time() - pending.pop(r):.1f} s later (the others recover "
                "in their processes)")
    return bool(pending) and all(time.time() - at < job.stall_s for at in pending.values())


def detection(report, cl, job, step_s):
    """How soon each injected fault showed: in the daemons' logs (the first
    line naming it, verdict.DETECT) and in the job (the first failure after it
    whose rank errors name it); for link_slow, the step time during it.
    Reported per fault, and per kind over the faults that overlapped no other
    within ALONE_S (report["detected_within_by_kind"]). Returns the problems:
    a fault that had its window to itself and has a bound
    (verdict.detection_bound_s) not named by any daemon within it. Faults that
    overlapped another are reported, not judged: a line may then belong to
    either, and one fault can hide another."""
    logs = {n.index: verdict_mod.log_lines(n.log_path) for n in cl.nodes}
    by_kind = {}
    problems = []
    injected = [e for e in report["faults"] if not e.get("did", "").startswith("skipped")]
    for entry in injected:
        kind, target, at = entry["kind"], entry["target"], entry["at"]
        until = at + entry.get("duration_s", 0) + 60
        d = verdict_mod.daemon_detection(
            kind, target, at, logs,
            coordinator=0 if report.get("store", "embedded") == "embedded" else None)
        if d is not None:
            entry["detected_by_daemons_s"], entry["daemon_line"] = d[0], f"node {d[1]}: {d[2]}"
        j = verdict_mod.job_detection(kind, target, at, report["failures"], until)
        if j is not None:
            entry["detected_by_job_s"], entry["job_error"] = j
        if kind == "link_slow":
            entry["step_s_during"] = verdict_mod.steps_during(job.out, at,
                                                               at + entry["duration_s"])
        # A line or an error may belong to another fault active at the time: the
        # per-kind figures count only faults that had their window to themselves.
        end = at + entry.get("duration_s", 0) + ALONE_S
        overlapping = [o for o in injected if o is not entry and o["at"] < end and
                       entry["at"] < o["at"] + o.get("duration_s", 0) + ALONE_S]
        entry["overlapped_by"] = [o["fault"] for o in overlapping]
        # The bound is judged unless a fault that moves membership overlapped it (a
        # trainer's fault or a full disk neither names a node nor hides one).
        bound = verdict_mod.detection_bound_s(
            kind, entry.get("duration_s", 0), cl.lease_s,
            etcd_mod.ELECTION_MS / 1000.0 if report.get("store") == "etcd" else None)
        if bound is not None and not any(o["kind"] in verdict_mod.MEMBERSHIP_KINDS
                                         for o in overlapping):
            entry["detect_bound_s"] = bound
            seen = entry.get("detected_by_daemons_s")
            if seen is None or seen > bound:
                problems.append(f"{entry['fault']}: no daemon named it within {bound:.1f} s ("
                                + ("never" if seen is None else f"first after {seen:.1f} s")
                                + ")")
        if (kind in verdict_mod.DETECT or kind in verdict_mod.JOB_NAMES) and \
                not entry["overlapped_by"]:
            k = by_kind.setdefault(kind, {"faults": 0, "daemons": [], "job": []})
            k["faults"] += 1
            for who, key in (("daemons", "detected_by_daemons_s"), ("job", "detected_by_job_s")):
                if key in entry:
                    k[who].append(entry[key])
    report["detected_within_by_kind"] = {
        kind: {"faults": k["faults"], **{who: {"count": len(v), "max_s": max(v, default=0.0),
                                              "mean_s": sum(v) / len(v) if v else 0.0}
                                        for who, v in (("daemons", k["daemons"]),
                                                       ("job", k["job"]))}}
        for kind, k in by_kind.items()}
    return problems


def killed_trainers_named(report):
    """A killed trainer is named by the ranks that failed because of it (unless
    another fault was active then, or the incarnation was already failing when
    it was killed: then who says what depends on which came first), within
    verdict.KILLED_TRAINER_NAMED_WITHIN_S. Sets named_by and detect_s on the
    faults it judges; returns the problems."""
    problems = []
    injected = [e for e in report["faults"] if not e["did"].startswith("skipped")]
    for entry in injected:
        if entry["kind"] != "kill_trainer":
            continue
        rec = next((f for f in report["failures"]
                    if f["at"] >= entry["at"] and (not f.get("warm") or f["first"].startswith(
                        f"failed: rank {entry['target']} "))), None)
        if rec is None or not rec["failed_by_themselves"]:
            continue  # ended by the supervisor before anyone else noticed
        lag = verdict_mod.KILL_SEEN_LAG_S if rec.get("warm") else 0.0
        if rec["failing_at"] < entry["at"] - lag or rec.get("recovering"):
            continue  # it was killed while its incarnation was failing already
        if verdict_mod.others_active(entry, injected, rec["at"]):
            continue  # a failure then may be another fault's
        rank = int(entry["did"].split()[2])
        named = sorted(r for r, why in rec["failed_by_themselves"].items()
                       if f"rank {rank} left the job" in why)
        entry["named_by"] = named
        entry["detect_s"] = rec["detect_s"]
        if rec["detect_s"] > verdict_mod.KILLED_TRAINER_NAMED_WITHIN_S:
            problems.append(f"{entry['fault']}: the others failed {rec['detect_s']:.1f} s "
                            f"after it, over the bound of "
                            f"{verdict_mod.KILLED_TRAINER_NAMED_WITHIN_S:.0f} s")
        if not named:
            problems.append(f"{entry['fault']}: no rank that failed after it named rank "
                            f"{rank}: {rec['failed_by_themselves']}")
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--seconds", type=float, default=120, help="the fault window")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--kinds", default=None,
                   help="comma-separated; default: every kind the mode supports")
    p.add_argument("--netns", action="store_true",
                   help="each node's daemon in its own network namespace (root): link faults")
    p.add_argument("--docker", action="store_true",
                   help="every daemon, etcd member and rank a container (root, a Docker engine)")
    p.add_argument("--image-tag", default=None,
                   help="--docker: run hsdpd:TAG and hsdpd-trainer:TAG (default: build them "
                        "from --build as tag chaos, tools/scripts/docker_images.py)")
    p.add_argument("--store", default="embedded", choices=("embedded", "etcd"),
                   help="etcd: a 3-member etcd (one member per node) instead of the coordinator")
    p.add_argument("--rate", type=float, default=4.0, help="faults per minute")
    p.add_argument("--recover-s", type=float, default=180,
                   help="each fault must be followed by new progress within this")
    p.add_argument("--deadline-s", type=float, default=1800)
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--python", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--backend", default="hsdpd", choices=("hsdpd", "gloo"),
                   help="gloo: the same job over Gloo (the daemons idle), the baseline")
    p.add_argument("--recovery", default=None, choices=("warm", "restart"),
                   help="warm (the default with hsdpd): a killed rank restarts alone and the "
                        "others recover in their processes; restart: every rank restarts, "
                        "torchrun's way (Gloo's only choice)")
    p.add_argument("--keep", action="store_true")
    a = p.parse_args()
    if a.netns and a.docker:
        print("chaos: --netns or --docker, not both", file=sys.stderr)
        return 2
    supported = kinds_of(a.netns or a.docker, a.store)
    kinds = [k for k in (a.kinds.split(",") if a.kinds is not None else supported) if k]
    if a.backend == "gloo":  # the daemons idle: faults of theirs or etcd's cost Gloo nothing
        kinds = [k for k in kinds if k not in schedule_mod.DAEMON_KINDS + schedule_mod.ETCD_KINDS]
    unknown = set(kinds) - set(schedule_mod.ALL_KINDS)
    if unknown:
        print(f"chaos: unknown fault kinds {sorted(unknown)}", file=sys.stderr)
        return 2
    for group, need in ((schedule_mod.LINK_KINDS, "--netns"),
                        (schedule_mod.ETCD_KINDS, "--store etcd")):
        need = "--netns or --docker" if need == "--netns" else need
        wrong = sorted(set(kinds) & set(group) - set(supported))
        if wrong:
            print(f"chaos: kinds {wrong} need {need}, not in this mode", file=sys.stderr)
            return 2
    if a.store == "etcd" and a.nodes < etcd_mod.MEMBERS:
        print(f"chaos: --store etcd puts one etcd member on each of nodes 0..2: needs --nodes "
              f">= {etcd_mod.MEMBERS}", file=sys.stderr)
        return 2
    build = os.path.abspath(a.build)
    python = a.python or os.path.join(build, "venv", "bin", "python")
    if not os.access(os.path.join(build, "bin", "hsdpd"), os.X_OK) or not os.access(python,
                                                                                     os.X_OK):
        print(f"chaos: needs {build}/bin/hsdpd and {python} (build first)", file=sys.stderr)
        return SKIP
    etcd_bin = os.path.join(build, "third_party", "etcd", "usr", "bin")
    if a.store == "etcd" and not etcd_mod.Etcd.available(etcd_bin):
        print(f"chaos: --store etcd needs etcd and etcdctl in {etcd_bin} "
              "(tools/scripts/etcd_env.sh)", file=sys.stderr)
        return SKIP
    if a.netns:
        why = net_mod.probe()
        if why is not None:
            print(f"chaos: --netns: network namespaces unavailable here: {why}", file=sys.stderr)
            return SKIP
    if a.docker:
        import docker as docker_mod
        why = docker_mod.probe()
        if why is not None:
            print(f"chaos: --docker: {why}", file=sys.stderr)
            return SKIP
    out = os.path.abspath(a.out) if a.out else tempfile.mkdtemp(prefix="hsdp-chaos-")
    os.makedirs(out, exist_ok=True)
    ckpt_mount = None
    if "disk_full" in kinds:
        if os.geteuid() != 0:
            say("disk_full needs root (a tmpfs for the checkpoints): left out")
            kinds.remove("disk_full")
        else:
            ckpt_mount = os.path.join(out, "ckpt-fs")
            os.makedirs(ckpt_mount, exist_ok=True)
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "chaos-ckpt",
                                ckpt_mount], capture_output=True, text=True)
            if r.returncode != 0:
                say(f"disk_full needs a tmpfs for the checkpoints (mount: {r.stderr.strip()}): "
                    "left out")
                kinds.remove("disk_full")
                ckpt_mount = None
    world = a.nodes * a.ranks_per_node
    # Gloo has no recovery of its own: its job restarts on any fault (torchrun's way).
    recovery = a.recovery or ("warm" if a.backend == "hsdpd" else "restart")
    if a.backend == "gloo" and recovery == "warm":
        print("chaos: --recovery warm needs --backend hsdpd (Gloo's groups cannot be "
              "joined again in a running process)", file=sys.stderr)
        return 2
    plan = schedule_mod.draw(a.seed, a.seconds, kinds, a.nodes, world, a.rate)
    report = {"seed": a.seed, "seconds": a.seconds, "backend": a.backend, "netns": a.netns,
              "store": a.store, "nodes": a.nodes,
              "ranks_per_node": a.ranks_per_node, "steps": a.steps, "kinds": kinds,
              "schedule": [f.describe() for f in plan], "faults": [], "stalls": 0,
              "failures": [], "kills_seen": [], "recovery": recovery}
    say(f"seed {a.seed}: {len(plan)} faults over {a.seconds:.0f} s, {a.nodes} nodes x "
        f"{a.ranks_per_node} ranks, {a.steps} steps, checkpoint every {a.ckpt_every}; "
        f"{'network namespaces' if a.netns else 'containers' if a.docker else 'loopback'}, "
        f"store {a.store}; out {out}")
    for f in plan:
        say(f"  plan: {f.describe()}")
    problems = []
    job = ref = cl = net = etcd = None

    def on_sigterm(signum, _frame):
        raise Terminated(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if a.netns:
            net = net_mod.Net(os.getpid(), a.nodes)
            report["shaping"] = net.shaping
            say(f"network namespaces up: nodes on {', '.join(net.addrs)} (owner {os.getpid()}); "
                f"link_slow shapes with {net.shaping}")
        if a.docker:
            tag = a.image_tag
            if tag is None:
                say("building the images hsdpd:chaos and hsdpd-trainer:chaos from "
                    f"{build} (tools/scripts/docker_images.py)")
                import docker_images
                docker_images.build(build, "chaos")
                tag = "chaos"
            net = docker_mod.Pods(os.getpid(), a.nodes, build, tag, out)
            report["shaping"] = net.shaping
            say(f"containers up: node pods on {', '.join(net.addrs)} (network {net.network}, "
                f"images hsdpd:{tag}, hsdpd-trainer:{tag}); link_slow shapes with "
                f"{net.shaping}")
        if a.store == "etcd":
            etcd = etcd_mod.Etcd(etcd_bin, out,
                                 net.addrs if net is not None else None,
                                 [net.prefix(m) for m in range(etcd_mod.MEMBERS)]
                                 if net is not None else None,
                                 [net.spawner(m, "etcd") for m in range(etcd_mod.MEMBERS)]
                                 if a.docker else None)
            if not etcd.start_all(60):
                print(f"chaos: etcd did not become healthy\n{etcd.logs()}", file=sys.stderr)
                return 1
            say(f"etcd: {', '.join(etcd.endpoints())}")
        cl = cluster_mod.Cluster(build, out, a.nodes, net=net, etcd=etcd)
        if not cl.start(90):
            print(f"chaos: the cluster did not form\n{cl.logs()}", file=sys.stderr)
            return 1
        # The undisturbed run.
        prefixes = [n.prefix for n in cl.nodes] if a.netns else None
        spawner = net.rank_spawner() if a.docker else None
        ref = job_mod.Job(python, build, os.path.join(out, "reference"),
                          os.path.join(out, "reference-ckpt"), a.nodes, a.ranks_per_node,
                          a.steps, a.ckpt_every, backend=a.backend, prefixes=prefixes,
                          recovery=recovery, spawner=spawner)
        t = time.monotonic()
        res = run_job(ref, cl, t + a.deadline_s)
        ref_s = time.monotonic() - t
        if res != "done" or ref.incarnation != 1:
            print(f"chaos: the undisturbed run did not finish in one go ({res}, "
                  f"{ref.incarnation} incarnations)\n{cl.logs()}", file=sys.stderr)
            return 1
        step_s = verdict_mod.step_seconds(ref.out)
        baseline = cl.quiesced_snapshots()
        say(f"undisturbed run: {ref_s:.1f} s, {step_s:.3f} s a step; daemons' baseline "
            f"{[{k: v for k, v in b.items() if k != 'thread_names'} for b in baseline]}")
        report.update(reference_seconds=ref_s, step_seconds=step_s, baseline=baseline)
        # The chaos run.
        job = job_mod.Job(python, build, os.path.join(out, "chaos"),
                          ckpt_mount or os.path.join(out, "chaos-ckpt"), a.nodes,
                          a.ranks_per_node, a.steps, a.ckpt_every, backend=a.backend,
                          prefixes=prefixes, recovery=recovery, spawner=spawner)
        injector = faults_mod.Injector(cl, job, ckpt_mount, net, etcd)
        t0 = time.monotonic()
        res = run_job(job, cl, t0 + a.deadline_s, injector, plan, t0, report)
        chaos_s = time.monotonic() - t0
        for line in injector.undo_due(0, force=True):
            say(line)
        if res != "done":
            job.dump_stacks()
            problems.append(f"the job did not finish within {a.deadline_s:.0f} s "
                            "(its ranks' stacks are in their logs)")
        report.update(chaos_seconds=chaos_s, incarnations=job.incarnation,
                      resumed_from=verdict_mod.resumes(job.out))
        if recovery == "warm":
            rows = job.recoveries(0)
            report["warm_recoveries"] = len(rows)
            report["failures"] = sorted(
                report["failures"] + verdict_mod.warm_failures(
                    rows, report["kills_seen"],
                    [t for t, kind, _ in verdict_mod.progress(job.out) if kind == "step"], world),
                key=lambda r: r["failing_at"])
        # The verdict.
        equal, line = verdict_mod.compare_params(ref.out, job.out)
        if not equal:
            problems.append(line)
        report["params"] = line
        for entry in report["faults"]:
            if entry.get("did", "").startswith("skipped"):
                continue
            lost = verdict_mod.time_lost(job.out, entry["at"])
            entry["time_lost_s"] = lost
            if lost is None or lost > a.recover_s:
                problems.append(f"{entry['fault']}: no new progress within {a.recover_s:.0f} s")
        if a.backend == "hsdpd":
            problems += killed_trainers_named(report)
        if etcd is not None and not etcd.wait_healthy(60):
            problems.append("etcd: not every member healthy again within 60 s after the faults")
        if not cl.wait_formed(90):
            problems.append("the cluster did not form again after the faults")
        problems += detection(report, cl, job, step_s)
        final = cl.quiesced_snapshots()
        report["final"] = final
        for i, (b, f) in enumerate(zip(baseline, final)):
            for prob in verdict_mod.compare_resources(b, f):
                problems.append(f"node {i} hsdpd: {prob}")
        left = [pid for pid in job.pids() + ref.pids()]
        if left:
            problems.append(f"trainer processes left: {left}")
        report["problems"] = problems
        # The figures.
        say(f"chaos run: {chaos_s:.1f} s (undisturbed {ref_s:.1f} s), {job.incarnation} "
            f"incarnations, resumed from steps {report['resumed_from']}, "
            f"{report['stalls']} stalls; recovery {recovery}"
            + (f": {len(report['kills_seen'])} ranks restarted alone, "
               f"{report['warm_recoveries']} in-process recoveries" if recovery == "warm"
               else ""))
        by_kind = {}
        for entry in report["faults"]:
            if entry.get("time_lost_s") is not None:
                by_kind.setdefault(entry["kind"], []).append(entry["time_lost_s"])
        for kind, lost in sorted(by_kind.items()):
            say(f"time lost, {kind}: {len(lost)} faults, mean {sum(lost) / len(lost):.1f} s, "
                f"max {max(lost):.1f} s")
        report["time_lost_by_kind"] = {k: {"count": len(v), "mean_s": sum(v) / len(v),
                                           "max_s": max(v)} for k, v in by_kind.items()}
        for kind, d in sorted(report["detected_within_by_kind"].items()):
            say(f"detected, {kind}: " + "; ".join(
                f"{who} {d[who]['count']}/{d['faults']} within {d[who]['max_s']:.1f} s "
                f"(mean {d[who]['mean_s']:.1f})" if d[who]["count"] else f"{who} 0/{d['faults']}"
                for who in ("daemons", "job")))
        for entry in report["faults"]:
            if entry.get("step_s_during") is not None:
                say(f"{entry['fault']}: a step took {entry['step_s_during']:.3f} s during it "
                    f"(undisturbed {step_s:.3f} s)")
        say(line)
        for prob in problems:
            say(f"PROBLEM: {prob}")
        say("verdict: " + ("OK" if not problems else f"FAILED ({len(problems)} problems)"))
        return 0 if not problems else 1
    except Terminated as e:
        problems.append(f"terminated ({e})")
        say(f"terminated ({e}): tearing down")
        return 143
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the teardown runs to its end
        for j in (job, ref):
            if j is not None and j.procs:
                j.end("chaos run over")
        if cl is not None:
            cl.stop()
        if etcd is not None:
            etcd.stop()
        if net is not None:
            try:
                net.down()
            except Exception as e:  # noqa: BLE001 - say so, and go on with the rest
                say(f"PROBLEM: removing the {'containers' if a.docker else 'network namespaces'}"
                    f": {e}")
        with open(os.path.join(out, "report.json"), "w") as f:
            json.dump(report, f, indent=1, default=str)
        if ckpt_mount is not None:
            subprocess.run(["umount", ckpt_mount], check=False)
        if not a.keep and not problems:
            shutil.rmtree(out, ignore_errors=True)
        elif problems or a.keep:
            say(f"kept {out} (logs: node*/hsdpd.log, chaos/rank*.log, report.json)")


if __name__ == "__main__":
    sys.exit(main())
