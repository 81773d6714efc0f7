"""Profiler events for hsdpd collectives: `hsdpd:<op>`, like Gloo's `gloo:<op>`.

torch's C++ backends open an asynchronous RecordFunction (with the input
tensors, so `record_shapes` shows their shapes) when a collective is enqueued
and close it when its Work completes. A Python backend does the same with two
of torch's own operators:

- `_record_function_with_args_enter` opens the event on the calling thread
  with the input tensors (its shapes);
- `profiler::_call_end_callbacks_on_jit_fut` closes it when the operation's
  future completes, in a callback that runs with the calling thread's
  thread-local state (the profiler's included; a plain Python callback on the
  completing thread would not have it and the end would be lost), and returns
  a future that completes only after the event has ended.

The event is asynchronous (it starts and ends on different threads) and spans
enqueue to completion. Nothing runs on the completing thread after the end:
the Work completes after it, so a profiler stopped right after wait() has
every event closed and nothing still writing to its records. (An earlier
version closed the event from a forked TorchScript task; the fork's own
`<forked function>` record ended after the Work completed, racing with the
profiler's teardown: wrong event counts, and a crash, in torch's own suite.)
Costs nothing while no profiler is active.
"""
import torch
from torch._C._autograd import _record_function_with_args_enter, _record_function_with_args_exit

PREFIX = "hsdpd:"


def enabled():
    return torch.autograd._profiler_enabled()


def record(op, inputs, fut):
    """Opens event `hsdpd:<op>` with `inputs` (tensors) now; closes it when `fut` completes.

    Returns a future with `fut`'s value that completes once the event is closed
    (None when no profiler records on this thread): the Work must complete after
    it. `fut` must complete with a value (never an exception) - the Completer's
    parent futures do.
    """
    if not enabled():
        return None
    args = [t for t in inputs if isinstance(t, torch.Tensor)]
    handle = _record_function_with_args_enter(PREFIX + op, *args)
    try:
        with torch._C.DisableTorchFunctionSubclass():
            return torch.ops.profiler._call_end_callbacks_on_jit_fut._RecordFunction(handle, fut)
    except Exception:  # noqa: BLE001 - profiling must never fail the collective
        _record_function_with_args_exit(handle)
        return None
