"""Local processes and waits, shared by the Python tests (tests/python,
tests/packaging) and the tools that start daemons (tools/chaos,
tools/torch_suite): free loopback ports, waiting on a condition (never a
sleep in place of one), a Unix socket that accepts, and stopping a child.

Standard library only: any interpreter of the project can import it
(`sys.path.insert(0, "<repo>/tools/pylib")`).
"""
import signal
import socket
import subprocess
import time


def free_ports(n):
    """n distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    socks, ports = [], []
    try:
        for _ in range(n):  # held open together, so the kernel hands out distinct ports
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def eventually(pred, timeout, interval=0.05):
    """pred()'s first truthy value within `timeout` seconds (checked once more
    at the deadline), else its last value (falsy)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_until(pred, timeout, what, interval=0.05, error=TimeoutError):
    """Like eventually(), but raises `error` naming `what` (a string, or a
    callable giving one, e.g. the daemons' logs) when pred never held."""
    value = eventually(pred, timeout, interval)
    if not value:
        raise error(f"after {timeout} s: {what() if callable(what) else what}")
    return value


def accepts(path):
    """A Unix socket at `path` accepts a connection now."""
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def wait_for_socket(path, proc, timeout=20.0):
    """True once `path` accepts connections; False if `proc` exited first or
    on timeout."""
    return bool(eventually(lambda: proc.poll() is not None or accepts(path), timeout)) and \
        proc.poll() is None


def die_with_parent():
    """For preexec_fn: the child gets SIGKILL when its parent dies (a killed
    test run leaves no daemon behind)."""
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def stop(proc, grace_s=10):
    """SIGTERM, then SIGKILL after `grace_s`; returns the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
