"""Injecting the schedule's faults (schedule.py) into a running chaos run, and
undoing them when their time is up.

inject(fault) returns what it did (a line for the report) or None when the
fault could not apply right now (its rank is not running: the job is
between incarnations); each fault's undo runs once, at at_s + duration_s
(a drained daemon is restarted only once its drain finished).

Network faults need a net.Net (--netns): link_down sets node i's bridge port
down (its eth0 stays up: the node sees no carrier change, only silence, as
when a switch port or cable fails), link_slow shapes both directions of it
(net.py says how and why that much). etcd faults need an etcd.Etcd (--store
etcd): kill_etcd_member SIGKILLs one member, etcd_quorum_lost every member
but the target; each is restarted with its data directory when its time is up.
"""
import os
import shutil
import signal
import subprocess
import threading


class Injector:
    def __init__(self, cluster, job, ckpt_mount=None, net=None, etcd=None):
        self.cluster, self.job = cluster, job
        self.ckpt_mount = ckpt_mount  # a tmpfs of ours (disk_full), or None
        self.net, self.etcd = net, etcd
        self.active = []  # (end_at_s, fault, undo)
        self.down = set()  # nodes whose daemon a fault took down
        self.etcd_down = set()  # etcd members a fault killed

    def daemons_down(self):
        """A fault holds a daemon down, or etcd without a quorum: a new
        incarnation could not form (the supervisor waits)."""
        quorum_lost = self.etcd is not None and 2 * len(self.etcd_down) >= len(self.etcd.procs)
        return bool(self.down) or quorum_lost

    def _signal_rank(self, rank, sig):
        pid = self.job.pid_of(rank)
        if pid is None or not self.job.signal(rank, sig):
            return None
        return pid

    def inject(self, fault, now_s):
        kind, target = fault.kind, fault.target
        undo = None
        if kind == "kill_trainer":
            pid = self._signal_rank(target, signal.SIGKILL)
            if pid is None:
                return None
            did = f"SIGKILL rank {target} (pid {pid})"
        elif kind == "stop_trainer":
            pid = self._signal_rank(target, signal.SIGSTOP)
            if pid is None:
                return None
            did = f"SIGSTOP rank {target} (pid {pid})"

            def undo(force=False, pid=pid):
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
        elif kind in ("kill_daemon", "kill_coordinator"):
            node = self.cluster.nodes[target]
            if target in self.down or not node.alive():
                return None
            pid = node.proc.pid
            node.kill()
            self.down.add(target)
            did = f"SIGKILL hsdpd of node {target} (pid {pid})"
            undo = self._restart(target)
        elif kind == "drain_daemon":
            node = self.cluster.nodes[target]
            if target in self.down or not node.alive():
                return None
            self.down.add(target)
            result = {}
            t = threading.Thread(target=lambda: result.update(rc=node.drain()), daemon=True)
            t.start()
            did = f"hsdpctl drain on node {target} (pid {node.proc.pid})"
            restart = self._restart(target)

            def undo(force=False, t=t, result=result, restart=restart):
                if t.is_alive():
                    if not force:
                        return False  # not yet: the drain goes on
                    t.join(90)
                restart()
                return result.get("rc")
        elif kind == "disk_full":
            if self.ckpt_mount is None:
                return None
            filler = os.path.join(self.ckpt_mount, ".chaos-filler")
            free = shutil.disk_usage(self.ckpt_mount).free
            r = subprocess.run(["fallocate", "-l", str(max(free, 4096)), filler],
                               capture_output=True, text=True)
            did = (f"filled the checkpoint directory ({free} bytes"
                   f"{'' if r.returncode == 0 else ': ' + r.stderr.strip()})")

            def undo(force=False, filler=filler):
                try:
                    os.unlink(filler)
                except FileNotFoundError:
                    pass
        elif kind == "link_down":
            if self.net is None:
                raise ValueError("link_down needs --netns")
            self.net.set_link(target, False)
            did = f"node {target}'s {self.net.port(target)} down"

            def undo(force=False, i=target):
                self.net.set_link(i, True)
        elif kind == "link_slow":
            if self.net is None:
                raise ValueError("link_slow needs --netns")
            q = self.net.shape(target)
            did = f"node {target}'s link shaped both ways: {q}"

            def undo(force=False, i=target):
                self.net.unshape(i)
        elif kind in ("kill_etcd_member", "etcd_quorum_lost"):
            if self.etcd is None:
                raise ValueError(f"{kind} needs --store etcd")
            victims = [target] if kind == "kill_etcd_member" else \
                [m for m in range(len(self.etcd.procs)) if m != target]
            if any(m in self.etcd_down for m in victims):
                return None
            pids = {m: self.etcd.kill(m) for m in victims}
            self.etcd_down.update(victims)
            did = "SIGKILL etcd " + ", ".join(f"member {m} (pid {p})" for m, p in pids.items())

            def undo(force=False, victims=victims):
                for m in victims:
                    self.etcd.start(m)
                    self.etcd_down.discard(m)
        else:
            raise ValueError(f"fault kind {kind} is not supported in this mode")
        self.active.append((fault.at_s + fault.duration_s, fault, undo))
        return did

    def _restart(self, index):
        def undo(force=False):
            self.cluster.nodes[index].start()
            self.down.discard(index)
        return undo

    def undo_due(self, now_s, force=False):
        """Runs the undo of every fault whose time is up (all with force); returns
        the lines for the report."""
        lines, keep = [], []
        for end_at, fault, undo in self.active:
            if end_at > now_s and not force:
                keep.append((end_at, fault, undo))
                continue
            if undo is None:
                continue
            rc = undo(force=force)
            if rc is False and not force:
                keep.append((end_at, fault, undo))  # a drain still going on
                continue
            lines.append(f"undone: {fault.describe()}" + ("" if rc in (None, True) else
                                                          f" (drain: {rc})"))
        self.active = keep
        return lines
