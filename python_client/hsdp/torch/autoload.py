"""hsdpd as the backend torch's defaults resolve to, without editing code
(docs/torch-defaults.md).

With HSDP_DEFAULT_BACKEND=1 in a process's environment, enable() runs when
torch is imported there (hsdprun's bootstrap, hsdp/_boot/sitecustomize.py, or
the wheel's `torch.backends` entry point, `_torch_autoload`): it imports
hsdp.torch (registering "hsdpd") and points
``Backend.default_device_backend_map["cpu"]`` at "hsdpd". Then
``init_process_group()`` with no backend (on a machine without an
accelerator), ``init_process_group(backend=Backend.default_device_backend_map
["cpu"])`` (torchtitan), ``dist.get_default_backend_for_device("cpu")`` and
``init_device_mesh("cpu", ...)`` without a default group all select hsdpd.

What it changes, in that process only: that one map entry (plus, with
HSDP_REPLACE_GLOO=1, which groups the name "gloo" builds; see replace_gloo()).
Explicit backend names ("gloo", "nccl", "cuda:nccl,cpu:gloo") keep their
meaning; "cuda" stays NCCL's unless HSDP_DEFAULT_BACKEND lists it
(HSDP_DEFAULT_BACKEND=cpu,cuda): hsdpd's device path serves only all-reduce,
all-gather into / reduce-scatter from a tensor and broadcast of CUDA tensors
(not the list all-gather of all_gather_object and DCP, send/recv, all-to-all),
and only on a node whose hsdpd runs its NCCL engine (docs/gpu.md), so it
cannot stand in for NCCL as every CUDA job's default.

Without the variable nothing here runs and torch's map is unchanged.
"""
import os

ENV = "HSDP_DEFAULT_BACKEND"
ENV_REPLACE_GLOO = "HSDP_REPLACE_GLOO"
_DEVICES = ("cpu", "cuda")

_saved_map = {}      # device -> the map's entry before enable()
_saved_gloo = None   # Backend._plugins["GLOO"] before replace_gloo()


def requested_devices(value=None):
    """The device types HSDP_DEFAULT_BACKEND asks for: () when unset, empty or "0";
    ("cpu",) for "1"; else its comma-separated list (cpu, cuda). ValueError otherwise."""
    value = os.environ.get(ENV, "") if value is None else value
    value = value.strip().lower()
    if value in ("", "0"):
        return ()
    if value == "1":
        return ("cpu",)
    devices = tuple(d.strip() for d in value.split(",") if d.strip())
    bad = [d for d in devices if d not in _DEVICES]
    if bad or not devices:
        raise ValueError(f"{ENV}={value!r}: expected 1, 0, or a comma-separated list of "
                         f"{', '.join(_DEVICES)} (got {', '.join(bad) or 'nothing'})")
    return devices


def enable(devices=("cpu",), replace_gloo_backend=False):
    """Registers "hsdpd" and makes it torch's default backend for `devices` (idempotent).

    A device is mapped only where "hsdpd" is registered for it (cuda: where torch has a
    GPU, see backend.register). Returns the devices now mapped to "hsdpd"."""
    import torch.distributed as dist

    import hsdp.torch  # noqa: F401 - registers "hsdpd"
    from hsdp.torch.backend import BACKEND_NAME

    backend = dist.Backend
    able = backend.backend_capability.get(BACKEND_NAME, [])
    for dev in devices:
        if dev not in _DEVICES:
            raise ValueError(f"hsdp.torch.autoload.enable: unknown device type {dev!r}")
        if dev not in able:
            continue
        current = backend.default_device_backend_map.get(dev)
        if current != BACKEND_NAME:
            _saved_map.setdefault(dev, current)
            backend.default_device_backend_map[dev] = BACKEND_NAME
    if replace_gloo_backend:
        replace_gloo()
    return sorted(d for d, b in backend.default_device_backend_map.items() if b == BACKEND_NAME)


def replace_gloo():
    """Serves every process group this process builds under the name "gloo" (alone or as
    the cpu part of "cuda:nccl,cpu:gloo") with hsdpd (idempotent; HSDP_REPLACE_GLOO=1).

    For frameworks that hard-code "gloo" for CPU (Accelerate's MULTI_CPU, Lightning's
    default). Globally, in this process: torch's "gloo" plugin entry creates hsdpd
    groups; dist.get_backend(group) still answers "gloo" (torch reports the name it
    was asked for) while group.name() is "hsdpd"; Gloo-only APIs on such a group
    (ProcessGroupGloo options, CUDA tensors without hsdpd's device engine) are not
    there. torch's own debug wrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL) still builds
    real Gloo helper groups (it calls ProcessGroupGloo directly)."""
    global _saved_gloo
    import torch.distributed as dist

    import hsdp.torch  # noqa: F401
    from hsdp.torch.backend import create_process_group
    ensure = getattr(dist.Backend, "_ensure_backend_registered", None)
    if ensure is None:  # before 2.15 torch builds Gloo groups without its plugin table
        raise NotImplementedError(
            f"{ENV_REPLACE_GLOO}=1 needs a torch whose built-in backends are plugins "
            f"(2.15; this is {__import__('torch').__version__}): pass the backend "
            "'hsdpd' to the framework instead")
    ensure(dist.Backend.GLOO)  # torch registers its built-in backends on first use
    plugins = dist.Backend._plugins
    current = plugins.get("GLOO")
    if current is not None and current.creator_fn is create_process_group:
        return
    if _saved_gloo is None:
        _saved_gloo = current
    plugins["GLOO"] = dist.Backend._BackendPlugin(create_process_group, False)


def disable():
    """Undoes enable() and replace_gloo() in this process (tests; idempotent)."""
    global _saved_gloo
    import torch.distributed as dist
    for dev, old in list(_saved_map.items()):
        if old is None:
            dist.Backend.default_device_backend_map.pop(dev, None)
        else:
            dist.Backend.default_device_backend_map[dev] = old
        del _saved_map[dev]
    if _saved_gloo is not None:
        dist.Backend._plugins["GLOO"] = _saved_gloo
        _saved_gloo = None


def enable_from_env():
    """enable() as the environment asks: nothing unless HSDP_DEFAULT_BACKEND is set
    (to 1 or a device list); HSDP_REPLACE_GLOO=1 also replaces "gloo". Returns the
    devices mapped, or () when the variable is off."""
    devices = requested_devices()
    if not devices:
        return ()
    gloo = os.environ.get(ENV_REPLACE_GLOO, "").strip() == "1"
    return tuple(enable(devices, replace_gloo_backend=gloo))


def _torch_autoload():
    """The wheel's `torch.backends` entry point: torch calls it at the end of its own
    import (torch/__init__.py, _import_device_backends; TORCH_DEVICE_BACKEND_AUTOLOAD=0
    turns every such plugin off). A no-op unless HSDP_DEFAULT_BACKEND is set.

    torch has defined everything a backend needs by then (torch.distributed is
    imported before the plugins run), so hsdp.torch is imported right here; an error
    names the variable (torch adds its own line on how to turn autoloading off)."""
    if not os.environ.get(ENV, "").strip() or os.environ.get(ENV, "").strip() == "0":
        return
    try:
        enable_from_env()
    except Exception as e:  # noqa: BLE001 - re-raised with the variable named
        raise RuntimeError(f"hsdp: {ENV}={os.environ.get(ENV)!r} is set but hsdpd could not "
                           f"be made torch's default backend: {e}") from e
