"""DDP through "hsdpd" trains exactly like DDP through Gloo."""
import pytest


def _model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def ddp_train(rank, world, steps, accumulate):
    """Trains for `steps` optimizer steps; with `accumulate`, 2 micro-batches per step,
    the first under no_sync(). Returns the final parameters as numpy arrays."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = _model()
    if rank == 1:  # DDP must broadcast rank 0's parameters at construction
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
    ddp = DDP(model, bucket_cap_mb=0.002)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(steps):
        opt.zero_grad()
        micro = 2 if accumulate else 1
        for m in range(micro):
            x = torch.randn(8, 16, generator=gen)
            y = torch.randn(8, 4, generator=gen)
            if m < micro - 1:
                with ddp.no_sync():
                    torch.nn.functional.mse_loss(ddp(x), y).backward()
            else:
                torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


@pytest.mark.parametrize("accumulate", [False, True], ids=["plain", "no_sync"])
def test_ddp_matches_gloo(run, accumulate):
    import numpy as np
    ours = run(ddp_train, 2, 6, accumulate)
    ref = run(ddp_train, 2, 6, accumulate, backend="gloo")
    for r in range(2):
        for a, b in zip(ours[r], ref[r]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(ours[0], ours[1]):
        np.testing.assert_array_equal(a, b)  # replicas stay identical
