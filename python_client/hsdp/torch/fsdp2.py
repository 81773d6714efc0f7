"""FSDP2 (fully_shard) adapters that put FSDP2's communication buffers in
hsdpd shared memory, so its all-gathers and reduce-scatters run zero-copy.

torch >= 2.7-ish FSDPModule offers set_custom_all_gather(comm),
set_custom_reduce_scatter(comm) (comm.allocate(size, dtype=, device=) plus
comm(...)), and set_all_reduce_hook(hook). use_hsdp_comm_buffers() installs
the adapters on every FSDP2 module of a tree; on a torch without these hooks
it raises NotImplementedError naming what is missing (see capabilities()).
"""
import threading

import torch
import torch.distributed as dist

from hsdp.memory import align_up, torch_view
from hsdp.torch import _compat, session

try:  # the protocol classes, where this torch defines them
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather as _AllGatherBase
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter as _RSBase
except Exception:  # noqa: BLE001 - older torch or fsdp not importable
    _AllGatherBase = _RSBase = object


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
    def __init__(self, client=None):
        self._client = client
        self.allocations = 0
        self._lock = threading.Lock()

    def allocate(self, size, *, dtype, device):
        with self._lock:
            self.allocations += 1
        return allocate_shared(size, dtype, device, self._client)


class HsdpAllGather(_SharedAllocator, _AllGatherBase):
    """FSDP2 AllGather comm: buffers in hsdpd memory, all_gather_into_tensor via the group."""

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        return dist.all_gather_into_tensor(output_tensor, input_tensor, group=group,
                                           async_op=async_op)


class HsdpReduceScatter(_SharedAllocator, _RSBase):
    """FSDP2 ReduceScatter comm: buffers in hsdpd memory, reduce_scatter_tensor via the group."""

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                          async_op=async_op)


def all_reduce_hook(group, op=None):
    """A set_all_reduce_hook callable all-reducing FSDP2's reduce output over `group`."""
    op = dist.ReduceOp.SUM if op is None else op

    def hook(reduce_output):
        dist.all_reduce(reduce_output, op=op, group=group)
    return hook


def use_hsdp_comm_buffers(module):
    """Installs HsdpAllGather / HsdpReduceScatter on every FSDP2 module under `module`.

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
    cls = _compat.fsdp2_module_class()
    count = 0
    for m in module.modules():
        if isinstance(m, cls):
            m.set_custom_all_gather(HsdpAllGather())
            m.set_custom_reduce_scatter(HsdpReduceScatter())
            count += 1
    return count
