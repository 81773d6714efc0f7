"""The fault schedule of a chaos run, drawn from a seed (so a failing run replays).

A schedule is a list of Fault(at_s, kind, target, duration_s), sorted by time.
`draw(seed, seconds, kinds, nodes, ranks, rate_per_min)` is pure: the same
arguments give the same schedule on any machine. Faults may overlap (a
daemon killed while a trainer is stopped); two faults never hit the same
resource at once (_resources: a rank, a daemon, a link, the disk, an etcd
member; quorum loss occupies every member, and with etcd kinds in the mix a
node's link fault occupies the member behind that link too, as in --netns
mode, where member m runs in node m's namespace), and the last one starts
early enough to end before `seconds` (the job must be able to finish
undisturbed).

Kinds, with the target each takes:
  kill_trainer    rank      SIGKILL the trainer process of that rank
  stop_trainer    rank      SIGSTOP for duration_s, then SIGCONT (a straggler)
  kill_daemon     node      SIGKILL the node's hsdpd; restarted after duration_s
  drain_daemon    node      `hsdpctl drain` (an upgrade), restarted after duration_s
  kill_coordinator 0        kill_daemon of the coordinator's node
  disk_full       -1        the checkpoint directory full for duration_s
  link_down       node      the node's link down for duration_s (network namespaces)
  link_slow       node      the node's link shaped to a crawl for duration_s (namespaces)
  kill_etcd_member member   SIGKILL that etcd member; restarted after duration_s (its data)
  etcd_quorum_lost member   SIGKILL every etcd member but that one for duration_s, then
                            restart them (2 of 3: no quorum)
"""
import dataclasses
import math
import random

TRAINER_KINDS = ("kill_trainer", "stop_trainer")
DAEMON_KINDS = ("kill_daemon", "drain_daemon", "kill_coordinator")
LINK_KINDS = ("link_down", "link_slow")
ETCD_KINDS = ("kill_etcd_member", "etcd_quorum_lost")
ALL_KINDS = TRAINER_KINDS + DAEMON_KINDS + ("disk_full",) + LINK_KINDS + ETCD_KINDS
ETCD_MEMBERS = 3  # the etcd cluster of --store etcd: members on nodes 0..2

# (shortest, longest) duration of each kind, seconds; 0: instantaneous.
DURATIONS = {
    "kill_trainer": (0, 0),
    "stop_trainer": (1, 6),
    "kill_daemon": (0.5, 3),
    "drain_daemon": (0.5, 3),
    "kill_coordinator": (0.5, 3),
    "disk_full": (5, 20),
    "link_down": (2, 15),
    "link_slow": (3, 10),
    "kill_etcd_member": (1, 8),
    # Longer than the daemons' lease (heartbeat_ms x missed_heartbeats = 3 s in the
    # chaos cluster) at the top end: the leases may expire while etcd is away.
    "etcd_quorum_lost": (2, 8),
}


@dataclasses.dataclass(frozen=True)
class Fault:
    at_s: float       # seconds after the chaos phase starts
    kind: str
    target: int       # a rank, a node, or -1
    duration_s: float

    def describe(self):
        what = {"kill_trainer": f"SIGKILL rank {self.target}",
                "stop_trainer": f"SIGSTOP rank {self.target} for {self.duration_s:.1f} s",
                "kill_daemon": f"SIGKILL hsdpd of node {self.target}, restart after "
                               f"{self.duration_s:.1f} s",
                "drain_daemon": f"drain hsdpd of node {self.target}, restart after "
                                f"{self.duration_s:.1f} s",
                "kill_coordinator": f"SIGKILL the coordinator (node 0), restart after "
                                    f"{self.duration_s:.1f} s",
                "disk_full": f"checkpoint directory full for {self.duration_s:.1f} s",
                "link_down": f"node {self.target}'s link down for {self.duration_s:.1f} s",
                "link_slow": f"node {self.target}'s link at a crawl for "
                             f"{self.duration_s:.1f} s",
                "kill_etcd_member": f"SIGKILL etcd member {self.target}, restart after "
                                    f"{self.duration_s:.1f} s",
                "etcd_quorum_lost": f"SIGKILL every etcd member but {self.target} (quorum "
                                    f"lost) for {self.duration_s:.1f} s"}[self.kind]
        return f"t+{self.at_s:.1f}s {what}"


def _target(kind, rng, nodes, ranks):
    if kind in TRAINER_KINDS:
        return rng.randrange(ranks)
    if kind == "kill_coordinator":
        return 0
    if kind == "disk_full":
        return -1
    if kind in ETCD_KINDS:
        return rng.randrange(ETCD_MEMBERS)
    return rng.randrange(nodes)


def _resources(kind, target, etcd=False):
    """What a fault occupies (a tuple): two faults on one resource never
    overlap. etcd: the etcd kinds are in the mix, so a link fault of node m <
    ETCD_MEMBERS occupies member m too (it runs behind that link)."""
    if kind in TRAINER_KINDS:
        return (("rank", target),)
    if kind in DAEMON_KINDS:
        return (("daemon", target),)
    if kind in LINK_KINDS:
        return (("link", target),) + ((("etcd", target),) if etcd and target < ETCD_MEMBERS
                                      else ())
    if kind == "kill_etcd_member":
        return (("etcd", target),)
    if kind == "etcd_quorum_lost":
        return tuple(("etcd", m) for m in range(ETCD_MEMBERS))
    return (("disk", 0),)


def draw(seed, seconds, kinds, nodes, ranks, rate_per_min=4.0, min_gap_s=2.0):
    """Faults over [0, seconds): exponential gaps (mean 60/rate_per_min s, at
    least min_gap_s), kinds drawn uniformly from `kinds`, each kind at least
    once when there is time (the first len(kinds) faults cycle through them
    in a seeded order)."""
    if not kinds:
        return []
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}")
    rng = random.Random(seed)
    etcd = any(k in ETCD_KINDS for k in kinds)
    order = list(kinds)
    rng.shuffle(order)
    busy = {}  # resource -> time it is free again
    out = []
    t = max(min_gap_s, rng.expovariate(rate_per_min / 60.0))
    i = 0
    while True:
        kind = order[i] if i < len(order) else rng.choice(order)
        lo, hi = DURATIONS[kind]
        duration = round(rng.uniform(lo, hi), 1)
        if t + duration >= seconds:
            break
        target = _target(kind, rng, nodes, ranks)
        res = _resources(kind, target, etcd)
        # In tenths of a second, rounded up: never before a resource is free, and
        # the check against `seconds` is on the time the fault is given.
        start = round(math.ceil(max([t] + [busy.get(r, 0.0) for r in res]) * 10 - 1e-9) / 10, 1)
        if start + duration < seconds:
            out.append(Fault(start, kind, target, duration))
            for r in res:
                busy[r] = start + duration + min_gap_s
        i += 1
        t += max(min_gap_s, rng.expovariate(rate_per_min / 60.0))
    out.sort(key=lambda f: (f.at_s, f.kind, f.target))
    return out
