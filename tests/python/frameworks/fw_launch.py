"""Launching a training script the way a user does, over Gloo (plain torchrun) or over hsdpd
(`python -m hsdp.run`, the same arguments), against one daemon; used by the framework tests
and tools/bench/frameworks_bench.py."""
import json
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
# torchrun's report of a job whose first failure was a worker killed by a signal (the
# "Root Cause" block's "exitcode  : -6 (pid: ...)"; its siblings' SIGTERM does not count).
SIGNAL_DEATH = re.compile(r"Root Cause \(first observed failure\):[^=]*?exitcode\s*:\s*-\d+ \(pid")
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def launch(args, nproc, backend, socket, build, env=None, timeout=600, log=None):
    """Runs `torchrun --standalone --nproc-per-node N <args>` (backend "gloo") or
    `python -m hsdp.run ...` (backend "hsdpd") with this interpreter; returns the combined
    output; raises AssertionError with its tail on failure."""
    launcher = ["-m", "hsdp.run"] if backend == "hsdpd" else ["-m", "torch.distributed.run"]
    full_env = dict(os.environ)
    full_env.pop("HSDP_DEFAULT_BACKEND", None)
    full_env.pop("HSDP_REPLACE_GLOO", None)
    paths = [os.path.join(build, "python"), HERE]
    full_env["PYTHONPATH"] = os.pathsep.join(
        paths + [p for p in full_env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths])
    full_env["HSDPD_SOCKET"] = socket
    full_env.update(env or {})
    cmd = [sys.executable, *launcher, "--standalone", f"--nproc-per-node={nproc}", *args]
    r = subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=timeout)
    if backend == "gloo" and r.returncode != 0 and SIGNAL_DEATH.search(r.stdout):
        # The reference, not the system under test: a Gloo worker that died of a signal
        # (seen once in CI: "terminate called without an active exception", SIGABRT, in
        # Accelerate's plain-Gloo run) is run once more, and said so.
        print(f"fw_launch: the Gloo reference run died of a signal; running it again:\n"
              f"{r.stdout[-1500:]}", file=sys.stderr)
        r = subprocess.run(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
    if log:
        with open(log, "w") as f:
            f.write(r.stdout)
    if r.returncode != 0:
        raise AssertionError(f"{backend} run failed ({r.returncode}): {' '.join(cmd)}\n"
                             f"{r.stdout[-6000:]}")
    return r.stdout


def daemon_ops(build, socket):
    """The daemon's completed-operation count (ops above its small-op arena)."""
    r = subprocess.run([os.path.join(build, "bin", "hsdpctl"), "--socket", socket, "--json",
                        "status"], capture_output=True, text=True, timeout=30)
    return int(json.loads(r.stdout)["ops_completed"])


def daemon_class():
    """tests/python/conftest.py's Daemon (loaded under its own name: this directory has a
    conftest.py of its own)."""
    import importlib.util
    name = "hsdp_python_tests_conftest"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(REPO, "tests", "python", "conftest.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name].Daemon, sys.modules[name].BUILD
