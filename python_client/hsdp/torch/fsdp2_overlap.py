"""FSDP2's reduce-scatters overlap the rest of backward on CPU (docs/torch-defaults.md).

On CUDA, FSDP2 issues each reduce-scatter on a stream of its own and backward
goes on while it runs. On CPU a stream is nothing, so FSDP2 waits for every
reduce-scatter in the post-backward hook: each rank stops while the daemon
reduces, and the daemon has nothing to do while the ranks compute. The daemon is another process, so nothing forces that wait: the
reduce-scatter comms hsdp installs by default (fsdp2_auto) issue it without
waiting, and wait once autograd has finished (a final callback of the same
backward pass), before anything can read the gradients.

That is only right when nothing FSDP2 does after the call, inside the hook,
reads the output. defer_allowed() checks it for every call, from the param
group's state, and any doubt means waiting at once as before:
  - the op is AVG or PREMUL_SUM (FSDP2 divides after a SUM);
  - the group is not HSDP or replicated (their all-reduce reads the output), has
    no all-reduce hook and no partial reduce output;
  - no parameter of the group has a gradient already (accumulation adds into
    it), a post-accumulate-grad hook (user code reading .grad), CPU offload or a
    gradient dtype other than the reduce dtype (a cast reads it);
  - a backward pass is running (autograd takes a final callback) outside
    compiled autograd.
At most MAX_IN_FLIGHT (2) deferred reduce-scatters are outstanding: issuing a
third waits for the oldest first. Each keeps its input (the layer's unsharded
gradients in the reduce dtype) until it completes, so an unbounded queue
behind a slow daemon could hold every layer's at once; FSDP2 bounds its CUDA
streams the same way (the next post-backward waits for the previous
reduce-scatter's event).
Two safety nets wait too, for a backward that raised before its final
callbacks ran: the next forward of any module and the next optimizer step
(global hooks, registered on the first deferral).

HSDP_FSDP2_OVERLAP=0 turns it off (every reduce-scatter waited in its hook).
"""
import os
import threading

import torch

ENV = "HSDP_FSDP2_OVERLAP"
MAX_IN_FLIGHT = 2

_lock = threading.Lock()
_pending = []            # Works issued and not waited yet
_queued = set()          # graph tasks whose final callback is queued
_hooks = []              # the safety nets' handles, once registered
_stats = {"waited_by_safety_net": 0}  # per-comm counts: comm_buffer_stats "overlapped"


def enabled():
    return os.environ.get(ENV, "1").strip() != "0"


def _in_plain_backward():
    if torch._C._current_graph_task_id() == -1:
        return False
    try:
        from torch._dynamo import compiled_autograd
        return not compiled_autograd.in_compiled_autograd_region()
    except Exception:  # noqa: BLE001 - no dynamo: no compiled autograd either
        return True


def _group_allows(param_group, output):
    from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo
    g = param_group
    if isinstance(g.mesh_info, DDPMeshInfo):  # HSDP or replicate: FSDP2 all-reduces it
        return False
    if g._all_reduce_hook is not None or g._partial_reduce_output is not None:
        return False
    for p in g.fsdp_params:
        sp = p.sharded_param
        if p.offload_to_cpu or sp.grad is not None:
            return False
        if getattr(sp, "_post_accumulate_grad_hooks", None):
            return False
        if p.sharded_grad_dtype not in (None, output.dtype):
            return False
    return True


def defer_allowed(param_group, op_name, output):
    """Whether FSDP2's reduce-scatter of `param_group` into `output` with hsdpd op
    `op_name` may complete after the post-backward hook returns."""
    if not enabled() or op_name not in ("avg", "premul_sum") or param_group is None:
        return False
    if not _in_plain_backward():
        return False
    try:
        return _group_allows(param_group, output)
    except (AttributeError, ImportError):  # another torch's FSDP2: wait as before
        return False


def defer(submit):
    """Runs submit() (issuing the operation without waiting; it returns the Work) and
    has the Work waited when this backward pass ends. True once submitted; False when
    no final callback could be queued (then nothing was submitted: the caller waits
    the usual way)."""
    task = torch._C._current_graph_task_id()
    with _lock:
        first = task not in _queued
        if first:
            _queued.add(task)
    if first:
        try:
            torch.autograd.Variable._execution_engine.queue_callback(
                lambda: _end_of_backward(task))
        except RuntimeError:
            with _lock:
                _queued.discard(task)
            return False
    _register_safety_nets()
    work = submit()
    if work is not None:  # None: nothing left to wait for
        with _lock:
            _pending.append(work)
    while True:  # the bound on what is outstanding (a failure raises from the hook)
        with _lock:
            if len(_pending) <= MAX_IN_FLIGHT:
                break
            oldest = _pending.pop(0)
        oldest.wait()
    return True


def _end_of_backward(task):
    with _lock:
        _queued.discard(task)
    wait_all()


def wait_all():
    """Waits every deferred reduce-scatter; raises the first failure (after waiting
    the others, so none is left running into memory that goes back to its pool)."""
    with _lock:
        works = list(_pending)
        _pending.clear()
    first = None
    for w in works:
        try:
            w.wait()
        except BaseException as e:  # noqa: B902 - re-raised below
            first = first or e
    if first is not None:
        raise first


def pending():
    with _lock:
        return len(_pending)


def stats():
    with _lock:
        return dict(_stats)


def _safety_net(*_args, **_kwargs):
    if not _pending:  # unlocked read: the common case costs one list test
        return None
    if torch._C._current_graph_task_id() != -1:
        return None  # a backward's own forward (recomputation): its callback waits
    with _lock:
        _stats["waited_by_safety_net"] += 1
        _queued.clear()  # no backward is running: no callback is still to come
    wait_all()
    return None


def _register_safety_nets():
    if _hooks:
        return
    with _lock:
        if _hooks:
            return
        from torch.nn.modules.module import register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        _hooks.append(register_module_forward_pre_hook(_safety_net))
        _hooks.append(register_optimizer_step_pre_hook(_safety_net))
