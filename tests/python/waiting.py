"""Waiting in the Python tests: poll an observable condition until it holds
or a deadline passes (tools/pylib/localproc.py, shared with the tools). The
one place the tests wait; a test never sleeps in place of a condition (a
sleep is only the poll interval there)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "pylib"))
from localproc import eventually, wait_until  # noqa: E402,F401
