"""hsdp.torch.fsdp2_overlap on its own: real autograd, fake Works and param groups.

- a reduce-scatter deferred in a backward hook is not waited there but before
  backward returns; a failure raises from backward, after every other deferred
  one was waited too;
- nothing is deferred outside a backward pass, for an op FSDP2 divides after,
  or for a param group whose output FSDP2 reads in the hook (each rule);
- after a backward that raised before its final callbacks ran, the next
  optimizer step or module forward waits what is left; a forward run by the
  backward itself (activation recomputation) does not.
(FSDP2 end to end, against a run that waits every reduce-scatter in its hook:
test_comm_buffers_default.py.)
"""
import types

import pytest
import torch
from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo

from hsdp.torch import fsdp2_overlap as ov


class FakeWork:
    def __init__(self, error=None):
        self.waited = 0
        self.error = error

    def wait(self):
        self.waited += 1
        if self.error is not None:
            raise self.error
        return True


def _in_backward(fn, then_raise=None):
    """Runs fn() inside a backward pass; returns its value (raises then_raise after it)."""
    out = {}

    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            out["value"] = fn()
            if then_raise is not None:
                raise then_raise
            return g * 2

    x = torch.ones(3, requires_grad=True)
    F.apply(x).sum().backward()
    return out["value"]


def _param(grad=None, hooks=None, offload=False, grad_dtype=None):
    sp = types.SimpleNamespace(grad=grad, _post_accumulate_grad_hooks=hooks)
    return types.SimpleNamespace(sharded_param=sp, offload_to_cpu=offload,
                                 sharded_grad_dtype=grad_dtype)


def _group(params=None, mesh_info=None, hook=None, partial=None):
    return types.SimpleNamespace(mesh_info=mesh_info or object(), _all_reduce_hook=hook,
                                 _partial_reduce_output=partial,
                                 fsdp_params=params if params is not None else [_param()])


OUT = torch.zeros(4)


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv(ov.ENV, raising=False)
    yield
    try:
        ov.wait_all()
    finally:
        assert ov.pending() == 0


def test_deferred_work_is_waited_when_backward_ends():
    work = FakeWork()

    def hook():
        assert ov.defer_allowed(_group(), "premul_sum", OUT)
        got = ov.defer(lambda: work)
        return got, work.waited, ov.pending()

    got, waited_in_hook, pending_in_hook = _in_backward(hook)
    assert got is True
    assert waited_in_hook == 0 and pending_in_hook == 1
    assert work.waited == 1 and ov.pending() == 0


def test_at_most_two_are_outstanding():
    works = [FakeWork() for _ in range(5)]

    def hook():
        seen = []
        for w in works:
            ov.defer(lambda w=w: w)
            seen.append((ov.pending(), [x.waited for x in works]))
        return seen

    seen = _in_backward(hook)
    assert [p for p, _ in seen] == [1, 2, 2, 2, 2]
    # Issuing the third waited for the first, the fourth for the second, ...
    assert seen[2][1] == [1, 0, 0, 0, 0] and seen[4][1] == [1, 1, 1, 0, 0]
    assert [w.waited for w in works] == [1] * 5 and ov.pending() == 0


def test_a_failure_raises_from_backward_after_the_others_are_waited():
    bad, good = FakeWork(RuntimeError("reduce_scatter failed: rank 1 left")), FakeWork()
    with pytest.raises(RuntimeError, match="rank 1 left"):
        _in_backward(lambda: (ov.defer(lambda: bad), ov.defer(lambda: good)))
    assert bad.waited == 1 and good.waited == 1 and ov.pending() == 0


def test_nothing_is_deferred_outside_backward():
    submitted = []
    assert not ov.defer_allowed(_group(), "avg", OUT)
    assert ov.defer(lambda: submitted.append(1)) is False
    assert submitted == [] and ov.pending() == 0


@pytest.mark.parametrize("why, group, op", [
    ("FSDP2 divides after a SUM", _group(), "sum"),
    ("HSDP: the output is all-reduced", _group(mesh_info=object.__new__(DDPMeshInfo)), "avg"),
    ("an all-reduce hook reads it", _group(hook=lambda t: None), "avg"),
    ("a partial reduce output is added", _group(partial=torch.zeros(2)), "avg"),
    ("accumulation adds it into a gradient", _group([_param(), _param(grad=torch.ones(2))]),
     "avg"),
    ("a post-accumulate-grad hook reads .grad", _group([_param(hooks={0: print})]), "avg"),
    ("CPU offload copies it", _group([_param(offload=True)]), "avg"),
    ("a cast reads it", _group([_param(grad_dtype=torch.bfloat16)]), "avg"),
    ("not an FSDP2 param group (another torch)", types.SimpleNamespace(), "avg"),
    ("no param group known", None, "avg"),
])
def test_outputs_read_in_the_hook_are_waited_there(why, group, op):
    assert _in_backward(lambda: ov.defer_allowed(group, op, OUT)) is False, why
    assert _in_backward(lambda: ov.defer_allowed(_group(), op if op != "sum" else "avg",
                                                 OUT)) is True


def test_the_opt_out(monkeypatch):
    monkeypatch.setenv(ov.ENV, "0")
    assert _in_backward(lambda: ov.defer_allowed(_group(), "avg", OUT)) is False


def test_safety_nets_wait_after_a_backward_that_raised():
    lin = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    for step in ("optimizer", "forward"):
        work = FakeWork()
        with pytest.raises(ValueError, match="user hook failed"):
            _in_backward(lambda: ov.defer(lambda: work),
                         then_raise=ValueError("user hook failed"))
        assert work.waited == 0 and ov.pending() == 1  # no final callback ran
        before = ov.stats()["waited_by_safety_net"]
        if step == "optimizer":
            lin(torch.ones(1, 2)).sum().backward()  # this forward waits already ...
            assert work.waited == 1
            work = FakeWork()
            _in_backward(lambda: None)  # nothing deferred: nothing to wait
            with pytest.raises(ValueError):
                _in_backward(lambda: ov.defer(lambda: work), then_raise=ValueError("x"))
            opt.step()  # ... and so does an optimizer step
        else:
            lin(torch.ones(1, 2))
        assert work.waited == 1 and ov.pending() == 0
        assert ov.stats()["waited_by_safety_net"] > before


def test_a_forward_inside_backward_does_not_wait():
    lin = torch.nn.Linear(2, 2)
    work = FakeWork()

    def hook():
        ov.defer(lambda: work)
        with torch.enable_grad():
            lin(torch.ones(1, 2))  # what activation recomputation does
        return work.waited

    assert _in_backward(hook) == 0
    assert work.waited == 1
