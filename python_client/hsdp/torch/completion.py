"""Completion of hsdpd operations behind torch Work objects.

Every collective returns an HsdpWork, a Python subclass of c10d's Work: torch
2.x keeps the Python object behind the C++ Work, so C++ callers (functional
collectives' wait_tensor, DTensor, DDP's Reducer through get_future(), c10d's
own wait) reach these overrides, and a failed operation raises there with its
own exception, never hands back the output buffer's stale contents. (torch's
FutureWrappingWork, from _create_work_from_future, returns from wait() without
raising when its future failed, through at least 2.15.)

A Completer thread per process group waits on the hsdpd operations (GIL
released) in submission order, runs the staging copy-outs and then completes
the operation's future with the output tensors (or a _Failure); futures are
completed on a small notifier pool, so a callback that issues and waits for
another collective cannot deadlock the completer. get_future() returns a child
future `parent.then(_unwrap)` that is in a real C++ error state for a failed
operation, which torch's C++ future waiters see.
"""
import concurrent.futures
import datetime
import queue
import threading

import torch
import torch._C._distributed_c10d as c10d

from hsdp import _hsdp
from hsdp.torch import profiling

_COMPAT_LOCK = threading.Lock()
# Operands of operations given up on while hsdpd may still use them (see _complete).
_ABANDONED = []


def completed_work(result=None):
    """A Work that is already complete with `result` (a list of tensors)."""
    fut = torch.futures.Future()
    fut.set_result(result if result is not None else [])
    return HsdpWork(fut, fut.then(_unwrap), "a completed operation")


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
        self.on_failure = None  # called (on the helper thread) with hsdpd's error of a failed op

    def set_timeout(self, timeout_s):
        """The bound on the waits for operations added from now on."""
        self._timeout = timeout_s

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
        self._q.put((raw_work, plan, fut, result, what, self._timeout))
        return HsdpWork(fut, child, what)

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

    def _complete(self, raw, plan, fut, result, what, timeout):
        try:
            raw.wait(timeout)
        except _hsdp.DeadlineExceeded as e:
            if "still pending after" in str(e):  # our wait's deadline: the op goes on
                plan.abandon()  # the daemon may still write the staging buffers
                # ... and zero-copy operands (pool leases among them): never freed either.
                _ABANDONED.append((getattr(plan, "hold", None), result))
                _deliver(fut, _Failure(timeout_error(what, timeout, e)))
            else:  # hsdpd failed the operation
                self._count(raw, True)
                plan.release()
                _deliver(fut, _Failure(timeout_error(what, None, e)))
            return
        except BaseException as e:  # noqa: B902 - every failure reaches the waiter
            self._count(raw, True)
            if self.on_failure is not None:
                self.on_failure(e)
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


def _seconds(timeout):
    if isinstance(timeout, datetime.timedelta):
        return timeout.total_seconds()
    return float(timeout)


class HsdpWork(c10d.Work):
    """The torch Work of one hsdpd operation.

    wait(timeout=None): blocks (GIL released) until the operation and its
    copy-outs are done, then raises the operation's own exception if it
    failed (a RuntimeError subclass naming the operation). A positive timeout
    bounds the wait: "Timed out waiting <ms>ms ..." RuntimeError, the operation
    goes on (C++ callers pass 0: no bound). get_future(): a torch Future with
    the output tensors, in error state for a failed operation.
    is_completed(), is_success(), exception() (the error or None), result()
    (the output tensors; raises before completion or for a failed operation).
    """

    def __init__(self, parent, child, what):
        super().__init__()
        self._parent = parent  # its value: the result list, or a _Failure
        self._child = child    # completes after the parent (and the profiler event)
        self._what = what

    def _error(self):
        if not self._parent.done():
            return None
        value = self._parent.value()
        return value.error if isinstance(value, _Failure) else None

    def wait(self, timeout=None):
        secs = 0.0 if timeout is None else _seconds(timeout)
        if secs > 0 and not self._child.done():
            done = threading.Event()
            self._child.add_done_callback(lambda _: done.set())
            if not done.wait(secs):
                raise RuntimeError(
                    f"hsdpd {self._what}: Timed out waiting {int(round(secs * 1000))}ms for "
                    "the operation to complete (Work.wait timeout; the operation goes on)")
        try:
            self._child.wait()
        except Exception:  # noqa: BLE001
            err = self._error()
            if err is not None:
                raise err from None  # the operation's own exception, not torch's wrapper
            raise
        return True

    def get_future(self):
        return self._child

    def is_completed(self):
        return self._child.done()

    def is_success(self):
        return self._child.done() and self._error() is None

    def exception(self):
        return self._error() if self._child.done() else None

    def result(self):
        if not self._child.done():
            raise RuntimeError(f"hsdpd {self._what}: Work.result(): the operation has not "
                               "completed; wait() first")
        err = self._error()
        if err is not None:
            raise err
        return self._child.value()

    def synchronize(self):
        pass

    def __repr__(self):
        state = "pending" if not self._child.done() else (
            "failed" if self._error() is not None else "done")
        return f"<HsdpWork {self._what}: {state}>"
