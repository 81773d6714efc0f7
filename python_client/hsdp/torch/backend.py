"""ProcessGroupHsdp: the torch.distributed backend "hsdpd".

Each torch process group maps to one hsdpd group (the same global ranks);
every torch collective becomes exactly one hsdpd operation, so all members
issue the same sequence of operations whatever their memory placement
(sparse all-reduce: three all-gathers, sparse.py; monitored_barrier: the
group's store).
Tensors already in hsdpd memory (hsdp.torch.empty / Client.tensor) are used
in place (zero-copy); others are staged through the session's pool of
registered buffers. Returned Work objects complete on a helper thread (see
completion.py). CUDA tensors of all-reduce, all-gather / reduce-scatter into /
from a tensor and broadcast go through the daemon's device path
(cuda_ops.py); other collectives refuse them with a clear error.
Point-to-point and all-to-all: p2p.py; reduce / gather / scatter: rooted.py;
what torch's C++ side keeps for the group (name, device type): name_holder.py.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch._C._distributed_c10d as c10d
from torch._C._distributed_c10d import ProcessGroup

from hsdp.memory import ALIGN, address_of, is_contiguous
from hsdp.plan import Plan, region_like
from hsdp.torch import fsdp2_auto, reduce_ops, session, sparse
from hsdp.torch._tensors import _as_list, _check, _nbytes, _opt, _reducible, _wire
from hsdp.torch.completion import Completer, completed_work
from hsdp.torch.name_holder import BACKEND_NAME, attach_name_holder
from hsdp.torch.p2p import PointToPointMixin
from hsdp.torch.rooted import RootedMixin

_GROUP_RANK_KEY = "hsdp/global_rank/{}"
_SUPPORTED_OPS = ("allreduce, allreduce_coalesced, allgather, _allgather_base, "
                  "allgather_coalesced, allgather_into_tensor_coalesced, reduce_scatter, "
                  "_reduce_scatter_base, reduce_scatter_tensor_coalesced, broadcast, barrier, "
                  "reduce, gather, scatter, send, recv, recv_anysource, alltoall, "
                  "alltoall_base")


# Profiler event names (after "hsdpd:"), as Gloo names its events ("gloo:all_reduce").
_PROFILE_NAMES = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "allgather": "all_gather", "allgather_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather_into_tensor",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "recv_anysource": "recvAnySource", "alltoall_base": "all_to_all",
    "alltoall": "all_to_all",
}


class ProcessGroupHsdp(PointToPointMixin, RootedMixin, ProcessGroup):
    """A torch ProcessGroup executing its collectives in hsdpd."""

    def __init__(self, client, group, rank, size, timeout, store=None):
        super().__init__(rank, size)
        self._client = client
        self._group = group
        self._store = store
        self._monitored_seq = 0
        self._timeout_s = timeout.total_seconds() if isinstance(
            timeout, datetime.timedelta) else float(timeout)
        self._completer = Completer(f"g{group.id}", self._timeout_s)
        # $HSDP_WARM_RESTART=1: when a member left (its trainer died), the group's
        # epoch ended and its ops failed; the next op joins the group's next
        # epoch first, which starts when the restarted member creates the group
        # anew (so it waits for it, up to the collective timeout). Unset: every
        # later op fails at once, naming the member that left.
        self._rejoin = False
        if os.environ.get("HSDP_WARM_RESTART", "") == "1":
            self._completer.on_failure = self._note_failure
        # $HSDP_LATENCY_CRITICAL=all_gather: this group's all-gathers go ahead of
        # the job's other queued work on the daemon (docs/qos.md).
        self._gather_critical = "all_gather" in os.environ.get(
            "HSDP_LATENCY_CRITICAL", "").replace(" ", "").split(",")

    # -- identity ------------------------------------------------------------
    def getBackendName(self):  # noqa: N802 - torch's name
        return BACKEND_NAME

    # torch keeps a ProcessGroup's name in its backends (see _NameHolder); the
    # name is kept here too, so `group_name` never depends on that.
    def _set_group_name(self, name):
        self._hsdp_group_name = name
        super()._set_group_name(name)

    @property
    def group_name(self):
        name = getattr(self, "_hsdp_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    def name(self):
        return BACKEND_NAME

    @property
    def hsdp_group(self):
        """The hsdpd group (id, global ranks) behind this process group."""
        return self._group

    @property
    def hsdp_client(self):
        return self._client

    def hsdp_stats(self):
        """{"ops", "failed", "exec_ns", "queued_ns"}: completed operations of this group and
        the daemon-side time spent executing / waiting for peers."""
        return self._completer.stats()

    def __repr__(self):
        return (f"<ProcessGroupHsdp rank={self.rank()} size={self.size()} "
                f"ranks={self._group.ranks} hsdpd_group={self._group.id}>")

    # -- plumbing ------------------------------------------------------------
    def _note_failure(self, error):
        if "join the group again" in str(error):
            self._rejoin = True

    def _submit(self, what, plan, submit, result, inputs=()):
        """Submits one hsdpd operation; `inputs` are the tensors the profiler shows."""
        if self._rejoin:
            self._rejoin = False
            self._group = self._client.rejoin_group(self._group)
            self._cuda_path = None  # made again for the group's new epoch
        try:
            raw = submit()
        except BaseException:
            plan.release()
            raise
        # The inputs stay referenced until the operation completes (a zero-copy one may be
        # a pool lease, which must not go back to the pool while the daemon reads it).
        plan.hold = inputs
        return self._completer.add(raw, plan, result, f"{what} on {self._desc()}",
                                   (_PROFILE_NAMES.get(what, what), inputs))

    def _cuda(self):
        """The device path (created on the first CUDA tensor)."""
        if getattr(self, "_cuda_path", None) is None:
            from hsdp.torch.cuda_ops import CudaPath
            self._cuda_path = CudaPath(self._client, self._group, self._timeout_s)
        return self._cuda_path

    def _desc(self):
        return f"group {self._group.id} (global ranks {self._group.ranks})"

    def _span(self, tensors):
        """(buffer_id, offset) if tensors are back to back in one hsdpd buffer, else None."""
        ref = None
        expect = None
        for t in tensors:
            if not is_contiguous(t):
                return None
            found = self._client.registry.locate_array(t)
            if found is None:
                return None
            addr, nbytes = address_of(t)
            if ref is None:
                ref = (found[0].id, found[1])
            elif addr != expect:
                return None
            expect = addr + nbytes
        return ref

    def _dense_region(self, plan, tensors, copy_in):
        """A staging region holding `tensors` back to back (no padding)."""
        lease, ref = plan.scratch(sum(_nbytes(t) for t in tensors))
        off = 0
        views = []
        for t in tensors:
            views.append(region_like(lease, t, off))
            off += _nbytes(t)
        if copy_in:
            for v, t in zip(views, tensors):
                v.copy_(t)
        return ref, views

    # -- all-reduce ----------------------------------------------------------
    # A one-shot hook on this group's next allreduce: hook(tensors, op) -> a Work that
    # replaces it, or None (hsdp.torch.fsdp2's composite reduce-scatter, which has
    # all-reduced FSDP2's shard across this group already).
    _next_allreduce_hook = None

    def allreduce(self, tensors, opts=None):
        tensors = _as_list(tensors)
        hook, self._next_allreduce_hook = self._next_allreduce_hook, None
        if hook is not None:
            work = hook(tensors, _opt(opts, "reduceOp", dist.ReduceOp.SUM))
            if work is not None:
                return work
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        t = tensors[0]
        op = _opt(opts, "reduceOp", dist.ReduceOp.SUM)
        if isinstance(t, torch.Tensor) and t.layout == torch.sparse_coo:
            return sparse.allreduce(self, t, op)
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return self._cuda().allreduce(t, op)
        _check(t, "allreduce")
        name, premul = reduce_ops.to_hsdp(op, "allreduce")
        dt = _reducible(t, "allreduce")
        plan = Plan(self._client)
        ref = plan.inout(t)
        return self._submit("allreduce", plan, lambda: self._client.raw.all_reduce(
            self._group, ref, ref, t.numel(), dt, op=name, premul=premul), tensors, tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        tensors = _as_list(tensors)
        for t in tensors:
            _check(t, "allreduce_coalesced")
        op = _opt(opts, "reduceOp", dist.ReduceOp.SUM)
        name, premul = reduce_ops.to_hsdp(op, "allreduce_coalesced")
        dtypes = {t.dtype for t in tensors}
        if len(dtypes) != 1:
            raise TypeError("hsdpd backend allreduce_coalesced: all tensors must share one "
                            f"dtype, got {sorted(str(d) for d in dtypes)}")
        dt = _reducible(tensors[0], "allreduce_coalesced")
        plan = Plan(self._client)
        _, ref, _ = plan.packed(tensors, copy_in=True, copy_out=True, align=ALIGN)
        # One op over the packed region; the padding between tensors is reduced too, harmlessly.
        count = plan.staged_bytes // tensors[0].element_size()
        return self._submit("allreduce_coalesced", plan, lambda: self._client.raw.all_reduce(
            self._group, ref, ref, count, dt, op=name, premul=premul), tensors, tensors)

    # -- all-gather ----------------------------------------------------------
    def allgather(self, output_tensors, input_tensors, opts=None):
        inputs = _as_list(input_tensors)
        if inputs and isinstance(output_tensors, (list, tuple)) and output_tensors and \
                isinstance(output_tensors[0], torch.Tensor):
            output_tensors = [output_tensors]  # the (List[Tensor], Tensor) overload
        if len(inputs) != 1 or len(output_tensors) != 1:
            raise RuntimeError("hsdpd backend allgather: exactly one input tensor per process "
                               "(multi-device lists are not supported)")
        x, outs = inputs[0], list(output_tensors[0])
        _check(x, "allgather")
        n = self.size()
        if len(outs) != n:
            raise ValueError(f"hsdpd backend allgather: need {n} output tensors, got {len(outs)}")
        for o in outs:
            _check(o, "allgather")
            if o.numel() != x.numel() or o.dtype != x.dtype:
                raise ValueError("hsdpd backend allgather: every output must match the input's "
                                 f"numel {x.numel()} and dtype {x.dtype}")
        dt, count = _wire(x)
        plan = Plan(self._client)
        send = plan.input(x)
        recv = self._span(outs)
        if recv is None:
            recv, views = self._dense_region(plan, outs, copy_in=False)
            plan.after(lambda: [o.copy_(v) for o, v in zip(outs, views)])
        return self._submit("allgather", plan, lambda: self._client.raw.all_gather(
            self._group, send, recv, count, dt, latency_critical=self._gather_critical),
            outs, [x])

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's name
        if input.is_cuda and output.numel() == input.numel() * self.size():
            return self._cuda().all_gather_into_tensor(output, input)
        _check(input, "_allgather_base")
        _check(output, "_allgather_base")
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(
                f"hsdpd backend all_gather_into_tensor: output must hold size*input = "
                f"{self.size()}*{input.numel()} elements of {input.dtype}, got "
                f"{output.numel()} of {output.dtype}")
        dt, count = _wire(input)
        plan = Plan(self._client)
        send, recv = plan.input(input), plan.output(output)
        return self._submit("all_gather_into_tensor", plan, lambda: self._client.raw.all_gather(
            self._group, send, recv, count, dt, latency_critical=self._gather_critical),
            [output], [input])

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        """output_lists[r][j] receives input_list[j] of group rank r."""
        inputs = list(input_list)
        n = self.size()
        if len(output_lists) != n or any(len(ol) != len(inputs) for ol in output_lists):
            raise ValueError("hsdpd backend allgather_coalesced: output_lists must be "
                             f"{n} lists of {len(inputs)} tensors")
        for t in inputs:
            _check(t, "allgather_coalesced")
        plan = Plan(self._client)
        lease, send, offsets = plan.packed(inputs, copy_in=True, align=ALIGN)
        total = plan.staged_bytes
        rlease, recv = plan.scratch(total * n)

        def copy_out():
            for r in range(n):
                for j, t in enumerate(inputs):
                    output_lists[r][j].copy_(region_like(rlease, t, r * total + offsets[j]))
        plan.after(copy_out)
        flat = [o for ol in output_lists for o in ol]
        return self._submit("allgather_coalesced", plan, lambda: self._client.raw.all_gather(
            self._group, send, recv, total, "uint8"), flat, inputs)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        """outputs[j] (size * numel) receives inputs[j] of every group rank, in rank order."""
        outputs, inputs = list(outputs), list(inputs)
        n = self.size()
        if len(outputs) == 1 and len(inputs) == 1:
            # The functional collectives' all_gather_tensor: in place when the tensors
            # live in hsdpd memory (no packing copy).
            return self._allgather_base(outputs[0], inputs[0], opts)
        if len(outputs) != len(inputs):
            raise ValueError("hsdpd backend allgather_into_tensor_coalesced: "
                             f"{len(outputs)} outputs for {len(inputs)} inputs")
        for o, t in zip(outputs, inputs):
            _check(t, "allgather_into_tensor_coalesced")
            _check(o, "allgather_into_tensor_coalesced")
            if o.numel() != t.numel() * n or o.dtype != t.dtype:
                raise ValueError("hsdpd backend allgather_into_tensor_coalesced: output must "
                                 "hold size * input elements of the input's dtype")
        plan = Plan(self._client)
        lease, send, offsets = plan.packed(inputs, copy_in=True, align=ALIGN)
        total = plan.staged_bytes
        rlease, recv = plan.scratch(total * n)

        def copy_out():
            for j, (o, t) in enumerate(zip(outputs, inputs)):
                rows = o.view(n, -1) if o.is_contiguous() else None
                for r in range(n):
                    src = region_like(rlease, t, r * total + offsets[j]).reshape(-1)
                    if rows is not None:
                        rows[r].copy_(src)
                    else:
                        o.view(-1)[r * t.numel():(r + 1) * t.numel()].copy_(src)
        plan.after(copy_out)
        return self._submit("allgather_into_tensor_coalesced", plan,
                            lambda: self._client.raw.all_gather(
                                self._group, send, recv, total, "uint8"), outputs, inputs)

    # -- reduce-scatter ------------------------------------------------------
    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        outs = _as_list(output_tensors)
        if isinstance(input_tensors, (list, tuple)) and input_tensors and \
                isinstance(input_tensors[0], torch.Tensor):
            input_tensors = [input_tensors]  # the (Tensor, List[Tensor]) overload
        if len(outs) != 1 or len(input_tensors) != 1:
            raise RuntimeError("hsdpd backend reduce_scatter: exactly one output tensor per "
                               "process (multi-device lists are not supported)")
        out, ins = outs[0], list(input_tensors[0])
        _check(out, "reduce_scatter")
        n = self.size()
        if len(ins) != n:
            raise ValueError(f"hsdpd backend reduce_scatter: need {n} input tensors, "
                             f"got {len(ins)}")
        for t in ins:
            _check(t, "reduce_scatter")
            if t.numel() != out.numel() or t.dtype != out.dtype:
                raise ValueError("hsdpd backend reduce_scatter: every input must match the "
                                 f"output's numel {out.numel()} and dtype {out.dtype}")
        name, premul = reduce_ops.to_hsdp(_opt(opts, "reduceOp", dist.ReduceOp.SUM),
                                          "reduce_scatter")
        dt = _reducible(out, "reduce_scatter")
        plan = Plan(self._client)
        send = self._span(ins)
        if send is None:
            send, _ = self._dense_region(plan, ins, copy_in=True)
        recv = plan.output(out)
        return self._submit("reduce_scatter", plan, lambda: self._client.raw.reduce_scatter(
            self._group, send, recv, out.numel(), dt, op=name, premul=premul), [out], ins)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        if input.is_cuda and input.numel() == output.numel() * self.size():
            return self._cuda().reduce_scatter_tensor(
                output, input, _opt(opts, "reduceOp", dist.ReduceOp.SUM))
        _check(input, "_reduce_scatter_base")
        _check(output, "_reduce_scatter_base")
        if input.numel() != output.numel() * self.size() or output.dtype != input.dtype:
            raise ValueError(
                f"hsdpd backend reduce_scatter_tensor: input must hold size*output = "
                f"{self.size()}*{output.numel()} elements of {output.dtype}, got "
                f"{input.numel()} of {input.dtype}")
        name, premul = reduce_ops.to_hsdp(_opt(opts, "reduceOp", dist.ReduceOp.SUM),
                                          "reduce_scatter_tensor")
        dt = _reducible(output, "reduce_scatter_tensor")
        plan = Plan(self._client)
        send, recv = plan.input(input), plan.output(output)
        return self._submit("reduce_scatter_tensor", plan,
                            lambda: self._client.raw.reduce_scatter(
                                self._group, send, recv, output.numel(), dt, op=name,
                                premul=premul), [output], [input])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        """outputs[j] receives chunk `rank` of the reduction of inputs[j]."""
        outputs, inputs = list(outputs), list(inputs)
        n = self.size()
        if len(outputs) == 1 and len(inputs) == 1:
            return self._reduce_scatter_base(outputs[0], inputs[0], opts)
        if len(outputs) != len(inputs) or not outputs:
            raise ValueError("hsdpd backend reduce_scatter_tensor_coalesced: need matching, "
                             "non-empty output and input lists")
        dtypes = {t.dtype for t in inputs} | {o.dtype for o in outputs}
        if len(dtypes) != 1:
            raise TypeError("hsdpd backend reduce_scatter_tensor_coalesced: one dtype only, "
                            f"got {sorted(str(d) for d in dtypes)}")
        for o, t in zip(outputs, inputs):
            _check(o, "reduce_scatter_tensor_coalesced")
            _check(t, "reduce_scatter_tensor_coalesced")
            if t.numel() != o.numel() * n:
                raise ValueError("hsdpd backend reduce_scatter_tensor_coalesced: each input "
                                 "must hold size * output elements")
        name, premul = reduce_ops.to_hsdp(_opt(opts, "reduceOp", dist.ReduceOp.SUM),
                                          "reduce_scatter_tensor_coalesced")
        dt = _reducible(outputs[0], "reduce_scatter_tensor_coalesced")
        es = outputs[0].element_size()
        per_rank = sum(o.numel() for o in outputs)  # elements each rank receives
        plan = Plan(self._client)
        slease, send = plan.scratch(per_rank * n * es)
        flat_send = slease.view(outputs[0].dtype, per_rank * n).view(n, per_rank)
        col = 0
        for o, t in zip(outputs, inputs):
            k = o.numel()
            flat_send[:, col:col + k].copy_(t.reshape(n, k))
            col += k
        recv, views = self._dense_region(plan, outputs, copy_in=False)
        plan.after(lambda: [o.copy_(v) for o, v in zip(outputs, views)])
        return self._submit("reduce_scatter_tensor_coalesced", plan,
                            lambda: self._client.raw.reduce_scatter(
                                self._group, send, recv, per_rank, dt, op=name,
                                premul=premul), outputs, inputs)

    # -- broadcast / barrier -------------------------------------------------
    def broadcast(self, tensors, opts=None):
        if isinstance(opts, int):  # the (Tensor, root) overload
            root, root_tensor = opts, 0
        else:
            root, root_tensor = _opt(opts, "rootRank", 0), _opt(opts, "rootTensor", 0)
        tensors = _as_list(tensors)
        if len(tensors) != 1 or root_tensor != 0:
            raise RuntimeError("hsdpd backend broadcast: exactly one tensor per process")
        t = tensors[0]
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return self._cuda().broadcast(t, root)
        _check(t, "broadcast")
        dt, count = _wire(t)
        plan = Plan(self._client)
        ref = plan.inout(t)
        return self._submit("broadcast", plan, lambda: self._client.raw.broadcast(
            self._group, ref, ref, count, dt, root), tensors, tensors)

    def barrier(self, opts=None):
        return self._submit("barrier", Plan(self._client),
                            lambda: self._client.raw.barrier(self._group), [])

    # -- coalescing contexts (torch calls these around batched ops) ----------
    def _start_coalescing(self, *args, **kwargs):
        pass

    def _end_coalescing(self, *args, **kwargs):
        return completed_work()

    # Names newer torch trampolines look up (C++ callers such as functional
    # collectives); same semantics as the historical names above.
    all_gather_single = _allgather_base
    reduce_scatter_single = _reduce_scatter_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def start_coalescing(self, *args, **kwargs):
        pass

    def end_coalescing(self, *args, **kwargs):
        return completed_work()

    # -- unsupported -----------------------------------------------------------
    def _unsupported(self, what, instead):
        raise NotImplementedError(
            f"hsdpd backend: {what} is not supported; {instead}. Supported: {_SUPPORTED_OPS}")

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        """A barrier that names the ranks that did not arrive (Gloo's semantics).

        Group rank 0 collects the members' arrivals for `timeout` and raises
        "Rank R failed to pass monitoredBarrier in T ms" (the first missing
        rank; "Ranks R1, R2, ... failed ..." with wait_all_ranks); the others
        wait for rank 0's verdict and raise "Rank r successfully reached
        monitoredBarrier, but received errors while waiting for send/recv from
        rank 0 ..." if it failed. Arrivals go through the group's store, not
        through hsdpd: a late rank must not leave a pending hsdpd operation
        behind, and the timeout is per call (hsdpd's collective timeout is
        the node's). Ranks are group ranks, as in Gloo.
        """
        from hsdp.torch import monitored
        return monitored.run(self, timeout, wait_all_ranks)

    # -- subgroups ---------------------------------------------------------------
    def split_group(self, ranks, timeout=None, opts=None, group_name=None, group_desc=None,
                    device_types=None):
        """torch.distributed.split_group: the members of `ranks` (ranks of this group;
        the new group's rank r is ranks[r]) get a new process group, the others None.
        Every member of this group calls it (torch's contract); hsdpd's group of the
        members' global ranks needs no store round trip."""
        ranks = [int(r) for r in ranks]
        if self.rank() not in ranks:
            return None
        if len(set(ranks)) != len(ranks) or not all(0 <= r < self.size() for r in ranks):
            raise ValueError(f"hsdpd backend split_group: {ranks} are not distinct ranks of "
                             f"this group of {self.size()}")
        group = self._client.new_group([self._group.ranks[r] for r in ranks])
        me = ranks.index(self.rank())
        if group.rank != me or group.size != len(ranks):
            raise RuntimeError(
                f"hsdpd backend split_group: hsdpd placed this process at rank "
                f"{group.rank}/{group.size} of {group.ranks}, torch at {me}/{len(ranks)}")
        store = self._store
        if store is not None and group_name:
            store = c10d.PrefixStore(f"{group_name}/", store)
        pg = ProcessGroupHsdp(self._client, group, me, len(ranks),
                              self._timeout_s if timeout is None else timeout, store)
        attach_name_holder(pg)
        if group_name:
            pg._set_group_name(group_name)
        if group_desc:
            pg._set_group_desc(group_desc)
        return pg

    def get_group_store(self):
        return self._store

    # -- timeouts and lifetime -------------------------------------------------
    def set_timeout(self, timeout):
        """dist.distributed_c10d.set_timeout(timeout, group): the bound on the waits for
        this group's operations issued from now on (hsdpd's collective timeout, which
        names the ranks that never arrive, is the node's)."""
        self._timeout_s = timeout.total_seconds() if isinstance(
            timeout, datetime.timedelta) else float(timeout)
        self._completer.set_timeout(self._timeout_s)

    def _add_ephemeral_timeout(self, timeout):
        """Ignored (torch: "backends that do not support ephemeral extensions ignore
        this call"); set_timeout changes the group's bound."""

    def shutdown(self):
        """Stops this group's completer once the operations already issued are done."""
        self._completer.close()

    def abort(self):
        """As shutdown: hsdpd fails a group's operations itself when a member is lost
        or its collective timeout expires; nothing is left waiting in this process."""
        self._completer.close()


def _global_ranks(store, group_rank, group_size):
    """Global ranks of the group's members, agreed through the group's store."""
    global_rank = dist.get_rank()
    store.set(_GROUP_RANK_KEY.format(group_rank), str(global_rank))
    return [int(store.get(_GROUP_RANK_KEY.format(i)).decode()) for i in range(group_size)]


def create_process_group(store, group_rank, group_size, timeout):
    """The creator function torch calls for init_process_group / new_group."""
    timeout_s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 1800.0
    if not dist.is_initialized():  # the default group: attach this process
        client = session.attach(store, group_rank, group_size, timeout_s)
        ranks = list(range(group_size))
    else:
        client = session.current_or_attach(timeout_s)
        ranks = _global_ranks(store, group_rank, group_size)
    group = client.new_group(ranks)
    if group.rank != group_rank or group.size != group_size:
        raise RuntimeError(
            f"hsdpd backend: hsdpd placed this process at rank {group.rank}/{group.size} of "
            f"group {ranks}, torch at {group_rank}/{group_size}")
    pg = ProcessGroupHsdp(client, group, group_rank, group_size, timeout, store)
    attach_name_holder(pg)
    fsdp2_auto.arm()  # FSDP2 buffers in hsdpd memory by default (HSDP_COMM_BUFFERS=0: off)
    return pg


def create_process_group_extended(backend_opts, pg_options=None):
    """Extended-API creator (torch passes _DistributedBackendOptions)."""
    return create_process_group(backend_opts.store, backend_opts.group_rank,
                                backend_opts.group_size, backend_opts.timeout)


def register():
    """Registers "hsdpd" with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    from hsdp.torch import _compat
    # "cuda" (cuda_ops.py) only where torch has a GPU: CPU-only machines unchanged.
    devices = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
    kwargs = {"devices": devices} if _compat.register_backend_takes_devices() else {}
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, **kwargs)
