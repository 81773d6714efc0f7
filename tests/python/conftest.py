"""Fixtures: a real hsdpd per test session, a cluster of hsdpd on loopback,
and multi-process runners.

The build directory comes from $HSDP_BUILD_DIR, else <repo>/build; its
python/ directory is put on sys.path so `import hsdp` finds the build.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.abspath(os.environ.get("HSDP_BUILD_DIR", os.path.join(REPO, "build")))
PYDIR = os.path.join(BUILD, "python")
if PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [PYDIR] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(REPO, "tools", "pylib"))
import localproc  # noqa: E402

_wait_for_socket = localproc.wait_for_socket
_die_with_parent = localproc.die_with_parent  # a killed test run leaves no daemon


class Daemon:
    def __init__(self, binary, tmpdir, extra_args=(), wait=True):
        self.dir = tmpdir
        self.socket = os.path.join(tmpdir, "hsdpd.sock")
        self.log = os.path.join(tmpdir, "hsdpd.log")
        self._logf = open(self.log, "w")
        self.proc = subprocess.Popen([binary, "--socket", self.socket, *extra_args],
                                     stdout=self._logf, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        if wait:
            self.wait_ready()

    def wait_ready(self, timeout=20.0):
        if not _wait_for_socket(self.socket, self.proc, timeout):
            self.stop()
            raise RuntimeError(f"hsdpd did not start; log:\n{self.log_text()}")

    def log_text(self, tail=None):
        with open(self.log, errors="replace") as f:
            text = f.read()
        return text if tail is None else text[-tail:]

    def stop(self):
        localproc.stop(self.proc)
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


def _cluster_fixture(nodes):
    def fixture():
        from cluster_util import Cluster
        try:
            c = Cluster(nodes)
        except RuntimeError as e:
            # The free ports are picked before the daemons bind them: another process on
            # this machine may take one meanwhile. Only that is retried, once.
            if "cannot listen on" not in str(e):
                raise
            c = Cluster(nodes)
        try:
            yield c
        finally:
            c.stop()
    return fixture


# Clusters of real daemons on loopback, one per test module that uses them
# (a test that needs to break a node starts its own cluster_util.Cluster).
cluster2 = pytest.fixture(scope="module")(_cluster_fixture(2))
cluster3 = pytest.fixture(scope="module")(_cluster_fixture(3))


@pytest.fixture
def cluster_run(tmp_path):
    """cluster_run(cluster, fn, placement, *args, backend="hsdpd", expect=None,
    pg_timeout=None) -> per-rank results: rank r runs on node placement[r]
    (its HSDPD_SOCKET); world size = len(placement). Failures carry the
    daemons' logs."""
    import mp_runner

    def _run(cluster, fn, placement, *args, backend="hsdpd", expect=None, pg_timeout=None,
             timeout=240):
        try:
            return mp_runner.launch(fn, len(placement), args, backend, str(tmp_path), timeout,
                                    env=cluster.env_for(placement), expect=expect,
                                    pg_timeout=pg_timeout)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{cluster.logs()}") from None
    return _run
