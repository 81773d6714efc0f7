"""reduce, gather, gather_single and scatter for the hsdpd torch backend,
emulated on the symmetric collectives (all-reduce, all-gather, broadcast): more
traffic than a rooted algorithm, the same result, and one hsdpd operation per
call so every member issues the same sequence. Mixed into ProcessGroupHsdp.
"""
import torch.distributed as dist

from hsdp.plan import Plan, region_like
from hsdp.torch import reduce_ops
from hsdp.torch._tensors import _as_list, _check, _nbytes, _opt, _reducible, _wire


class RootedMixin:
    """ProcessGroupHsdp's rooted collectives (uses its _client, _group and _submit)."""

    def reduce(self, tensors, opts=None):
        """Reduce to `rootRank` (an all-reduce of a copy; only the root's tensor changes)."""
        tensors = _as_list(tensors)
        if len(tensors) != 1:
            raise RuntimeError("hsdpd backend reduce: exactly one tensor per process")
        t = tensors[0]
        _check(t, "reduce")
        root = _opt(opts, "rootRank", 0)
        name, premul = reduce_ops.to_hsdp(_opt(opts, "reduceOp", dist.ReduceOp.SUM), "reduce")
        dt = _reducible(t, "reduce")
        plan = Plan(self._client)
        lease, ref, _ = plan.packed([t], copy_in=True)
        if self.rank() == root:
            plan.after(lambda: t.copy_(region_like(lease, t)))
        return self._submit("reduce", plan, lambda: self._client.raw.all_reduce(
            self._group, ref, ref, t.numel(), dt, op=name, premul=premul), tensors, tensors)

    def gather(self, output_tensors, input_tensors, opts=None):
        """Gather to `rootRank` (an all-gather; only the root copies out)."""
        inputs = _as_list(input_tensors)
        if len(inputs) != 1:
            raise RuntimeError("hsdpd backend gather: exactly one input tensor per process")
        x = inputs[0]
        _check(x, "gather")
        root = _opt(opts, "rootRank", 0)
        n = self.size()
        outs = list(output_tensors[0]) if output_tensors else []
        if self.rank() == root and len(outs) != n:
            raise ValueError(f"hsdpd backend gather: the root needs {n} output tensors")
        dt, count = _wire(x)
        plan = Plan(self._client)
        send = plan.input(x)
        rlease, recv = plan.scratch(_nbytes(x) * n)
        if self.rank() == root:
            plan.after(lambda: [o.copy_(region_like(rlease, x, r * _nbytes(x)))
                                for r, o in enumerate(outs)])
        return self._submit("gather", plan, lambda: self._client.raw.all_gather(
            self._group, send, recv, count, dt), outs, [x])

    def gather_single(self, output, input, opts=None):  # noqa: A002 - torch's names
        """dist.gather_single: `rootRank` receives every member's `input`, in rank order,
        in one tensor of size * input.numel() elements (others pass an empty one)."""
        _check(input, "gather_single")
        _check(output, "gather_single")
        root = _opt(opts, "rootRank", 0)
        n = self.size()
        if self.rank() == root and (output.numel() != input.numel() * n or
                                    output.dtype != input.dtype):
            raise ValueError(
                f"hsdpd backend gather_single: the root's output must hold size*input = "
                f"{n}*{input.numel()} elements of {input.dtype}, got {output.numel()} of "
                f"{output.dtype}")
        dt, count = _wire(input)
        plan = Plan(self._client)
        send = plan.input(input)
        if self.rank() == root:
            recv = plan.output(output)
        else:
            _, recv = plan.scratch(_nbytes(input) * n)
        return self._submit("gather", plan, lambda: self._client.raw.all_gather(
            self._group, send, recv, count, dt), [output], [input])

    def scatter(self, output_tensors, input_tensors, opts=None):
        """Scatter from `rootRank` (a broadcast of all chunks; each rank keeps its own)."""
        outs = _as_list(output_tensors)
        if len(outs) != 1:
            raise RuntimeError("hsdpd backend scatter: exactly one output tensor per process")
        out = outs[0]
        _check(out, "scatter")
        root = _opt(opts, "rootRank", 0)
        n = self.size()
        plan = Plan(self._client)
        lease, ref = plan.scratch(_nbytes(out) * n)
        if self.rank() == root:
            ins = list(input_tensors[0])
            if len(ins) != n:
                raise ValueError(f"hsdpd backend scatter: the root needs {n} input tensors")
            for r, t in enumerate(ins):
                region_like(lease, out, r * _nbytes(out)).copy_(t)
        me = self.rank()
        plan.after(lambda: out.copy_(region_like(lease, out, me * _nbytes(out))))
        return self._submit("scatter", plan, lambda: self._client.raw.broadcast(
            self._group, ref, ref, _nbytes(out) * n, "uint8", root), outs, outs)
