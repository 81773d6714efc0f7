"""A private hsdpd for the benchmark scripts of tools/bench (stdlib only)."""
import contextlib
import os
import subprocess
import time


@contextlib.contextmanager
def running_hsdpd(bin_dir, sock, config=None, timeout_s=10.0):
    """hsdpd on socket `sock` (with `config`, a node.yaml path, when given),
    ready when the block starts and stopped when it ends."""
    argv = [os.path.join(bin_dir, "hsdpd"), "--socket", sock, "--log-level", "warning"]
    if config:
        argv += ["--node-config", config]
    daemon = subprocess.Popen(argv)
    try:
        end = time.monotonic() + timeout_s
        while not os.path.exists(sock):
            if time.monotonic() > end or daemon.poll() is not None:
                raise RuntimeError(f"hsdpd did not start on {sock}")
            time.sleep(0.05)
        yield daemon
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
