"""FSDP2 (fully_shard) adapters that put FSDP2's communication buffers in
hsdpd shared memory, so its all-gathers and reduce-scatters run zero-copy.

torch >= 2.7 FSDPModule offers set_custom_all_gather(comm) and
set_custom_reduce_scatter(comm): FSDP2 asks comm.allocate(size, dtype=,
device=) for its staging buffers (the all-gather output, of which its input
is a slice; the reduce-scatter input and output) and calls comm(...) for the
collective. use_hsdp_comm_buffers() installs adapters whose buffers come from
the session's pool of hsdpd memory, so the backend hands them to the daemon
in place instead of copying them into and out of its own staging buffers.
On a torch without these hooks it raises NotImplementedError naming what is
missing (see capabilities()).

composite=True (HSDP, a 2-D mesh) also runs each reduce-scatter and the
all-reduce of its output across the replicate group as ONE daemon operation
(the pipelined reduce-scatter -> all-reduce composite of hsdp.flat_param);
FSDP2's own all-reduce of that output then completes at once (a one-shot
hook on the replicate group). Gradient accumulation with
set_requires_all_reduce(False) keeps working: while FSDP2 holds a partial
sum to add before its all-reduce, the plain reduce-scatter runs instead.
"""
import threading
import weakref

import torch
import torch.distributed as dist

from hsdp.memory import align_up, torch_view
from hsdp.torch import _compat, fsdp2_overlap, reduce_ops, session
from hsdp.torch.completion import completed_work

try:  # the protocol classes, where this torch defines them
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _RSBase
except Exception:  # noqa: BLE001 - older torch or fsdp not importable
    _AllGatherBase = _RSBase = object
try:  # torch's comms that take their buffers from the process group (torch >= 2.8)
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
        ProcessGroupAllocAllGather as _PGAllocAllGather,
        ProcessGroupAllocReduceScatter as _PGAllocReduceScatter)
except Exception:  # noqa: BLE001
    _PGAllocAllGather = _PGAllocReduceScatter = None


class _LeaseReturn:
    """Returns a staging lease to its pool when the last view of it dies."""

    __slots__ = ("lease",)

    def __init__(self, lease):
        self.lease = lease

    def __del__(self):
        self.lease.release()


def allocate_shared(size, dtype, device=None, client=None):
    """A tensor of `size` in hsdpd memory from the session's staging pool.

    The memory returns to the pool exactly when the tensor's storage is freed.
    """
    if device is not None and torch.device(device).type != "cpu":
        raise RuntimeError(f"hsdpd communication buffers are host memory; got device {device}")
    client = client or session.current()
    shape = tuple(int(s) for s in size)
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    lease = client.staging.acquire(align_up(max(nbytes, 1)))
    return torch_view(lease.buffer, 0, nbytes, dtype, shape, keepalive=_LeaseReturn(lease))


class _SharedAllocator:
    """allocate() from hsdpd memory; counts what it handed out and how the calls went."""

    def __init__(self, client=None):
        self._client = client
        self.allocations = 0
        self.calls = 0
        self.staged_calls = 0  # collectives for which the backend still staged a copy
        self._lock = threading.Lock()

    def allocate(self, size, *, dtype, device):
        with self._lock:
            self.allocations += 1
        return allocate_shared(size, dtype, device, self._client)

    def _counted(self, submit):
        """Runs submit(); a staging acquisition during it means the backend copied."""
        staging = (self._client or session.current()).staging
        before = staging.stats()["acquisitions"]
        work = submit()
        with self._lock:
            self.calls += 1
            if staging.stats()["acquisitions"] != before:
                self.staged_calls += 1
        return work


class HsdpAllGather(_SharedAllocator, _AllGatherBase):
    """FSDP2 AllGather comm: buffers in hsdpd memory, all_gather_into_tensor via the group."""

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        return self._counted(lambda: dist.all_gather_into_tensor(
            output_tensor, input_tensor, group=group, async_op=async_op))


class _OverlappingReduceScatter:
    """A reduce-scatter comm of one FSDP2 param group whose synchronous calls may
    complete at the end of backward instead (hsdp.torch.fsdp2_overlap decides)."""

    def _init_overlap(self, param_group):
        # Weak: the param group holds this comm.
        self._param_group = weakref.ref(param_group) if param_group is not None else None
        self.overlapped = 0  # reduce-scatters waited at the end of backward, not in the hook

    def _reduce_scatter(self, submit, output_tensor, op, async_op):
        """submit(async_op) issues the collective and returns its Work (or None)."""
        if not async_op and self._param_group is not None:
            if fsdp2_overlap.defer_allowed(self._param_group(), reduce_ops.name_of(op),
                                           output_tensor):
                if fsdp2_overlap.defer(lambda: submit(True)):
                    with self._lock:
                        self.overlapped += 1
                    return None
        return submit(async_op)


class HsdpReduceScatter(_SharedAllocator, _OverlappingReduceScatter, _RSBase):
    """FSDP2 ReduceScatter comm: buffers in hsdpd memory, reduce_scatter_tensor via the group.

    param_group: the FSDP2 param group it serves, when it serves one: its reduce-scatters
    may then overlap the rest of backward (hsdp.torch.fsdp2_overlap)."""

    def __init__(self, client=None, param_group=None):
        _SharedAllocator.__init__(self, client)
        self._init_overlap(param_group)

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return self._reduce_scatter(lambda run_async: self._counted(
            lambda: dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                               async_op=run_async)),
            output_tensor, op, async_op)


class _AutoComm(_SharedAllocator):
    """What hsdp.torch.fsdp2_auto installs by default: torch's ProcessGroupAlloc comm
    (so FSDP2's set_allocate_memory_from_process_group accepts it) with its buffers
    from hsdpd memory, or torch.empty when hsdpd cannot give one (`fallbacks`)."""

    auto = True

    def __init__(self, group):
        _SharedAllocator.__init__(self)
        self._group = group
        self.fallbacks = 0

    def allocate(self, size, *, dtype, device):
        from hsdp.torch.fsdp2_auto import allocate_or_fallback
        tensor, in_hsdpd = allocate_or_fallback(size, dtype, device)
        with self._lock:
            self.allocations += 1
            self.fallbacks += int(not in_hsdpd)
        return tensor


if _PGAllocAllGather is not None:
    class HsdpAutoAllGather(_AutoComm, _PGAllocAllGather):
        """FSDP2's all-gather (all_gather_single) with its output in hsdpd memory."""

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            return self._counted(lambda: _PGAllocAllGather.__call__(
                self, output_tensor, input_tensor, group, async_op))

    class HsdpAutoReduceScatter(_AutoComm, _OverlappingReduceScatter, _PGAllocReduceScatter):
        """FSDP2's reduce-scatter (reduce_scatter_single), its buffers in hsdpd memory;
        those of `param_group` may overlap the rest of backward."""

        def __init__(self, group, param_group=None):
            _AutoComm.__init__(self, group)
            self._init_overlap(param_group)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            return self._reduce_scatter(lambda run_async: self._counted(
                lambda: _PGAllocReduceScatter.__call__(self, output_tensor, input_tensor, group,
                                                       op, run_async)),
                output_tensor, op, async_op)
else:
    HsdpAutoAllGather = HsdpAutoReduceScatter = None


class HsdpCompositeReduceScatter(HsdpReduceScatter):
    """HSDP: reduce-scatter in the shard group and all-reduce across `replicate` as one
    daemon operation, for FSDP2 param group `param_group` (whose state says whether
    FSDP2 all-reduces this time)."""

    def __init__(self, param_group, replicate, client=None):
        super().__init__(client)  # no param group: HSDP's reduce-scatters are never deferred
        self._hsdp_param_group = param_group
        self._replicate = replicate
        self.composites = 0

    def _composite_now(self, group):
        pg = self._hsdp_param_group
        return (pg.all_reduce_grads and pg._partial_reduce_output is None
                and hasattr(group, "hsdp_group") and hasattr(self._replicate, "hsdp_group"))

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        if not self._composite_now(group):
            return super().__call__(output_tensor, input_tensor, group, op, async_op)
        name, premul = reduce_ops.to_hsdp(op, "reduce_scatter (composite)")
        shard_n, rep_n = group.size(), self._replicate.size()
        # FSDP2's pairs: AVG then AVG = the mean over shard x replicate; PREMUL_SUM(f)
        # then SUM; SUM then SUM (it divides afterwards itself).
        post = float(shard_n * rep_n) if name == "avg" else 1.0
        wire = "sum" if name in ("avg", "premul_sum") else name
        if wire != "sum":
            raise NotImplementedError(f"hsdpd composite reduce-scatter: reduce op {name}")
        work = self._counted(lambda: _submit_composite(
            group, self._replicate, output_tensor, input_tensor, premul, post))
        self.composites += 1
        expect = (output_tensor.data_ptr(), output_tensor.numel())

        def skip_all_reduce(tensors, _op):
            t = tensors[0] if len(tensors) == 1 else None
            if t is None or (t.data_ptr(), t.numel()) != expect:
                raise RuntimeError(
                    "hsdpd composite reduce-scatter: FSDP2 all-reduced another tensor "
                    "than the composite's output; this torch's FSDP2 is not supported "
                    "with use_hsdp_comm_buffers(composite=True)")
            work.wait()
            return completed_work(tensors)
        # Armed only once the composite is issued (async) or done (sync): a failed
        # composite leaves FSDP2's all-reduce to run, and fail, on its own.
        if not async_op:
            work.wait()
        self._replicate._next_allreduce_hook = skip_all_reduce
        return work if async_op else None


def _submit_composite(group, replicate, output, input, premul, post):  # noqa: A002
    """One ReduceScatterAllReduce on the groups' hsdpd groups; a torch Work."""
    from hsdp.dtypes import hsdp_dtype
    from hsdp.plan import Plan
    from hsdp.torch._tensors import _check
    _check(input, "reduce_scatter (composite)")
    _check(output, "reduce_scatter (composite)")
    dt = hsdp_dtype(output.dtype)
    if dt is None or output.dtype != input.dtype:
        raise TypeError(f"hsdpd composite reduce-scatter: cannot reduce {input.dtype} into "
                        f"{output.dtype}")
    client = group.hsdp_client
    plan = Plan(client)
    send, recv = plan.input(input), plan.output(output)
    shard, rep = group.hsdp_group, replicate.hsdp_group
    return group._submit("reduce_scatter_all_reduce", plan, lambda: (
        client.raw.reduce_scatter_all_reduce(shard, rep, send, recv, output.numel(), dt,
                                             op="sum", premul=premul, post_divide=post)),
        [output], [input])


def all_reduce_hook(group, op=None):
    """A set_all_reduce_hook callable all-reducing FSDP2's reduce output over `group`."""
    op = dist.ReduceOp.SUM if op is None else op

    def hook(reduce_output):
        dist.all_reduce(reduce_output, op=op, group=group)
    return hook


def _param_groups(module):
    cls = _compat.fsdp2_module_class()
    for m in module.modules():
        if isinstance(m, cls):
            yield m, list(m._get_fsdp_state()._fsdp_param_groups)


def use_hsdp_comm_buffers(module, *, composite=False):
    """Installs HsdpAllGather / HsdpReduceScatter on every FSDP2 module under `module`
    (HsdpCompositeReduceScatter on HSDP modules with composite=True).

    Returns the number of modules changed. NotImplementedError when this torch
    lacks the hooks (the message says which).
    """
    hooks = _compat.fsdp2_hook_status()
    missing = [k for k in ("set_custom_all_gather", "set_custom_reduce_scatter")
               if not hooks.get(k)]
    if missing:
        raise NotImplementedError(
            f"torch {torch.__version__} FSDP2 lacks {', '.join(missing)}; FSDP2 still works "
            "with the hsdpd backend, its buffers are then staged (one copy each way)")
    count = 0
    for m, groups in _param_groups(module):
        m.set_custom_all_gather(HsdpAllGather())
        hsdp_groups = [g for g in groups if g._is_hsdp]
        if composite and len(groups) == 1 and hsdp_groups:
            g = hsdp_groups[0]
            # The composite must know when FSDP2 all-reduces and whether it holds an
            # accumulated shard to add first (torch 2.15's names); without them it
            # could skip an all-reduce that FSDP2 needs.
            lacking = [a for a in ("all_reduce_grads", "_partial_reduce_output")
                       if not hasattr(g, a)]
            if lacking:
                raise NotImplementedError(
                    f"use_hsdp_comm_buffers(composite=True): torch {torch.__version__}'s "
                    f"FSDP2 param group has no {', '.join(lacking)}; use composite=False")
            m.set_custom_reduce_scatter(HsdpCompositeReduceScatter(
                g, g.mesh_info.replicate_process_group))
        else:
            m.set_custom_reduce_scatter(
                HsdpReduceScatter(param_group=groups[0] if len(groups) == 1 else None))
        count += 1
    return count


def _torch_pg_alloc_on_hsdpd(comm):
    if _PGAllocAllGather is None or isinstance(comm, _SharedAllocator) or not isinstance(
            comm, (_PGAllocAllGather, _PGAllocReduceScatter)):
        return False
    holder = getattr(getattr(comm, "_group", None), "_hsdp_name_holder", None)
    return holder is not None and holder.supports_tensor_alloc(torch.device("cpu"))


def comm_buffer_stats(module):
    """Which path FSDP2's collectives under `module` took, and totals over hsdp's comms.

    path: "hsdpd" (every param group's all-gather and reduce-scatter comm is hsdp's and
    none of their collectives was staged), "staged" (none is: torch's defaults, e.g.
    HSDP_COMM_BUFFERS=0, another backend, CUDA), "mixed" (some of each, or staged
    calls), "none" (no FSDP2 module under `module`). auto: comms installed by default
    (hsdp.torch.fsdp2_auto); default_comms: torch's own comms with torch.empty buffers;
    pg_alloc_comms: torch's comms taking hsdpd memory from the backend
    (set_allocate_memory_from_process_group_for_comm(True); their calls are not
    counted here: the group's name holder counts `allocations`). allocations (buffers
    FSDP2 took from hsdp's comms), fallbacks (of those, torch.empty because hsdpd could
    not give memory), calls, staged_calls (collectives the backend had to copy for:
    0 when every buffer was in hsdpd memory), composites and overlapped (reduce-scatters
    waited at the end of backward instead of in FSDP2's hook: hsdp.torch.fsdp2_overlap)."""
    out = {"path": "none", "auto": 0, "default_comms": 0, "pg_alloc_comms": 0,
           "allocations": 0, "fallbacks": 0,
           "calls": 0, "staged_calls": 0, "composites": 0, "overlapped": 0}
    seen = set()
    ours = 0
    for _, groups in _param_groups(module):
        for g in groups:
            for comm in (g._all_gather_comm, g._reduce_scatter_comm):
                if _torch_pg_alloc_on_hsdpd(comm):
                    # set_allocate_memory_from_process_group_for_comm(True): torch's comm,
                    # its buffers from the backend's allocate_tensor (name_holder.py).
                    out["pg_alloc_comms"] += 1
                    ours += 1
                    continue
                if not isinstance(comm, _SharedAllocator):
                    out["default_comms"] += 1
                    continue
                ours += 1
                if id(comm) in seen:
                    continue
                seen.add(id(comm))
                out["auto"] += int(getattr(comm, "auto", False))
                out["allocations"] += comm.allocations
                out["fallbacks"] += getattr(comm, "fallbacks", 0)
                out["calls"] += comm.calls
                out["staged_calls"] += comm.staged_calls
                out["composites"] += getattr(comm, "composites", 0)
                out["overlapped"] += getattr(comm, "overlapped", 0)
    if ours and not out["default_comms"]:
        out["path"] = "hsdpd" if out["staged_calls"] == 0 else "mixed"
    elif out["default_comms"]:
        out["path"] = "staged" if not ours else "mixed"
    return out
