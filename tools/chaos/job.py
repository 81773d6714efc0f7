"""The chaos job's supervisor (what torchrun's elastic agent is to a job):
starts every rank of an incarnation, notices a rank that failed or a job that
stopped making progress, ends the incarnation and starts the next one from
the last checkpoint once the cluster is whole again. With recovery "warm" it
starts a killed rank again alone in the running incarnation (restart_rank:
same store, same job id) while the others recover in their processes
(trainer.py --recovery warm, HSDP_RECONNECT=0); their recoveries are read
back from out/recover.log (recoveries()).

Rank r runs on node r // ranks_per_node; the mesh is (nodes, ranks_per_node),
replicate x shard, so shard groups stay within a node and replicas span the
nodes (HSDP). Each incarnation gets a fresh torch store file (so a new job
id); trainer logs are appended per rank (out/rank<r>.log).

In --netns mode the ranks of node i run in node i's namespace when the
backend is gloo (GLOO_SOCKET_IFNAME=eth0: their own traffic crosses the
node's link, so link faults hit them); with the hsdpd backend they stay in
the host's namespace (they reach their daemon over its Unix socket and
meet in a file store: only the daemons' traffic crosses the links).
"""
import os
import signal
import subprocess
import time

HERE = os.path.dirname(os.path.abspath(__file__))


class Job:
    def __init__(self, python, build, out, ckpt_dir, nodes, ranks_per_node, steps, ckpt_every,
                 backend="hsdpd", pg_timeout=60, stall_s=120, prefixes=None,
                 recovery="restart", spawner=None):
        self.python, self.build, self.out, self.ckpt_dir = python, build, out, ckpt_dir
        self.nodes, self.per_node = nodes, ranks_per_node
        self.world = nodes * ranks_per_node
        self.steps, self.ckpt_every = steps, ckpt_every
        self.backend, self.pg_timeout, self.stall_s = backend, pg_timeout, stall_s
        # prefixes[i]: the command prefix of node i's namespace (gloo in --netns mode).
        self.prefixes = prefixes if backend == "gloo" else None
        # "warm": a killed rank is started again alone and the others recover in
        # their processes (trainer.py --recovery warm); "restart": every rank restarts.
        self.recovery = recovery
        # spawner(rank, node, argv, env, log_path, gloo) -> a Popen-like running
        # `python3 argv` (docker.py: a container of the trainer image); None: a
        # process of ours.
        self.spawner = spawner
        self.procs = []
        self.store = None
        self.incarnation = 0
        self.events = []  # (time, what)
        self.started_at = None
        os.makedirs(out, exist_ok=True)
        os.makedirs(ckpt_dir, exist_ok=True)

    def node_of(self, rank):
        return rank // self.per_node

    def start(self, sockets):
        """Starts incarnation n + 1; sockets[i]: node i's hsdpd socket."""
        self.incarnation += 1
        self.store = os.path.join(self.out, f"store-{self.incarnation}")
        self.procs = [self._spawn(r, sockets, "") for r in range(self.world)]
        self.started_at = time.monotonic()
        self.events.append((time.time(), f"incarnation {self.incarnation} started"))

    def restart_rank(self, rank, sockets):
        """Starts `rank` again alone, in the running incarnation (warm recovery)."""
        self.procs[rank] = self._spawn(rank, sockets, " (this rank restarted)")
        self.events.append((time.time(), f"rank {rank} restarted"))

    def _spawn(self, r, sockets, note):
        pypath = os.pathsep.join([os.path.join(self.build, "python")] +
                                 ([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                   if p] if self.spawner is None else []))
        # The job id: one per incarnation, the same for a rank started again in it.
        job_env = dict(RANK=str(r), WORLD_SIZE=str(self.world),
                       LOCAL_RANK=str(r % self.per_node), PYTHONPATH=pypath,
                       OMP_NUM_THREADS="1", HSDPD_SOCKET=sockets[self.node_of(r)],
                       HSDP_CHAOS_RUN=self.out,
                       HSDP_JOB_ID=f"chaos-{os.getpid()}-{os.path.basename(self.out)}-"
                                   f"{self.incarnation}")
        if self.recovery == "warm":
            job_env["HSDP_RECONNECT"] = "0"  # the trainer recovers by itself
        if self.backend == "gloo" and (self.prefixes is not None or self.spawner is not None):
            job_env["GLOO_SOCKET_IFNAME"] = "eth0"
        argv = [os.path.join(HERE, "trainer.py"), "--steps", str(self.steps),
                "--ckpt-every", str(self.ckpt_every), "--ckpt-dir", self.ckpt_dir,
                "--out", self.out, "--mesh", f"{self.nodes},{self.per_node}",
                "--backend", self.backend, "--store", self.store,
                "--pg-timeout", str(self.pg_timeout), "--recovery", self.recovery]
        log_path = os.path.join(self.out, f"rank{r}.log")
        with open(log_path, "a") as log:
            log.write(f"=== incarnation {self.incarnation}{note} at {time.time():.3f}\n")
        if self.spawner is not None:
            return self.spawner(r, self.node_of(r), argv, job_env, log_path,
                                self.backend == "gloo")
        prefix = self.prefixes[self.node_of(r)] if self.prefixes is not None else []
        log = open(log_path, "a")
        try:
            return subprocess.Popen(prefix + [self.python, *argv], env=dict(os.environ, **job_env),
                                    stdout=log, stderr=subprocess.STDOUT)
        finally:
            log.close()

    def recoveries(self, since):
        """[(unix time, rank, why)] of the warm recoveries logged at or after `since`."""
        rows = []
        try:
            with open(os.path.join(self.out, "recover.log"), errors="replace") as f:
                lines = f.readlines()
        except OSError:
            return rows
        for line in lines:
            parts = line.rstrip("\n").split(" ", 5)
            try:
                if len(parts) == 6 and parts[1] == "rank" and parts[3] == "attempt" and \
                        float(parts[0]) >= since:
                    rows.append((float(parts[0]), int(parts[2]), parts[5]))
            except ValueError:
                continue  # a line torn by a rank killed while writing it
        return rows

    def signal(self, rank, sig):
        """Sends `sig` to a running rank (a container: `docker kill -s`); False
        when it is not running."""
        if rank >= len(self.procs) or self.procs[rank].poll() is not None:
            return False
        self.procs[rank].send_signal(sig)
        return True

    def pids(self):
        return [p.pid for p in self.procs if p.poll() is None]

    def pid_of(self, rank):
        if rank < len(self.procs) and self.procs[rank].poll() is None:
            return self.procs[rank].pid
        return None

    def state(self):
        """'idle', 'running', 'done', or 'failed: rank r exit c' (the first one seen)."""
        if not self.procs:
            return "idle"
        codes = [p.poll() for p in self.procs]
        for r, c in enumerate(codes):
            if c not in (None, 0):
                return f"failed: rank {r} exit {c}"
        if all(c == 0 for c in codes):
            return "done"
        return "running"

    def last_progress(self):
        """Unix time of the last line rank 0 wrote to progress.log (0: none)."""
        try:
            with open(os.path.join(self.out, "progress.log"), "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 200))
                tail = f.read().decode(errors="replace").strip().splitlines()
            return float(tail[-1].split()[0]) if tail else 0.0
        except (OSError, ValueError, IndexError):
            return 0.0

    def stalled(self):
        """No progress for stall_s (counted from the incarnation's start at the earliest)."""
        if self.state() != "running":
            return False
        since = max(self.last_progress(), time.time() - (time.monotonic() - self.started_at))
        return time.time() - since > self.stall_s

    def dump_stacks(self):
        """Every live rank prints its Python stacks to its log (faulthandler, SIGUSR1)."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        time.sleep(1.0)  # let faulthandler write (bounded; the processes are killed next)

    def exits(self):
        """{rank: exit code} of the ranks that ended (None: still running)."""
        return {r: p.poll() for r, p in enumerate(self.procs)}

    def last_error(self, rank):
        """The last line rank `rank` printed in this incarnation: after a traceback,
        the exception and its message ('' if it printed nothing)."""
        try:
            with open(os.path.join(self.out, f"rank{rank}.log"), errors="replace") as f:
                text = f.read()
        except OSError:
            return ""
        text = text[text.rfind("=== incarnation "):]
        lines = [line.strip() for line in text.splitlines()[1:] if line.strip()]
        return lines[-1][:400] if lines else ""

    def end(self, why):
        """Ends the incarnation: SIGCONT (a stopped rank), SIGKILL, reap."""
        for p in self.procs:
            if p.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(p.pid, sig)
                    except ProcessLookupError:
                        pass
        for p in self.procs:
            p.wait()
        self.events.append((time.time(), f"incarnation {self.incarnation} ended: {why}"))
        self.procs = []
