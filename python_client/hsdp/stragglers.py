"""Straggler attribution: which ranks kept the others waiting on this node.

hsdpd records, for every collective with two or more members on the node,
which rank arrived last and how long the others waited for it. This module
reads that report (the Admin RPC behind `hsdpctl stragglers`) and turns it
into per-step lines a training script can log:

    from hsdp import stragglers
    watch = stragglers.StepWatcher()   # the job of this process's hsdpd session
    for batch in loader:
        train_step(batch)
        for line in watch.step():
            print(line)   # "rank 3 delayed this step's all_reduce by 41.0 ms (4 ops)"

A non-root process sees only its own jobs. Every call is one RPC to the
local daemon (about a millisecond); call it once per step, not per op.
"""
from hsdp import _hsdp

__all__ = ["StepDelay", "StepWatcher", "report"]


def report(job_id=None, socket_path=None, timeout=10.0):
    """The daemon's straggler report, most waited-for rank first.

    Returns a list of dicts with keys job_id, rank, times_last,
    waited_seconds_total, p50_seconds, p90_seconds, p99_seconds, max_seconds
    and recent (the last operations where the rank arrived last: event_id,
    group_id, op, seq, epoch, waited_seconds, age_seconds). job_id None means
    every job the caller may see; socket_path None means $HSDPD_SOCKET, else
    the default socket. Raises hsdp errors (UnavailableError when no daemon).
    """
    return _hsdp.stragglers(socket_path or "", job_id or "", float(timeout))["ranks"]


def _current_session():
    """(job_id, socket_path) of the torch backend's session, else (None, None)."""
    try:
        from hsdp.torch import session  # imports torch: only when asked for
        client = session.current()
    except (ImportError, RuntimeError):
        return None, None
    return client.job_id, client.socket_path


class StepDelay:
    """How much one rank delayed the others since the previous step()."""

    def __init__(self, job_id, rank, waited_seconds, ops, op_names):
        self.job_id = job_id
        self.rank = rank
        self.waited_seconds = waited_seconds
        self.ops = ops            # operations where it arrived last
        self.op_names = op_names  # e.g. ["all_reduce"] (from the daemon's recent list)

    def __str__(self):
        what = "/".join(self.op_names) if self.op_names else "collectives"
        return (f"rank {self.rank} delayed this step's {what} by "
                f"{self.waited_seconds * 1e3:.1f} ms ({self.ops} op{'s' if self.ops != 1 else ''})")

    def __repr__(self):
        return (f"StepDelay(job_id={self.job_id!r}, rank={self.rank}, "
                f"waited_seconds={self.waited_seconds:.6f}, ops={self.ops}, "
                f"op_names={self.op_names!r})")


class StepWatcher:
    """Reports, at each step(), which ranks delayed the others since the last call.

    job_id / socket_path: None takes them from the session of the "hsdpd"
    torch process group (hsdp.torch), else every visible job and the default
    socket. min_seconds: leave out ranks that delayed the others less.
    """

    def __init__(self, job_id=None, socket_path=None, min_seconds=0.0, timeout=10.0):
        if job_id is None and socket_path is None:
            job_id, socket_path = _current_session()
        self.job_id = job_id
        self.socket_path = socket_path
        self.min_seconds = min_seconds
        self.timeout = timeout
        self._last = self._snapshot(report(job_id, socket_path, timeout))

    @staticmethod
    def _snapshot(ranks):
        last_event = max((e["event_id"] for r in ranks for e in r["recent"]), default=0)
        totals = {(r["job_id"], r["rank"]): (r["waited_seconds_total"], r["times_last"])
                  for r in ranks}
        return totals, last_event

    def step(self):
        """StepDelay per rank that arrived last since the previous call, largest first."""
        ranks = report(self.job_id, self.socket_path, self.timeout)
        (before, last_event) = self._last
        self._last = self._snapshot(ranks)
        out = []
        for r in ranks:
            key = (r["job_id"], r["rank"])
            waited0, times0 = before.get(key, (0.0, 0))
            waited = r["waited_seconds_total"] - waited0
            ops = r["times_last"] - times0
            if ops <= 0 or waited < self.min_seconds:
                continue
            names = sorted({e["op"] for e in r["recent"] if e["event_id"] > last_event})
            out.append(StepDelay(r["job_id"], r["rank"], waited, ops, names))
        out.sort(key=lambda d: d.waited_seconds, reverse=True)
        return out
