"""hsdp.flat_param against a single-process reference, and its option checks."""
import os

import numpy as np
import pytest
import torch

import hsdp
from hsdp.flat_param import FlatParameters


def _model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(),
                               torch.nn.Linear(24, 3))


def _batches(steps, micro, world):
    gen = torch.Generator().manual_seed(7)
    return [[(torch.randn(4 * world, 12, generator=gen), torch.randn(4 * world, 3, generator=gen))
             for _ in range(micro)] for _ in range(steps)]


def reference(steps, micro, world, reduce_op):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in _batches(steps, micro, world):
        opt.zero_grad()
        for x, y in step:
            loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum") / 4
            # Each rank's loss is over its 4 rows; avg divides the sum over ranks by world.
            (loss / (world if reduce_op == "avg" else 1)).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def flat_train(rank, world, steps, micro, kwargs):
    import hsdp.torch
    model = _model()
    fp = FlatParameters(model, hsdp.torch.client(), **kwargs)
    opt = torch.optim.SGD(fp.parameters(), lr=0.1)
    for step in _batches(steps, micro, world):
        fp.zero_grad()
        fp.unshard()
        for m, (x, y) in enumerate(step):
            fp.set_requires_grad_sync(m == micro - 1)
            xs, ys = x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4]
            torch.nn.functional.mse_loss(model(xs), ys, reduction="sum").div(4).backward()
            fp.reduce_grads()
        fp.sync()
        opt.step()
    fp.unshard()
    return {"params": [p.detach().numpy().copy() for p in model.parameters()],
            "buckets": fp.num_buckets, "pre": fp.pre_divide, "post": fp.post_divide}


@pytest.mark.parametrize("kwargs", [
    dict(),                                            # FSDP: shard over both ranks, avg
    dict(shard_size=1, bucket_size=0),                 # HSDP: composite RS + AR, no fusion
    dict(reduce_op="sum", bucket_size=1),              # 1 KB buckets
    dict(reduce_dtype=torch.bfloat16),                 # low-precision wire
], ids=["fsdp-avg", "hsdp-nofusion", "sum-buckets", "bf16-wire"])
def test_flat_parameters_match_single_process(run, kwargs):
    world, steps, micro = 2, 4, 2
    res = run(flat_train, world, steps, micro, kwargs)
    want = reference(steps, micro, world, kwargs.get("reduce_op", "avg"))
    tol = dict(rtol=2e-2, atol=2e-2) if "reduce_dtype" in kwargs else dict(rtol=1e-5,
                                                                            atol=1e-6)
    for r in range(world):
        for got, ref in zip(res[r]["params"], want):
            np.testing.assert_allclose(got, ref, **tol)
    if kwargs.get("bucket_size") == 0:
        assert res[0]["buckets"] == 4
    if kwargs.get("reduce_op", "avg") == "avg":
        assert (res[0]["pre"], res[0]["post"]) == (1.0, 2.0)  # world 2: pre 1, post 2


def flat_train_reduce_scatter_only(rank, world, steps, micro):
    """HSDP accumulation: reduce-scatter every micro-batch, all-reduce once per step."""
    import hsdp.torch
    model = _model()
    fp = FlatParameters(model, hsdp.torch.client(), shard_size=1, bucket_size=0)
    opt = torch.optim.SGD(fp.parameters(), lr=0.1)
    for step in _batches(steps, micro, world):
        fp.zero_grad()
        fp.unshard()
        for m, (x, y) in enumerate(step):
            fp.set_requires_all_reduce(m == micro - 1)
            xs, ys = x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4]
            torch.nn.functional.mse_loss(model(xs), ys, reduction="sum").div(4).backward()
            fp.reduce_grads()
            fp.sync()
        opt.step()
    fp.unshard()
    return [p.detach().numpy().copy() for p in model.parameters()]


def test_reduce_scatter_only_accumulation_matches_single_process(run):
    world, steps, micro = 2, 3, 3
    res = run(flat_train_reduce_scatter_only, world, steps, micro)
    want = reference(steps, micro, world, "avg")
    for r in range(world):
        for got, ref in zip(res[r], want):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


@pytest.fixture
def solo(hsdpd):
    c = hsdp.Client(socket_path=hsdpd.socket, job_id=f"flat-{os.getpid()}")
    yield c
    c.close()


@pytest.mark.parametrize("kwargs,match", [
    (dict(shard_size=3), "shard_size: 3 is invalid; allowed: -1"),
    (dict(shard_size="2"), "shard_size"),
    (dict(reduce_op="mean"), "reduce_op: 'mean' is invalid; allowed: 'sum', 'avg'"),
    (dict(reduce_dtype=torch.int8), "reduce_dtype"),
    (dict(pre_divide=-1.0), "pre_divide: -1.0 is invalid"),
    (dict(post_divide=float("nan")), "post_divide"),
    (dict(bucket_size=-5), "bucket_size: -5 is invalid"),
])
def test_invalid_options_name_the_value(solo, kwargs, match):
    with pytest.raises(ValueError, match=match):
        FlatParameters(_model(), solo, **kwargs)


def test_mixed_and_meta_parameters_are_rejected(solo):
    m = _model()
    m[2].double()
    with pytest.raises(ValueError, match="mix dtypes"):
        FlatParameters(m, solo)
    meta = torch.nn.Linear(2, 2, device="meta")
    with pytest.raises(ValueError, match="meta device"):
        FlatParameters(meta, solo)
    with pytest.raises(ValueError, match="requires_grad_sync"):
        FlatParameters(_model(), solo).set_requires_grad_sync("no")


def test_layout_is_512_byte_aligned(solo):
    m = _model()
    fp = FlatParameters(m, solo, bucket_size=-1)
    for p in m.parameters():
        assert p.data_ptr() % 512 == 0
        assert solo.locate(p) is not None and solo.locate(p.grad) is not None
    assert fp.parameters()[0].numel() * 4 % 512 == 0


def test_reduce_scatter_only_needs_sync_before_the_next_reduction(solo):
    m = _model()
    fp = FlatParameters(m, solo)
    with pytest.raises(ValueError, match="requires_all_reduce: 1 is invalid"):
        fp.set_requires_all_reduce(1)
    fp.set_requires_all_reduce(False)
    m(torch.ones(2, 12)).sum().backward()
    fp.reduce_grads()
    with pytest.raises(RuntimeError, match="call sync"):
        fp.reduce_grads()  # would count the same gradients twice
    fp.sync()
    assert fp.parameters()[0].grad is None  # accumulated, not final yet
    assert all(float(p.grad.abs().sum()) == 0 for p in m.parameters())  # cleared
