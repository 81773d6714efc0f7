"""What the installed torch offers, detected once at import.

Supported: torch >= 2.7 (the first with FSDP2 on CPU); tested: 2.15.0.
"""
import inspect
import re

import torch
import torch.distributed as dist


def _version_tuple(v):
    m = re.match(r"(\d+)\.(\d+)", v)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


TORCH_VERSION = _version_tuple(torch.__version__)
MIN_TORCH = (2, 7)


def require_supported_torch():
    """ImportError naming the versions when this torch is older than MIN_TORCH."""
    if TORCH_VERSION < MIN_TORCH:
        raise ImportError(
            f"hsdp.torch needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (tested: 2.15.0), found "
            f"{torch.__version__}; tools/scripts/python_env.sh installs the tested release")


def _c10d():
    import torch._C._distributed_c10d as c10d
    return c10d


def register_backend_takes_devices():
    try:
        return "devices" in inspect.signature(dist.Backend.register_backend).parameters
    except (TypeError, ValueError):
        return False


def _try_import(name):
    try:
        __import__(name)
        return True, ""
    except Exception as e:  # torch 1.13 + Python 3.11: fsdp fails at import
        return False, f"{type(e).__name__}: {e}"


def fsdp1_status():
    ok, why = _try_import("torch.distributed.fsdp")
    return ok, why


def fsdp2_status():
    """(importable, reason) for FSDP2 fully_shard."""
    for mod in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):
        ok, why = _try_import(mod)
        if ok:
            m = __import__(mod, fromlist=["fully_shard"])
            if hasattr(m, "fully_shard"):
                return True, ""
    if TORCH_VERSION < (2, 4):
        return False, f"torch {torch.__version__} has no FSDP2 fully_shard (needs >= 2.4)"
    return False, why


def fully_shard():
    """torch's fully_shard (FSDP2), or ImportError."""
    try:
        from torch.distributed.fsdp import fully_shard as fs  # torch >= 2.6
        return fs
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard as fs  # 2.4 / 2.5
        return fs


def fsdp2_module_class():
    try:
        from torch.distributed.fsdp import FSDPModule
        return FSDPModule
    except ImportError:
        from torch.distributed._composable.fsdp import FSDPModule
        return FSDPModule


def fsdp2_hook_status():
    """Which FSDP2 comm hooks this torch has: dict name -> bool."""
    out = {"set_custom_all_gather": False, "set_custom_reduce_scatter": False,
           "set_all_reduce_hook": False}
    ok, _ = fsdp2_status()
    if not ok:
        return out
    try:
        cls = fsdp2_module_class()
    except ImportError:
        return out
    for name in out:
        out[name] = hasattr(cls, name)
    return out


def device_mesh_available():
    ok, _ = _try_import("torch.distributed.device_mesh")
    return ok and hasattr(__import__("torch.distributed.device_mesh",
                                     fromlist=["init_device_mesh"]), "init_device_mesh")
