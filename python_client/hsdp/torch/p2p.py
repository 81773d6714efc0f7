"""Point-to-point and all-to-all for the hsdpd torch backend.

send / recv / recv_anysource and all_to_all / all_to_all_single, each one
hsdpd operation matched in the daemon (per group, source, destination and tag
in posting order for point-to-point). Mixed into ProcessGroupHsdp.
"""
import torch
import torch._C._distributed_c10d as c10d

from hsdp.plan import Plan, region_like, split_counts
from hsdp.torch._tensors import _as_list, _check, _wire


class _RecvAnySourceWork(c10d.Work):
    """A receive from any rank: the Work also says which rank sent (_source_rank)."""

    def __init__(self, inner, raw):
        super().__init__()
        self._inner = inner
        self._raw = raw  # the hsdpd operation; its peer is the source

    def wait(self, timeout=None):
        return self._inner.wait() if timeout is None else self._inner.wait(timeout)

    def is_completed(self):
        return self._inner.is_completed()

    def is_success(self):
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def get_future(self):
        return self._inner.get_future()

    def result(self):
        return self._inner.result()

    def _source_rank(self):  # noqa: N802 - torch's name
        if not self._inner.is_completed():
            raise RuntimeError("_source_rank(): the receive has not completed; wait() first")
        return self._raw.peer


def _wire_count(t):
    return _wire(t)[1]


def _rows(what, sizes, t, n):
    """Row counts per rank for all_to_all_single (equal when `sizes` is empty)."""
    return split_counts(f"hsdpd backend all_to_all_single {what}", sizes,
                        t.size(0) if t.dim() else 1, n, unit="rows")


def _splits_ref(plan, send_counts, recv_counts):
    """A staged table of per-rank counts (sent to each, then received from each)."""
    n = len(send_counts)
    lease, ref = plan.scratch(16 * n)
    table = region_like(lease, torch.empty(2 * n, dtype=torch.int64))
    table.copy_(torch.tensor(list(send_counts) + list(recv_counts), dtype=torch.int64))
    return ref


class PointToPointMixin:
    """ProcessGroupHsdp's point-to-point and all-to-all methods (uses its
    _client, _group and _submit)."""

    def _one(self, tensors, what):
        tensors = _as_list(tensors)
        if len(tensors) != 1:
            raise RuntimeError(f"hsdpd backend {what}: exactly one tensor per call")
        _check(tensors[0], what)
        return tensors[0]

    def send(self, tensors, dstRank, tag=0):  # noqa: N803 - torch's names
        t = self._one(tensors, "send")
        dt, count = _wire(t)
        plan = Plan(self._client)
        ref = plan.input(t)
        return self._submit("send", plan, lambda: self._client.raw.send(
            self._group, ref, count, dt, int(dstRank), int(tag)), [t], [t])

    def recv(self, tensors, srcRank, tag=0):  # noqa: N803
        t = self._one(tensors, "recv")
        dt, count = _wire(t)
        plan = Plan(self._client)
        ref = plan.output(t)
        return self._submit("recv", plan, lambda: self._client.raw.recv(
            self._group, ref, count, dt, int(srcRank), int(tag)), [t], [t])

    def recv_anysource(self, tensors, tag=0):
        t = self._one(tensors, "recv_anysource")
        dt, count = _wire(t)
        plan = Plan(self._client)
        ref = plan.output(t)
        raw = []

        def submit():
            raw.append(self._client.raw.recv(self._group, ref, count, dt, -1, int(tag)))
            return raw[0]
        inner = self._submit("recv_anysource", plan, submit, [t], [t])
        return _RecvAnySourceWork(inner, raw[0])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                      opts=None):
        """all_to_all_single: rows (dim 0) of `input` go to the ranks, split as given."""
        _check(output, "all_to_all_single")
        _check(input, "all_to_all_single")
        n = self.size()
        dt, _ = _wire(input)
        per_row_in = _wire_count(input) // max(input.size(0), 1) if input.dim() else 1
        per_row_out = _wire_count(output) // max(output.size(0), 1) if output.dim() else 1
        plan = Plan(self._client)
        send, recv = plan.input(input), plan.output(output)
        if not output_split_sizes and not input_split_sizes:
            if _wire_count(input) % n or _wire_count(output) != _wire_count(input):
                raise ValueError(f"hsdpd backend all_to_all_single: {input.numel()} and "
                                 f"{output.numel()} elements do not split into {n} equal blocks")
            count = _wire_count(input) // n
            return self._submit("alltoall_base", plan, lambda: self._client.raw.all_to_all(
                self._group, send, recv, count, dt), [output], [input])
        ins = _rows("input_split_sizes", input_split_sizes, input, n)
        outs = _rows("output_split_sizes", output_split_sizes, output, n)
        splits = _splits_ref(plan, [r * per_row_in for r in ins], [r * per_row_out for r in outs])
        return self._submit("alltoall_base", plan, lambda: self._client.raw.all_to_all(
            self._group, send, recv, 0, dt, splits=splits), [output], [input])

    all_to_all_single = alltoall_base

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """all_to_all with lists: input_tensors[j] goes to rank j, output_tensors[i] from i."""
        outs, ins = list(output_tensors), list(input_tensors)
        n = self.size()
        if len(outs) != n or len(ins) != n:
            raise ValueError(f"hsdpd backend all_to_all: needs {n} input and {n} output tensors")
        for t in outs + ins:
            _check(t, "all_to_all")
        dt, _ = _wire(ins[0])
        if any(_wire(t)[0] != dt for t in outs + ins):
            raise TypeError("hsdpd backend all_to_all: every tensor must have the same dtype")
        plan = Plan(self._client)
        _, send, _ = plan.packed(ins, copy_in=True, align=1)
        _, recv, _ = plan.packed(outs, copy_in=False, copy_out=True, align=1)
        splits = _splits_ref(plan, [_wire_count(t) for t in ins], [_wire_count(t) for t in outs])
        return self._submit("alltoall", plan, lambda: self._client.raw.all_to_all(
            self._group, send, recv, 0, dt, splits=splits), outs, ins)
