"""FSDP (FULL_SHARD, SHARD_GRAD_OP) and FSDP2 fully_shard (incl. HSDP on a 2-D
DeviceMesh) through "hsdpd", checked against Gloo. They skip, with the reason,
where this torch cannot run them (torch 1.13 on Python 3.11 cannot even
import torch.distributed.fsdp; FSDP2 needs torch >= 2.4 and CPU support).
"""
import numpy as np
import pytest

from hsdp.torch import _compat

FSDP_OK, FSDP_WHY = _compat.fsdp1_status()
FSDP2_OK, FSDP2_WHY = _compat.fsdp2_status()


def _model():
    import torch
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8),
                               torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _train(model, params, rank, steps=4):
    import torch
    opt = torch.optim.SGD(params, lr=0.1)
    gen = torch.Generator().manual_seed(50 + rank)
    for _ in range(steps):
        opt.zero_grad()
        x, y = torch.randn(6, 8, generator=gen), torch.randn(6, 2, generator=gen)
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


def _gloo_reference_or_skip(run, fn, world, *args):
    """Runs the Gloo reference first: if torch cannot run it on CPU at all, skip."""
    try:
        return run(fn, world, *args, backend="gloo")
    except AssertionError as e:
        pytest.skip(f"this torch cannot run the Gloo/CPU reference: {str(e)[-400:]}")


def fsdp_worker(rank, world, strategy):
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    model = FSDP(_model(), sharding_strategy=getattr(ShardingStrategy, strategy),
                 device_id=torch.device("cpu"), use_orig_params=True)
    _train(model, model.parameters(), rank)
    with FSDP.summon_full_params(model):
        return [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.skipif(not FSDP_OK, reason=f"torch.distributed.fsdp unusable here: {FSDP_WHY}")
@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_fsdp_matches_gloo(run, strategy):
    ref = _gloo_reference_or_skip(run, fsdp_worker, 2, strategy)
    ours = run(fsdp_worker, 2, strategy)
    for a, b in zip(ours[0], ref[0]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def fsdp2_worker(rank, world, mesh_shape, hooks):
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    fully_shard = _compat.fully_shard()
    names = ("replicate", "shard") if len(mesh_shape) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    model = _model()
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if hooks:
        import hsdp.torch
        hsdp.torch.use_hsdp_comm_buffers(model)
    _train(model, model.parameters(), rank)
    # Local shards (same layout for both backends): no DTensor redistribution needed.
    return [p.to_local().detach().numpy().copy() for p in model.parameters()]


@pytest.mark.skipif(not FSDP2_OK, reason=f"FSDP2 fully_shard unavailable: {FSDP2_WHY}")
@pytest.mark.parametrize("mesh_shape,hooks", [((2,), False), ((2, 2), False), ((2,), True)],
                         ids=["fsdp2", "hsdp-2d-mesh", "fsdp2-hsdp-buffers"])
def test_fsdp2_matches_gloo(run, mesh_shape, hooks):
    if hooks and not all(_compat.fsdp2_hook_status().values()):
        pytest.skip(f"FSDP2 comm hooks missing: {_compat.fsdp2_hook_status()}")
    world = int(np.prod(mesh_shape))
    ref = _gloo_reference_or_skip(run, fsdp2_worker, world, mesh_shape, False)
    ours = run(fsdp2_worker, world, mesh_shape, hooks)
    for r in range(world):
        for a, b in zip(ours[r], ref[r]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
