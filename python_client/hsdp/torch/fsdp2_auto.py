"""FSDP2's communication buffers in hsdpd memory by default (docs/torch-defaults.md).

FSDP2 (torch 2.15) allocates its all-gather output and its reduce-scatter
input and output with torch.empty unless the user calls a per-module API
(set_allocate_memory_from_process_group_for_comm, set_custom_all_gather /
set_custom_reduce_scatter); nothing in torch consults the backend by itself,
and fully_shard runs in user code. So something has to see the sharded
module before its first collective. That is torch's global module
forward-pre-hook (torch.nn.modules.module.register_module_forward_pre_hook),
registered once per process when its first "hsdpd" process group is created
(arm(), from backend.create_process_group) and only then: a process without
hsdpd groups never has it. It runs before FSDP2's own pre-forward hook; the
first time it meets an FSDP2 module (the root, whose forward starts the
step) it sets up every FSDP2 module under it and remembers them:

* a parameter group on CPU whose shard (and reduce-scatter) groups are all
  "hsdpd" and whose comms are still torch's defaults gets HsdpAutoAllGather /
  HsdpAutoReduceScatter (hsdp.torch.fsdp2): FSDP2's buffers then come from the
  session's pool of hsdpd memory and its collectives run in place. They are
  torch's ProcessGroupAlloc* comms (so set_allocate_memory_from_process_group
  (False) still switches them back), counting what they do;
* custom comms the user set, CUDA parameter groups, and groups of other
  backends are left alone; so are modules first run under torch.compile
  tracing (they keep the staging path) - the hook returns at once there.

The staging path stays the fallback: when hsdpd cannot hand out memory (a
share or the node's limit), allocate_or_fallback returns torch.empty and the
collective stages as before; comm_buffer_stats(module) says which path ran.
HSDP_COMM_BUFFERS=0 turns all of this off (nothing is hooked, the backend
offers no allocation to torch).
"""
import os
import sys
import threading
import warnings
import weakref

import torch

ENV = "HSDP_COMM_BUFFERS"
_FULLY_SHARD = "torch.distributed.fsdp._fully_shard._fully_shard"

_lock = threading.Lock()
_handle = None
_checked = weakref.WeakSet()  # FSDP2 modules already looked at
_stats = {"fallbacks": 0}
_warned = [False]


def comm_buffers_enabled():
    """False when HSDP_COMM_BUFFERS=0 (the opt-out)."""
    return os.environ.get(ENV, "1").strip() != "0"


def allocate_or_fallback(size, dtype, device):
    """(tensor, in_hsdpd): a buffer from the session's pool of hsdpd memory, or, when
    hsdpd cannot give one, torch.empty (the collective then stages)."""
    from hsdp.torch.fsdp2 import allocate_shared
    try:
        return allocate_shared(size, dtype, device), True
    except Exception as e:  # noqa: BLE001 - the staging path is the fallback
        with _lock:
            _stats["fallbacks"] += 1
            first, _warned[0] = not _warned[0], True
        if first:
            warnings.warn(f"hsdp: FSDP2 communication buffer of {tuple(size)} {dtype} not in "
                          f"hsdpd memory ({e}); this and later such buffers are staged",
                          RuntimeWarning, stacklevel=3)
        return torch.empty(*size, dtype=dtype, device=device), False


def fallbacks():
    with _lock:
        return _stats["fallbacks"]


def arm():
    """Registers the module pre-forward hook once per process (idempotent; a no-op with
    HSDP_COMM_BUFFERS=0)."""
    global _handle
    if _handle is not None or not comm_buffers_enabled():
        return
    with _lock:
        if _handle is None:
            from torch.nn.modules.module import register_module_forward_pre_hook
            _handle = register_module_forward_pre_hook(_pre_forward)


def disarm():
    """Removes the hook (tests; modules already set up keep their comms)."""
    global _handle
    with _lock:
        handle, _handle = _handle, None
    if handle is not None:
        handle.remove()


def armed():
    return _handle is not None


def _pre_forward(module, args):
    if torch.compiler.is_compiling():
        return None
    fs = sys.modules.get(_FULLY_SHARD)
    if fs is None or not isinstance(module, fs.FSDPModule) or module in _checked:
        return None
    setup_tree(module)
    return None


def setup_tree(root):
    """Sets up every FSDP2 module under `root` not looked at yet; the number changed."""
    fs = sys.modules.get(_FULLY_SHARD)
    if fs is None:
        return 0
    changed = 0
    for m in root.modules():
        if isinstance(m, fs.FSDPModule) and m not in _checked:
            _checked.add(m)
            changed += int(setup_module(m) > 0)
    return changed


def _hsdp_groups(param_group):
    """The process groups the param group's all-gathers and reduce-scatters use, or None
    when it has none (replicate-only mesh)."""
    groups = []
    for info in (param_group.mesh_info, param_group.post_forward_mesh_info):
        pg = getattr(info, "shard_process_group", None) if info is not None else None
        if info is param_group.mesh_info and pg is None:
            return None
        if pg is not None:
            groups.append(pg)
    rs = getattr(param_group.mesh_info, "reduce_scatter_process_group", None)
    if rs is not None:
        groups.append(rs)
    return groups


def setup_module(module):
    """Installs the hsdpd comms on `module`'s eligible param groups; how many comms."""
    if not comm_buffers_enabled():
        return 0
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import (DefaultAllGather,
                                                                       DefaultReduceScatter)

    from hsdp.torch.backend import ProcessGroupHsdp
    from hsdp.torch.fsdp2 import HsdpAutoAllGather, HsdpAutoReduceScatter
    if HsdpAutoAllGather is None:
        return 0
    count = 0
    for g in module._get_fsdp_state()._fsdp_param_groups:
        if torch.device(g.device).type != "cpu":
            continue
        groups = _hsdp_groups(g)
        if not groups or not all(isinstance(pg, ProcessGroupHsdp) for pg in groups):
            continue
        if type(g._all_gather_comm) is DefaultAllGather:
            g._all_gather_comm = HsdpAutoAllGather(g.mesh_info.shard_process_group)
            count += 1
        if type(g._reduce_scatter_comm) is DefaultReduceScatter:
            g._reduce_scatter_comm = HsdpAutoReduceScatter(g._reduce_scatter_process_group, g)
            count += 1
    return count
