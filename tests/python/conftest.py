"""Fixtures: a real hsdpd per test session, and multi-process runners.

The build directory comes from $HSDP_BUILD_DIR, else <repo>/build; its
python/ directory is put on sys.path so `import hsdp` finds the build.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("HSDP_BUILD_DIR", os.path.join(REPO, "build")))
PYDIR = os.path.join(BUILD, "python")
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [PYDIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
sys.path.insert(0, os.path.dirname(__file__))


def _wait_for_socket(path, proc, timeout=20.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            return False
        if os.path.exists(path):
            s = socket.socket(socket.AF_UNIX)
            try:
                s.connect(path)
                return True
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    return False


class Daemon:
    def __init__(self, binary, tmpdir, extra_args=()):
        self.dir = tmpdir
        self.socket = os.path.join(tmpdir, "hsdpd.sock")
        self.log = os.path.join(tmpdir, "hsdpd.log")
        self._logf = open(self.log, "w")
        self.proc = subprocess.Popen([binary, "--socket", self.socket, *extra_args],
                                     stdout=self._logf, stderr=subprocess.STDOUT)
        if not _wait_for_socket(self.socket, self.proc):
            self.stop()
            raise RuntimeError(f"hsdpd did not start; log:\n{open(self.log).read()}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._logf.close()


@pytest.fixture(scope="session")
def hsdpd():
    binary = os.path.join(BUILD, "bin", "hsdpd")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} not found: build first (HSDP_BUILD_DIR={BUILD})")
    tmp = tempfile.mkdtemp(prefix="hsdp-py-")
    d = Daemon(binary, tmp)
    old = os.environ.get("HSDPD_SOCKET")
    os.environ["HSDPD_SOCKET"] = d.socket
    yield d
    if old is None:
        os.environ.pop("HSDPD_SOCKET", None)
    else:
        os.environ["HSDPD_SOCKET"] = old
    d.stop()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def run(hsdpd, tmp_path):
    """run(fn, world_size, *args, backend="hsdpd") -> list of per-rank return values."""
    import mp_runner

    def _run(fn, world_size, *args, backend="hsdpd", timeout=180):
        return mp_runner.launch(fn, world_size, args, backend, str(tmp_path), timeout)
    return _run
