"""Waiting in the Python tests: poll an observable condition until it holds
or a deadline passes. The one place the tests wait; a test never sleeps in
place of a condition (a sleep is only the poll interval here)."""
import time


def eventually(pred, timeout, interval=0.05):
    """pred()'s first truthy value within `timeout` seconds (checked once more
    at the deadline), else its last value (falsy)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval)


def wait_until(pred, timeout, what, interval=0.05):
    """Like eventually(), but raises TimeoutError naming `what` (a string, or a
    callable giving one, e.g. the daemons' logs) when pred never held."""
    value = eventually(pred, timeout, interval)
    if not value:
        raise TimeoutError(f"after {timeout} s: {what() if callable(what) else what}")
    return value
