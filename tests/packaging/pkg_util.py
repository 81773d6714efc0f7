"""Helpers of the packaging tests (tests/packaging/): an install tree, a
daemon started from it, waits on conditions (never sleeps)."""
import glob
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "pylib"))
import localproc  # noqa: E402


def run(argv, timeout=600, env=None, cwd=None):
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env, cwd=cwd)
    if r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: exit {r.returncode}\n{r.stdout[-4000:]}")
    return r.stdout


def wait_until(cond, timeout, what, details=None):
    """Polls `cond` (10 ms apart) until it returns a true value; fails naming
    `what`, with `details()` (what to look at) when given."""
    return localproc.wait_until(
        cond, timeout, lambda: what + (f"\n{details()}" if details else ""), interval=0.01,
        error=AssertionError)


NODE_YAML = """node:
  socket: {socket}
engine:
  kind: cpu
  threads: 2
metrics:
  listen: ""
"""


class Daemon:
    """hsdpd from `prefix`/bin on a private socket; health-checked with hsdpctl."""

    def __init__(self, prefix, workdir):
        self.prefix = prefix
        self.socket = os.path.join(workdir, "hsdpd.sock")
        self.config = os.path.join(workdir, "node.yaml")
        with open(self.config, "w") as f:
            f.write(NODE_YAML.format(socket=self.socket))
        self.log = open(os.path.join(workdir, "hsdpd.log"), "w+")
        self.proc = subprocess.Popen([os.path.join(prefix, "bin", "hsdpd"), "--node-config",
                                      self.config], stdout=self.log, stderr=subprocess.STDOUT)
        wait_until(self.healthy, 30, "hsdpd to answer `hsdpctl health`")

    def hsdpctl(self, *args):
        return subprocess.run([os.path.join(self.prefix, "bin", "hsdpctl"), "--socket",
                               self.socket, *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=30)

    def healthy(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"hsdpd exited with {self.proc.returncode}:\n{self.logs()}")
        return self.hsdpctl("health").returncode == 0

    def logs(self):
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def install_tree(build, prefix):
    """`cmake --install build --prefix prefix`."""
    run(["cmake", "--install", build, "--prefix", prefix])


def build_trainer(src, prefix, out, static=False):
    """tests/packaging/trainer configured against the tree at `prefix`
    (CMAKE_PREFIX_PATH) and built in `out`; the trainer's path."""
    run(["cmake", "-S", os.path.join(src, "tests", "packaging", "trainer"), "-B", out, "-G",
         "Ninja", f"-DWITH_STATIC={'ON' if static else 'OFF'}", "-DCMAKE_BUILD_TYPE=Release",
         f"-DCMAKE_PREFIX_PATH={prefix}"])
    run(["cmake", "--build", out, "-j2"])
    return os.path.join(out, "trainer")


def build_deb(src, build, out, version=None):
    """tools/scripts/build_deb.sh: the path of the .deb."""
    argv = [os.path.join(src, "tools", "scripts", "build_deb.sh"), "--build-dir", build,
            "--out", out]
    if version:
        argv += ["--version", version]
    return run(argv, timeout=900).strip().splitlines()[-1]


def deb_field(deb, field):
    return run(["dpkg-deb", "-f", deb, field]).strip()


# What the wheel is made from (python_client/pyproject.toml: the project's
# CMake with HSDP_PYTHON_ONLY builds the client side only).
WHEEL_INPUTS = ("CMakeLists.txt", "client", "proto", "python_client", "tests/sanitizers",
                "tools/scripts/build_wheel.sh")


def _newest_input(src):
    newest = 0.0
    for top in WHEEL_INPUTS:
        path = os.path.join(src, top)
        if os.path.isfile(path):
            newest = max(newest, os.stat(path).st_mtime)
        for dirpath, dirnames, names in os.walk(path):
            dirnames[:] = [d for d in dirnames if d not in ("__pycache__", "build")]
            for n in names:
                newest = max(newest, os.stat(os.path.join(dirpath, n)).st_mtime)
    return newest


def the_wheel(src, build):
    """The Python client's wheel of this checkout, BUILD/wheel/dist/hsdp-*.whl,
    and how long building it took (0 when reused). Built with
    tools/scripts/build_wheel.sh unless the one there is newer than every file
    it is made from: packaging.wheel and packaging.deb_container both test it,
    and a build is a full compile every time (pip's build isolation gives each
    build a new temporary environment, so CMake's persistent folder is
    configured anew)."""
    dist = os.path.join(build, "wheel", "dist")
    found = sorted(glob.glob(os.path.join(dist, "hsdp-*.whl")))
    if len(found) == 1 and os.stat(found[0]).st_mtime > _newest_input(src):
        return found[0], 0.0
    start = time.monotonic()
    out = run(["bash", os.path.join(src, "tools", "scripts", "build_wheel.sh"), dist],
              env=dict(os.environ, HSDP_BUILD_DIR=build,
                       HSDP_WHEEL_BUILD_DIR=os.path.join(build, "wheel", "cmake")),
              timeout=1500)
    return out.strip().splitlines()[-1], time.monotonic() - start
