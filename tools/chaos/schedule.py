"""The fault schedule of a chaos run, drawn from a seed (so a failing run replays).

A schedule is a list of Fault(at_s, kind, target, duration_s), sorted by time.
`draw(seed, seconds, kinds, nodes, ranks, rate_per_min)` is pure: the same
arguments give the same schedule on any machine. Faults may overlap (a
daemon killed while a trainer is stopped); two faults never hit the same
target at once, and the last one starts early enough to end before
`seconds` (the job must be able to finish undisturbed).

Kinds, with the target each takes:
  kill_trainer    rank      SIGKILL the trainer process of that rank
  stop_trainer    rank      SIGSTOP for duration_s, then SIGCONT (a straggler)
  kill_daemon     node      SIGKILL the node's hsdpd; restarted after duration_s
  drain_daemon    node      `hsdpctl drain` (an upgrade), restarted after duration_s
  kill_coordinator 0        kill_daemon of the coordinator's node
  disk_full       -1        the checkpoint directory full for duration_s
  link_down       node      the node's link down for duration_s (network namespaces)
  link_slow       node      the node's link shaped to a crawl for duration_s (namespaces)
"""
import dataclasses
import random

TRAINER_KINDS = ("kill_trainer", "stop_trainer")
DAEMON_KINDS = ("kill_daemon", "drain_daemon", "kill_coordinator")
LINK_KINDS = ("link_down", "link_slow")
ALL_KINDS = TRAINER_KINDS + DAEMON_KINDS + ("disk_full",) + LINK_KINDS

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
                             f"{self.duration_s:.1f} s"}[self.kind]
        return f"t+{self.at_s:.1f}s {what}"


def _target(kind, rng, nodes, ranks):
    if kind in TRAINER_KINDS:
        return rng.randrange(ranks)
    if kind == "kill_coordinator":
        return 0
    if kind == "disk_full":
        return -1
    return rng.randrange(nodes)


def _resource(kind, target):
    """What a fault occupies: two faults on one resource never overlap."""
    if kind in TRAINER_KINDS:
        return ("rank", target)
    if kind in DAEMON_KINDS:
        return ("daemon", target)
    if kind in LINK_KINDS:
        return ("link", target)
    return ("disk", 0)


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
        res = _resource(kind, target)
        start = max(t, busy.get(res, 0.0))
        if start + duration < seconds:
            out.append(Fault(round(start, 1), kind, target, duration))
            busy[res] = start + duration + min_gap_s
        i += 1
        t += max(min_gap_s, rng.expovariate(rate_per_min / 60.0))
    out.sort(key=lambda f: (f.at_s, f.kind, f.target))
    return out
