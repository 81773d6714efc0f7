"""Completion of hsdpd operations behind torch Work objects.

torch's C++ callers (DDP's Reducer, c10d's wait) can only wait on Work
objects created in C++; a Python Work subclass loses its Python overrides
when handed to C++ in torch 1.13. So every collective returns
_create_work_from_future(fut) and a Completer thread per process group waits
on the hsdpd operation (GIL released), runs the staging copy-outs and then
completes `fut` with the output tensors, or fails it with the error.
Operations of one process group complete in submission order.

Failures: torch.futures.Future.set_exception only marks the future on the
Python side (C++ waiters see a "value"), so the Work is built on a child
future `parent.then(_unwrap)`: the callback raises for a failed operation,
which puts the child into a real C++ error state that DDP's Reducer and
Future.wait() both see.
"""
import queue
import threading

import torch
from torch._C._distributed_c10d import _create_work_from_future

from hsdp import _hsdp


def completed_work(result=None):
    fut = torch.futures.Future()
    fut.set_result(result if result is not None else [])
    return _create_work_from_future(fut)


def failed_error(what, e):
    """An exception like `e` whose message names the operation."""
    msg = f"hsdpd {what} failed: {e}"
    try:
        err = type(e)(msg)
        for attr in ("code", "code_name", "message"):
            if hasattr(e, attr):
                setattr(err, attr, getattr(e, attr))
        return err
    except Exception:
        return RuntimeError(msg)


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


def _unwrap(fut):
    value = fut.value()
    if isinstance(value, _Failure):
        raise value.error
    return value


class Completer:
    """One helper thread completing the operations of one process group."""

    def __init__(self, name, timeout_s):
        self._name = name
        self._timeout = timeout_s
        self._q = queue.SimpleQueue()
        self._thread = None
        self._lock = threading.Lock()
        self._stats = {"ops": 0, "failed": 0, "exec_ns": 0, "queued_ns": 0}

    def stats(self):
        """Completed operations and the daemon's execution/queueing time for them."""
        with self._lock:
            return dict(self._stats)

    def _count(self, raw, failed):
        with self._lock:
            self._stats["ops"] += 1
            self._stats["failed"] += int(failed)
            self._stats["exec_ns"] += raw.exec_ns
            self._stats["queued_ns"] += raw.queued_ns

    def add(self, raw_work, plan, result, what):
        """Returns a torch Work completed once `raw_work` and its copy-outs are done."""
        fut = torch.futures.Future()
        child = fut.then(_unwrap)
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"hsdp-completer-{self._name}")
                self._thread.start()
        self._q.put((raw_work, plan, fut, result, what))
        return _create_work_from_future(child)

    def close(self):
        with self._lock:
            if self._thread is not None:
                self._q.put(None)
                self._thread = None

    def _loop(self):
        while True:
            item = self._q.get()
            if item is None:
                return
            self._complete(*item)
            del item  # drop the last operation's tensors before blocking again

    def _complete(self, raw, plan, fut, result, what):
        try:
            raw.wait(self._timeout)
        except _hsdp.DeadlineExceeded as e:
            plan.abandon()  # the daemon may still write the staging buffers
            fut.set_result(_Failure(failed_error(
                f"{what} (timed out after {self._timeout:.0f} s)", e)))
            return
        except BaseException as e:  # noqa: B902 - every failure reaches the waiter
            self._count(raw, True)
            plan.release()
            fut.set_result(_Failure(failed_error(what, e)))
            return
        self._count(raw, False)
        try:
            plan.finish()
        except BaseException as e:  # noqa: B902
            fut.set_result(_Failure(failed_error(f"{what} copy-out", e)))
            return
        fut.set_result(result)


def _wait_swallows_errors():
    fut = torch.futures.Future()
    child = fut.then(_unwrap)
    fut.set_result(_Failure(RuntimeError("probe")))
    try:
        _create_work_from_future(child).wait()
    except Exception:  # noqa: BLE001 - this torch propagates errors itself
        return False
    return True


def install_error_propagation():
    """Makes Work.wait() raise the error of a failed future-backed Work.

    torch's FutureWrappingWork::wait() (1.13 through at least 2.11) returns
    True even when its future failed, so a failed hsdpd operation would pass
    silently through dist.all_reduce(...). This wraps Work.wait: after the
    original wait, a completed future with an error is re-raised. Works
    without a future (some backends) are unaffected. Idempotent; a no-op on a
    torch whose wait already raises.
    """
    import torch._C._distributed_c10d as c10d
    orig = c10d.Work.wait
    if getattr(orig, "_hsdp_wrapped", False) or not _wait_swallows_errors():
        return

    def wait(self, *args, **kwargs):
        result = orig(self, *args, **kwargs)
        try:
            fut = self.get_future()
        except RuntimeError:
            return result
        if fut.done():
            fut.wait()  # re-raises the operation's error
        return result

    wait._hsdp_wrapped = True
    wait.__doc__ = orig.__doc__
    c10d.Work.wait = wait
