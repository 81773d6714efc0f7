"""hsdp.Client: the Pythonic session with the node's hsdpd.

    import hsdp
    c = hsdp.Client(job_id="demo", rank=r, world_size=2)   # $HSDPD_SOCKET or default
    x = c.tensor((1024,), torch.float32)   # lives in shared hsdpd memory
    x.fill_(r)
    c.all_reduce(x)                        # zero-copy: no staging copy
    y = torch.ones(10)                     # ordinary memory: staged through the pool
    c.all_reduce(y, op="avg")

Collectives take torch tensors or numpy arrays, are in-place or write `out`,
and block unless async_op=True, which returns a Work. Thread-safety: a Client
may be used from several threads.
"""
import os

import numpy as np

from hsdp import _hsdp
from hsdp.dtypes import hsdp_dtype, itemsize, require_reducible
from hsdp.memory import BufferRegistry, StagingPool, align_up, is_torch, numpy_view, torch_view
from hsdp.plan import Plan, split_counts


def default_socket_path():
    """The socket a Client connects to by default: $HSDPD_SOCKET, else the default path."""
    return _hsdp.default_socket_path()


class Work:
    """A queued collective. wait() raises the operation's error (HsdpError)."""

    def __init__(self, work, plan=None, result=None):
        self._work = work
        self._plan = plan
        self._result = result
        self._finished = plan is None

    def test(self):
        """True once ended; finishes staging copies then. Never blocks on the daemon."""
        if not self._work.test():
            return False
        self._finish()
        return True

    def wait(self, timeout=None):
        """Blocks (GIL released) until done; returns the result (tensor/array or None)."""
        try:
            self._work.wait(timeout)
        except _hsdp.DeadlineExceeded:
            raise
        except BaseException:
            if self._plan is not None:
                self._plan.release()
            self._finished = True
            raise
        self._finish()
        return self._result

    def _finish(self):
        if not self._finished:
            self._finished = True
            self._plan.finish()

    @property
    def exec_ns(self):
        return self._work.exec_ns

    @property
    def queued_ns(self):
        return self._work.queued_ns

    @property
    def op_id(self):
        return self._work.op_id

    @property
    def peer(self):
        """A finished recv: the group rank the data came from (with src=-1); else -1."""
        return self._work.peer


class Client:
    """A session with hsdpd: shared buffers, groups, collectives.

    Args:
        socket_path: the daemon's socket; None means $HSDPD_SOCKET, else the default path.
        job_id: the job's name; a job is its owner's uid plus this name, so other users'
            jobs of the same name are other jobs. None: derived from the launcher's run id
            ($HSDP_JOB_ID, $TORCHELASTIC_RUN_ID, $SLURM_JOB_ID[.$SLURM_STEP_ID],
            $PMIX_NAMESPACE), or a fresh one for a single-rank job; a multi-rank job with none
            of these raises InvalidArgument (see README, "Job ids").
        rank, world_size, local_rank, device: the session's identity.
        owner_uid: join the job of this uid instead of the caller's own (root and the
            daemon's uid only, and only a job that exists).
        priority_class: the job's class of service on the daemon (its node.yaml's
            jobs.priority_classes); None: $HSDP_PRIORITY_CLASS, else the class the job
            matches. Only a class at or below the job's own is granted.
        connect_timeout: seconds to wait for the daemon (Unavailable after).
        reconnect: when the daemon goes away (drained or killed, then restarted), the
            operations in flight raise Unavailable and the next call connects again by
            itself: buffers registered again, groups re-created in creation order, the
            same Buffer and Group objects keep working. reconnect_timeout: seconds that
            call waits for a daemon on the same socket.
        staging_min_bytes: the smallest staging buffer the pool allocates.
    """

    def __init__(self, socket_path=None, job_id=None, rank=0, world_size=1, local_rank=0,
                 device="cpu", connect_timeout=10.0, staging_min_bytes=1 << 20, owner_uid=None,
                 priority_class=None, reconnect=True, reconnect_timeout=60.0):
        if not isinstance(rank, int) or not isinstance(world_size, int) or world_size < 1 \
                or not 0 <= rank < world_size:
            raise ValueError(
                f"rank/world_size: need 0 <= rank < world_size, got rank={rank!r} "
                f"world_size={world_size!r}")
        self._c = _hsdp.Client(
            socket_path=socket_path or os.environ.get("HSDPD_SOCKET", ""), job_id=job_id or "",
            rank=rank, world_size=world_size, local_rank=local_rank, device=device,
            connect_timeout=connect_timeout, owner_uid=owner_uid,
            priority_class=(os.environ.get("HSDP_PRIORITY_CLASS", "")
                            if priority_class is None else priority_class),
            reconnect=reconnect, reconnect_timeout=reconnect_timeout)
        self.registry = BufferRegistry()
        self.staging = StagingPool(self._alloc_staging, staging_min_bytes)
        self._world = None
        self._closed = False

    # -- identity ------------------------------------------------------------
    rank = property(lambda self: self._c.rank)
    world_size = property(lambda self: self._c.world_size)
    job_id = property(lambda self: self._c.job_id)
    reconnects = property(lambda self: self._c.reconnects)
    session_id = property(lambda self: self._c.session_id)
    socket_path = property(lambda self: self._c.socket_path)
    raw = property(lambda self: self._c, doc="The underlying hsdp._hsdp.Client.")

    # -- memory --------------------------------------------------------------
    def buffer(self, nbytes, name=""):
        """A zero-filled shared buffer of `nbytes` (hsdp._hsdp.Buffer)."""
        if not isinstance(nbytes, int) or nbytes <= 0:
            raise ValueError(f"nbytes: must be a positive int, got {nbytes!r}")
        buf = self._c.alloc(nbytes, name)
        self.registry.add(buf)
        return buf

    def _alloc_staging(self, nbytes, name):
        return self.buffer(nbytes, name)

    def free(self, buffer):
        """Unregisters `buffer`; raises FailedPrecondition while views of it exist."""
        self._c.free(buffer)
        self.registry.remove(buffer)

    def tensor(self, shape, dtype=None, name=""):
        """A zero-filled torch tensor in shared hsdpd memory (collectives on it are zero-copy)."""
        import torch
        dtype = torch.float32 if dtype is None else dtype
        shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        nbytes = max(numel * itemsize(dtype), 1)
        buf = self.buffer(align_up(nbytes), name)
        return torch_view(buf, 0, numel * itemsize(dtype), dtype, shape)

    def array(self, shape, dtype=np.float32, name=""):
        """A zero-filled numpy array in shared hsdpd memory."""
        dtype = np.dtype(dtype)
        shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        buf = self.buffer(align_up(max(numel * dtype.itemsize, 1)), name)
        return numpy_view(buf, 0, numel * dtype.itemsize, dtype, shape)

    def locate(self, x):
        """(Buffer, byte offset) if x is contiguous and lives in hsdpd memory, else None."""
        return self.registry.locate_array(x)

    # -- groups --------------------------------------------------------------
    def new_group(self, ranks):
        """Creates or joins the group of these global ranks (all members pass the same list)."""
        ranks = [int(r) for r in ranks]
        return self._c.new_group(ranks)

    def rejoin_group(self, group):
        """Joins `group` again after its epoch ended (a member left): returns it in the
        next epoch, which starts once every member joined it (a restarted member joins
        by creating the group anew)."""
        return self._c.rejoin_group(group)

    @property
    def world(self):
        """The group of all ranks of the job (created on first use)."""
        if self._world is None:
            self._world = self.new_group(list(range(self.world_size)))
        return self._world

    # -- collectives ---------------------------------------------------------
    def _run(self, submit, plan, result, async_op):
        try:
            raw = submit()
        except BaseException:
            plan.release()
            raise
        work = Work(raw, plan, result)
        return work if async_op else work.wait()

    def all_reduce(self, x, group=None, op="sum", *, premul=1.0, pre_divide=1.0,
                   post_divide=1.0, reduce_dtype=None, async_op=False, latency_critical=False):
        """In-place all-reduce of x over `group` (default: world). latency_critical: the
        daemon runs it ahead of this job's other queued operations."""
        g = group or self.world
        dt = require_reducible(x.dtype, "all_reduce")
        rdt = None if reduce_dtype is None else require_reducible(reduce_dtype, "reduce_dtype")
        plan = Plan(self)
        ref = plan.inout(x)
        n = _numel(x)
        return self._run(lambda: self._c.all_reduce(
            g, ref, ref, n, dt, op=op, premul=premul, pre_divide=pre_divide,
            post_divide=post_divide, reduce_dtype=rdt, latency_critical=latency_critical),
            plan, x, async_op)

    def all_gather(self, out, x, group=None, async_op=False, latency_critical=False):
        """Gathers every rank's x into out (out.numel() == x.numel() * group.size).
        latency_critical: the daemon runs it ahead of this job's other queued operations."""
        g = group or self.world
        _check_numel("all_gather", out, _numel(x) * g.size)
        plan = Plan(self)
        send, recv = plan.input(x), plan.output(out)
        dt, n = _wire(x)
        return self._run(lambda: self._c.all_gather(g, send, recv, n, dt,
                                                    latency_critical=latency_critical),
                         plan, out, async_op)

    def reduce_scatter(self, out, x, group=None, op="sum", *, premul=1.0, pre_divide=1.0,
                       post_divide=1.0, reduce_dtype=None, async_op=False):
        """Reduces x over the group; rank r receives chunk r in out."""
        g = group or self.world
        _check_numel("reduce_scatter", x, _numel(out) * g.size)
        dt = require_reducible(x.dtype, "reduce_scatter")
        rdt = None if reduce_dtype is None else require_reducible(reduce_dtype, "reduce_dtype")
        plan = Plan(self)
        send, recv = plan.input(x), plan.output(out)
        n = _numel(out)
        return self._run(lambda: self._c.reduce_scatter(
            g, send, recv, n, dt, op=op, premul=premul, pre_divide=pre_divide,
            post_divide=post_divide, reduce_dtype=rdt), plan, out, async_op)

    def reduce_scatter_all_reduce(self, out, x, shard, replicate, op="sum", *, premul=1.0,
                                  pre_divide=1.0, post_divide=1.0, reduce_dtype=None,
                                  async_op=False):
        """HSDP gradient reduction in one submission (see Client.reduce_scatter_all_reduce)."""
        _check_numel("reduce_scatter_all_reduce", x, _numel(out) * shard.size)
        dt = require_reducible(x.dtype, "reduce_scatter_all_reduce")
        rdt = None if reduce_dtype is None else require_reducible(reduce_dtype, "reduce_dtype")
        plan = Plan(self)
        send, recv = plan.input(x), plan.output(out)
        n = _numel(out)
        return self._run(lambda: self._c.reduce_scatter_all_reduce(
            shard, replicate, send, recv, n, dt, op=op, premul=premul, pre_divide=pre_divide,
            post_divide=post_divide, reduce_dtype=rdt), plan, out, async_op)

    def broadcast(self, x, root=0, group=None, async_op=False):
        """In-place broadcast of x from group rank `root`."""
        g = group or self.world
        plan = Plan(self)
        ref = plan.inout(x)
        dt, n = _wire(x)
        return self._run(lambda: self._c.broadcast(g, ref, ref, n, dt, root), plan, x, async_op)

    def send(self, x, dst, group=None, tag=0, async_op=False):
        """Sends x to group rank `dst`; matched with its recv of the same tag, in order."""
        g = group or self.world
        plan = Plan(self)
        ref = plan.input(x)
        dt, n = _wire(x)
        return self._run(lambda: self._c.send(g, ref, n, dt, int(dst), int(tag)), plan, None,
                         async_op)

    def recv(self, x, src=-1, group=None, tag=0, async_op=False):
        """Receives into x from group rank `src` (-1: any; see Work.peer)."""
        g = group or self.world
        plan = Plan(self)
        ref = plan.output(x)
        dt, n = _wire(x)
        return self._run(lambda: self._c.recv(g, ref, n, dt, int(src), int(tag)), plan, x,
                         async_op)

    def all_to_all(self, out, x, group=None, out_splits=None, in_splits=None, async_op=False):
        """Block j of x goes to rank j; out holds the blocks from every rank in rank order.

        Equal blocks by default; out_splits / in_splits give per-rank element
        counts (what this rank receives from / sends to each rank), as in torch.
        """
        g = group or self.world
        plan = Plan(self)
        send, recv = plan.input(x), plan.output(out)
        dt, n = _wire(x)
        unit = n // _numel(x) if _numel(x) else 1  # wire elements per element (1 unless bytes)
        if out_splits is None and in_splits is None:
            if _numel(x) % g.size or _numel(out) != _numel(x):
                raise ValueError(f"all_to_all: x ({_numel(x)} elements) and out "
                                 f"({_numel(out)}) must split into {g.size} equal blocks")
            return self._run(lambda: self._c.all_to_all(g, send, recv, n // g.size, dt),
                             plan, out, async_op)
        sends = split_counts("all_to_all in_splits", in_splits, _numel(x), g.size)
        recvs = split_counts("all_to_all out_splits", out_splits, _numel(out), g.size)
        lease, ref = plan.scratch(16 * g.size)
        counts = numpy_view(lease.buffer, 0, 16 * g.size, np.uint64, (2 * g.size,))
        counts[:g.size] = [c * unit for c in sends]
        counts[g.size:] = [c * unit for c in recvs]
        return self._run(lambda: self._c.all_to_all(g, send, recv, 0, dt, splits=ref), plan,
                         out, async_op)

    def barrier(self, group=None, async_op=False):
        g = group or self.world
        return self._run(lambda: self._c.barrier(g), Plan(self), None, async_op)

    # -- lifetime ------------------------------------------------------------
    def close(self):
        """Detaches; outstanding Work fails with Cancelled. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.staging.close()
        try:
            self._c.detach()
        except _hsdp.HsdpError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _numel(x):
    return x.numel() if is_torch(x) else x.size


def _check_numel(what, x, want):
    if _numel(x) != want:
        raise ValueError(f"{what}: expected {want} elements, got {_numel(x)} "
                         f"(shape {tuple(x.shape)})")


def _wire(x):
    """(dtype name, count) moving x: its own dtype when hsdpd knows it, else bytes."""
    name = hsdp_dtype(x.dtype)
    if name is not None:
        return name, _numel(x)
    return "uint8", _numel(x) * (x.element_size() if is_torch(x) else x.itemsize)
