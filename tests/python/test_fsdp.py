"""FSDP2 fully_shard (incl. HSDP on a 2-D DeviceMesh) through "hsdpd", checked
against Gloo (the FSDP2 parity tests against a single-process reference are
tests/python/test_fsdp2_*.py).

FSDP1 (FullyShardedDataParallel) is not tested: on CPU, torch 2.15.0's FSDP1
fails inside torch over Gloo and over hsdpd alike ("Trying to resize storage
that is not resizable" when it frees the unsharded flat parameter).
"""
import numpy as np
import pytest

from hsdp.torch import _compat



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


@pytest.mark.parametrize("mesh_shape,hooks", [((2,), False), ((2, 2), False), ((2,), True)],
                         ids=["fsdp2", "hsdp-2d-mesh", "fsdp2-hsdp-buffers"])
def test_fsdp2_matches_gloo(run, mesh_shape, hooks):
    if hooks:  # torch 2.15 has them all: FSDP2's buffers come from hsdpd memory
        assert all(_compat.fsdp2_hook_status().values()), _compat.fsdp2_hook_status()
    world = int(np.prod(mesh_shape))
    ref = run(fsdp2_worker, world, mesh_shape, False, backend="gloo")
    ours = run(fsdp2_worker, world, mesh_shape, hooks)
    for r in range(world):
        for a, b in zip(ours[r], ref[r]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
