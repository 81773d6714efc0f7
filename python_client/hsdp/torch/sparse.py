"""Sparse COO all-reduce of the hsdpd backend (ProcessGroupHsdp.allreduce hands
sparse tensors here)."""
import torch
import torch.distributed as dist

from hsdp.torch._tensors import _check
from hsdp.torch.completion import completed_work


def allreduce(pg, t, op):
    """Sum of the members' sparse COO tensors, coalesced, into `t` (as Gloo does).

    Three all-gathers (nnz; indices; values, padded to the largest nnz),
    then a local sum. Runs on the calling thread; the Work is complete when
    returned.
    """
    kind = getattr(op, "op", op)
    if kind != dist.ReduceOp.RedOpType.SUM:
        raise RuntimeError(f"hsdpd backend allreduce: sparse tensors support only "
                           f"ReduceOp.SUM, got {kind}")
    if t.device.type != "cpu":
        _check(t, "allreduce")
    local = t.coalesce()
    n = pg.size()
    indices, values = local.indices(), local.values()
    nnz = torch.tensor([indices.shape[1]], dtype=torch.int64)
    all_nnz = torch.empty(n, dtype=torch.int64)
    pg._allgather_base(all_nnz, nnz).wait()
    width = int(all_nnz.max())
    pad_i = torch.zeros((indices.shape[0], width), dtype=torch.int64)
    pad_i[:, :indices.shape[1]] = indices
    pad_v = torch.zeros((width,) + tuple(values.shape[1:]), dtype=values.dtype)
    pad_v[:values.shape[0]] = values
    all_i = torch.empty((n,) + tuple(pad_i.shape), dtype=torch.int64)
    all_v = torch.empty((n,) + tuple(pad_v.shape), dtype=values.dtype)
    pg._allgather_base(all_i, pad_i).wait()
    pg._allgather_base(all_v, pad_v).wait()
    counts = [int(c) for c in all_nnz]
    total = torch.sparse_coo_tensor(
        torch.cat([all_i[r, :, :c] for r, c in enumerate(counts)], dim=1),
        torch.cat([all_v[r, :c] for r, c in enumerate(counts)], dim=0),
        t.shape, dtype=t.dtype).coalesce()
    t.copy_(total)
    return completed_work([t])
