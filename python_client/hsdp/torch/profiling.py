"""Profiler events for hsdpd collectives: `hsdpd:<op>`, like Gloo's `gloo:<op>`.

torch's C++ backends open an asynchronous RecordFunction (with the input
tensors, so `record_shapes` shows their shapes) when a collective is enqueued
and close it when its Work completes. A Python backend has no such hook in
torch 1.13, and two obvious substitutes fall short:

- torch.autograd.profiler.record_function + _call_end_callbacks_on_future
  ends on completion but records no input shapes;
- _record_function_with_args_enter records shapes, but closing it on the
  completion thread is lost: the profiler's state is thread-local and a
  Python Future callback does not carry it.

So the event is opened on the calling thread with its input tensors, and
closed by a TorchScript task forked from the calling thread: forked tasks,
and the continuation that resumes one after it waited on a Future, run with
the forking thread's thread-local state (the profiler's included). The task
waits on the operation's future and then closes the event on the thread that
completed the operation, so the event is asynchronous (start and end threads
differ), spans enqueue to completion, and carries the input shapes. Costs
nothing while no profiler is active. The profiler also lists the helper's
own `_hsdp_profile_end` / `<forked function>` frames.
"""
import itertools
import threading
from typing import Any

import torch
from torch._C._autograd import _record_function_with_args_enter, _record_function_with_args_exit

PREFIX = "hsdpd:"

_lock = threading.Lock()
_open = {}
_keys = itertools.count()
_launcher = None


@torch.jit.ignore
def _close(key: int) -> None:
    with _lock:
        handle = _open.pop(key, None)
    if handle is not None:
        _record_function_with_args_exit(handle)


def _end_when_done(fut: torch.jit.Future[Any], key: int) -> int:
    torch.jit._wait(fut)
    _close(key)
    return key


def _hsdp_profile_end(fut: torch.jit.Future[Any], key: int) -> torch.jit.Future[int]:
    return torch.jit._fork(_end_when_done, fut, key)


def _get_launcher():
    global _launcher
    if _launcher is None:
        _launcher = torch.jit.script(_hsdp_profile_end)  # compiles _end_when_done too
    return _launcher


def enabled():
    return torch.autograd._profiler_enabled()


def record(op, inputs, fut):
    """Opens event `hsdpd:<op>` with `inputs` (tensors) now; closes it when `fut` completes.

    Returns a future that completes once the event is closed (None when no
    profiler records on this thread): the Work must complete after it, or a
    profiler that stops right after wait() would miss the event's end.
    `fut` must complete with a value (never an exception) - the Completer's
    parent futures do.
    """
    if not enabled():
        return None
    args = [t for t in inputs if isinstance(t, torch.Tensor)]
    handle = _record_function_with_args_enter(PREFIX + op, *args)
    key = next(_keys)
    with _lock:
        _open[key] = handle
    try:
        return _get_launcher()(fut, key)
    except Exception:  # noqa: BLE001 - profiling must never fail the collective
        _close(key)
        return None
