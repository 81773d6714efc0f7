"""The C++ side of a ProcessGroupHsdp (see _NameHolder)."""
import torch
import torch._C._distributed_c10d as c10d
from torch._C._distributed_c10d import ProcessGroup

BACKEND_NAME = "hsdpd"  # the torch.distributed backend name (hsdp.torch.BACKEND_NAME)


class _NameHolder(c10d.Backend):
    """The C++ side of a ProcessGroupHsdp: torch keeps a ProcessGroup's name, its
    device types and its default backend in the backends registered on it, and
    a Python ProcessGroup has none, so without one `_set_group_name` drops the
    name (C++ getGroupName() raises "ProcessGroup name not set", which the
    flight recorder calls), `_device_types` is empty (dist.monitored_barrier
    refuses the group) and `_get_backend` raises (batch_isend_irecv). It
    executes nothing: torch dispatches every collective of the group to the
    Python methods of ProcessGroupHsdp. It answers the feature queries:
    no NCCL-style coalescing; splitting (split_group) yes."""

    def getBackendName(self):  # noqa: N802 - torch's name
        return BACKEND_NAME

    # Plain attributes: reading c10d's properties on a Python Backend subclass
    # recurses through its trampoline (RecursionError in batch_isend_irecv).
    supports_coalescing = False
    supports_splitting = True  # ProcessGroupHsdp.split_group
    supports_shrinking = False
    supports_reconfigure = False
    supports_window = False
    supports_abort_hooks = False
    _supports_time_estimate = False

    # torch's hook for communication buffers from the backend (FSDP2's
    # set_allocate_memory_from_process_group_for_comm, ProcessGroupAllocMixin):
    # CPU buffers in hsdpd memory, so the group's collectives on them are
    # zero-copy; off with HSDP_COMM_BUFFERS=0 (torch then allocates its own).
    allocations = 0

    def supports_tensor_alloc(self, device):
        from hsdp.torch import fsdp2_auto
        return torch.device(device).type == "cpu" and fsdp2_auto.comm_buffers_enabled()

    def allocate_tensor(self, size, *, dtype, device):
        from hsdp.torch import fsdp2_auto
        self.allocations += 1
        return fsdp2_auto.allocate_or_fallback((int(size),), dtype, device)[0]


def attach_name_holder(pg):
    """Registers a _NameHolder on `pg` for cpu (and cuda where torch has a
    GPU), as its default backend. Some torch builds (2.11, seen on the GPU
    machine) bind c10d.Backend without a Python constructor: there the group
    runs without a holder (no group name for the flight recorder, no
    monitored_barrier, no batch_isend_irecv); the collectives are unchanged."""
    try:
        holder = _NameHolder(pg.rank(), pg.size())
    except TypeError:  # "_NameHolder: No constructor defined!"
        pg._hsdp_name_holder = None
        return
    custom = ProcessGroup.BackendType.CUSTOM
    pg._register_backend(torch.device("cpu"), custom, holder)
    if torch.cuda.is_available():
        pg._register_backend(torch.device("cuda"), custom, holder)
    pg._set_default_backend(custom)
    pg._hsdp_name_holder = holder
