"""Completion of hsdpd operations behind torch Work objects.

torch's C++ callers (DDP's Reducer, c10d's wait) can only wait on Work
objects created in C++; a Python Work subclass loses its Python overrides
when handed to C++ in torch 1.13. So every collective returns
_create_work_from_future(fut) and a Completer thread per process group waits
on the hsdpd operation (GIL released), runs the staging copy-outs and then
completes `fut` with the output tensors, or fails it with the error.
Operations of one process group are waited for and copied out in submission
order; their futures are completed on a small notifier pool, so a callback
that issues and waits for another collective cannot deadlock the completer.

Failures: torch.futures.Future.set_exception only marks the future on the
Python side (C++ waiters see a "value"), so the Work is built on a child
future `parent.then(_unwrap)`: the callback raises for a failed operation,
which puts the child into a real C++ error state that DDP's Reducer and
Future.wait() both see.
"""
import concurrent.futures
import datetime
import queue
import threading
import time

import torch
from torch._C._distributed_c10d import _create_work_from_future

from hsdp import _hsdp
from hsdp.torch import profiling

_COMPAT_LOCK = threading.Lock()


def completed_work(result=None):
    fut = torch.futures.Future()
    fut.set_result(result if result is not None else [])
    return _create_work_from_future(fut)


_TORCH_COMPATIBLE = {}


def torch_compatible(cls):
    """`cls`, or a subclass of `cls` and RuntimeError: torch's backends raise
    RuntimeError for failed collectives, and code written for Gloo catches that.
    (hsdp.errors.DeadlineExceeded is a TimeoutError, Aborted a plain HsdpError.)"""
    if issubclass(cls, RuntimeError):
        return cls
    with _COMPAT_LOCK:
        sub = _TORCH_COMPATIBLE.get(cls)
        if sub is None:
            sub = type(cls.__name__, (cls, RuntimeError), {
                "__module__": cls.__module__,
                "__doc__": f"{cls.__name__} from the hsdpd torch backend (also a RuntimeError)."})
            _TORCH_COMPATIBLE[cls] = sub
    return sub


def _make(cls, msg, cause):
    try:
        err = torch_compatible(cls)(msg)
    except Exception:  # noqa: BLE001 - a class whose constructor wants more
        err = RuntimeError(msg)
    for attr in ("code", "code_name"):
        if hasattr(cause, attr):
            try:
                setattr(err, attr, getattr(cause, attr))
            except Exception:  # noqa: BLE001
                pass
    try:
        err.message = msg
    except Exception:  # noqa: BLE001
        pass
    return err


def failed_error(what, e):
    """An exception like `e` (and a RuntimeError) whose message names the operation."""
    return _make(type(e), f"hsdpd {what} failed: {e}", e)


def timeout_error(what, timeout_s, e):
    """The error of an operation that timed out, worded like torch's backends
    ("Timed out waiting <ms>ms for ..."). timeout_s: the process group's timeout
    that expired here, or None where hsdpd's collective timeout failed the
    operation (its message names the ranks that did not arrive)."""
    if timeout_s is None:
        return _make(type(e), f"hsdpd {what}: Timed out in hsdpd: {e}", e)
    ms = int(round(timeout_s * 1000))
    return _make(type(e), f"hsdpd {what}: Timed out waiting {ms}ms for the operation to "
                 f"complete (the process group's timeout; {e}). Ranks that never arrive are "
                 "named by hsdpd once its collective timeout (timeouts.collective_ms) "
                 "expires.", e)


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


def _unwrap(fut):
    value = fut.value()
    if isinstance(value, _Failure):
        raise value.error
    return value


# Futures are completed on this pool, not on a Completer thread: a callback
# chained on a Work's future may issue another collective and wait for it
# (PowerSGD's hooks do), which must not stall the thread that completes it.
_NOTIFIER = concurrent.futures.ThreadPoolExecutor(max_workers=8,
                                                  thread_name_prefix="hsdp-notify")


def _deliver(fut, value):
    _NOTIFIER.submit(fut.set_result, value)


class Completer:
    """One helper thread waiting for the operations of one process group, in
    submission order (copy-outs happen in that order); their futures are
    completed on the notifier pool."""

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

    def add(self, raw_work, plan, result, what, profile=None):
        """Returns a torch Work completed once `raw_work` and its copy-outs are done.

        profile: (op, input tensors) for the profiler event `hsdpd:<op>`.
        """
        fut = torch.futures.Future()
        closed = profiling.record(profile[0], profile[1], fut) if profile is not None else None
        if closed is None:
            child = fut.then(_unwrap)
        else:  # complete the Work only after the profiler event has ended
            child = closed.then(lambda _closed, fut=fut: _unwrap(fut))
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
            if "still pending after" in str(e):  # our wait's deadline: the op goes on
                plan.abandon()  # the daemon may still write the staging buffers
                _deliver(fut, _Failure(timeout_error(what, self._timeout, e)))
            else:  # hsdpd failed the operation
                self._count(raw, True)
                plan.release()
                _deliver(fut, _Failure(timeout_error(what, None, e)))
            return
        except BaseException as e:  # noqa: B902 - every failure reaches the waiter
            self._count(raw, True)
            plan.release()
            _deliver(fut, _Failure(failed_error(what, e)))
            return
        self._count(raw, False)
        try:
            plan.finish()
        except BaseException as e:  # noqa: B902
            _deliver(fut, _Failure(failed_error(f"{what} copy-out", e)))
            return
        _deliver(fut, result)


def _wait_swallows_errors():
    fut = torch.futures.Future()
    child = fut.then(_unwrap)
    fut.set_result(_Failure(RuntimeError("probe")))
    try:
        _create_work_from_future(child).wait()
    except Exception:  # noqa: BLE001 - this torch propagates errors itself
        return False
    return True


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


def _future_of(work):
    try:
        return work.get_future()
    except RuntimeError:
        return None


def _timed_wait(work, timeout):
    """Waits for a future-backed Work for at most `timeout`; raises its error."""
    fut = _future_of(work)
    if fut is None:
        raise RuntimeError("Work.wait(timeout): this Work has no future to wait on")
    secs = max(_seconds(timeout), 0.0)
    done = threading.Event()
    fut.add_done_callback(lambda _: done.set())
    if not done.wait(secs):
        raise RuntimeError(f"Timed out waiting {int(round(secs * 1000))}ms for the operation "
                           "to complete (Work.wait timeout; the operation goes on)")
    fut.wait()  # raises the operation's error
    return True


def install_work_api():
    """Completes torch's Work API for future-backed Works (hsdpd's, any Python backend's).

    torch 1.13's FutureWrappingWork (what _create_work_from_future returns):
    - wait() returns True even when its future failed (through at least
      2.11), so a failed operation would pass silently through
      dist.all_reduce(...): after the original wait, a failed future is
      re-raised;
    - wait(timeout) raises "with finite timeout not implemented": the timeout
      is honoured here ("Timed out waiting <ms>ms ..." RuntimeError);
    - exception() cannot convert its result to Python (TypeError): it returns
      the operation's exception, or None;
    - result() before completion trips an internal assert: it raises a
      RuntimeError saying so.
    Other Works are unaffected (each fallback runs only where torch's own
    method refuses). Idempotent.
    """
    import torch._C._distributed_c10d as c10d
    work_cls = c10d.Work
    if getattr(work_cls.wait, "_hsdp_wrapped", False):
        return
    orig_wait, orig_exception, orig_result = (work_cls.wait, work_cls.exception,
                                              work_cls.result)
    reraise = _wait_swallows_errors()

    def wait(self, *args, **kwargs):
        try:
            result = orig_wait(self, *args, **kwargs)
        except RuntimeError as e:
            if "finite timeout not implemented" not in str(e):
                raise
            timeout = args[0] if args else kwargs.get("timeout")
            return _timed_wait(self, timeout)
        if reraise:
            fut = _future_of(self)
            if fut is not None and fut.done():
                fut.wait()  # re-raises the operation's error
        return result

    def exception(self):
        try:
            return orig_exception(self)
        except TypeError:
            fut = _future_of(self)
            if fut is None or not fut.done():
                return None
            try:
                fut.wait()
            except Exception as e:  # noqa: BLE001 - the operation's error is the answer
                return e
            return None

    def result(self):
        fut = _future_of(self)
        if fut is not None and not fut.done():
            raise RuntimeError("Work.result(): the operation has not completed; wait() first")
        return orig_result(self)

    for name, fn, orig in (("wait", wait, orig_wait), ("exception", exception, orig_exception),
                           ("result", result, orig_result)):
        fn._hsdp_wrapped = True
        fn.__doc__ = orig.__doc__
        setattr(work_cls, name, fn)


install_error_propagation = install_work_api  # the former name
