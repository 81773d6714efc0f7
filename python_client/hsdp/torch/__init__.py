"""hsdp.torch: the torch.distributed backend "hsdpd".

    import hsdp.torch                       # registers the backend
    dist.init_process_group("hsdpd", init_method="env://")
    ddp = DistributedDataParallel(model)    # or FSDP / fully_shard

Needs a running hsdpd ($HSDPD_SOCKET or the default socket). Supports
torch >= 2.7 (tested: 2.15.0, python_client/requirements-torch.txt);
capabilities() says what this torch offers.
"""
import torch

from hsdp.torch import _compat

_compat.require_supported_torch()

from hsdp.torch import backend, session  # noqa: E402
from hsdp.torch.backend import BACKEND_NAME, ProcessGroupHsdp  # noqa: F401
from hsdp.torch.monitored import monitored_barrier  # noqa: F401

backend.register()

# The FSDP2 helpers load torch.distributed.fsdp (half a second) when first
# used, not with the backend: every trainer's start, and a restarted one's,
# stays that much shorter.
_FSDP2_NAMES = ("HsdpAllGather", "HsdpReduceScatter", "all_reduce_hook", "allocate_shared",
                "use_hsdp_comm_buffers")


def __getattr__(name):
    if name in _FSDP2_NAMES:
        from hsdp.torch import fsdp2
        return getattr(fsdp2, name)
    raise AttributeError(f"module 'hsdp.torch' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_FSDP2_NAMES))


def client():
    """The hsdp.Client of this process's "hsdpd" process groups."""
    return session.current()


def empty(shape, dtype=torch.float32):
    """An uninitialised (zeroed) tensor in hsdpd memory: collectives on it are zero-copy."""
    return session.current().tensor(shape, dtype)


def capabilities():
    """What the hsdpd backend can do with this torch: a dict with a 'message' summary."""
    fsdp1_ok, fsdp1_why = _compat.fsdp1_status()
    fsdp2_ok, fsdp2_why = _compat.fsdp2_status()
    hooks = _compat.fsdp2_hook_status()
    caps = {
        "torch_version": torch.__version__,
        "backend": BACKEND_NAME,
        "devices": ["cpu"],
        "cuda": False,
        "process_group": "Python ProcessGroup subclass; Python Work subclass (HsdpWork)",
        "register_backend_devices": _compat.register_backend_takes_devices(),
        "collectives": [
            "allreduce (SUM, AVG, PREMUL_SUM, MIN, MAX, PRODUCT)", "allreduce_coalesced",
            "allgather", "all_gather_into_tensor", "allgather_coalesced",
            "allgather_into_tensor_coalesced", "reduce_scatter", "reduce_scatter_tensor",
            "reduce_scatter_tensor_coalesced", "broadcast", "barrier",
            "alltoall", "all_to_all_single", "send", "recv", "recv_anysource",
            "reduce / gather / scatter (emulated)",
            "sparse COO allreduce (SUM)", "monitored_barrier"],
        "profiler": "hsdpd:<op> events with input shapes, from enqueue to completion",
        "unsupported": ["BAND/BOR/BXOR", "split_group (use new_group)"],
        "ddp": True,
        "fsdp": fsdp1_ok,
        "fsdp_reason": fsdp1_why,
        "fsdp2": fsdp2_ok,
        "fsdp2_reason": fsdp2_why,
        "fsdp2_hooks": hooks,
        "device_mesh": _compat.device_mesh_available(),
    }
    lines = [f"hsdpd backend on torch {torch.__version__}: CPU tensors; DDP supported."]
    lines.append("FSDP (FullyShardedDataParallel): " + (
        "available." if fsdp1_ok else f"unavailable here ({fsdp1_why})."))
    lines.append("FSDP2 fully_shard: " + (
        "available." if fsdp2_ok else f"unavailable here ({fsdp2_why})."))
    have = [k for k, v in hooks.items() if v]
    lines.append("FSDP2 comm hooks: " + (
        f"{', '.join(have)} (FSDP2's buffers are in hsdpd memory by default, "
        "HSDP_COMM_BUFFERS=0 stages them; docs/torch-defaults.md)."
        if have else "none in this torch (FSDP2 buffers are staged)."))
    from hsdp.torch import cuda as _cuda
    cuda_ok, cuda_why = _cuda.cuda_available()
    caps["cuda_sharing"] = cuda_ok
    caps["cuda_sharing_reason"] = cuda_why
    lines.append("CUDA tensors: not submitted by the backend yet (raises a clear error); "
                 "hsdp.torch.cuda exports their IPC handles" +
                 (" on this machine." if cuda_ok else f" once a GPU is present ({cuda_why}).") +
                 " See docs/gpu.md.")
    caps["message"] = "\n".join(lines)
    return caps
