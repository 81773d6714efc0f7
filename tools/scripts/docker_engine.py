#!/usr/bin/python3
"""A Docker engine for the compose tests: use the running one, or start one.

    docker_engine.py start STATE_DIR   # exit 0: an engine answers (prints "started" or "running")
    docker_engine.py stop STATE_DIR    # stops the engine `start` started here, if any
    docker_engine.py probe             # exit 0 iff an engine answers now

`start` starts Debian's dockerd (package docker.io, tools/scripts/bootstrap.sh)
when no engine answers on /var/run/docker.sock, with the flags that work on
these machines and keep everything on the machine:

  --storage-driver=vfs      no overlayfs here: every layer and container is a copy
  --iptables=false          no NAT, no rules in the host's tables
  --ip-forward=false        the host routes nothing for containers
  --bridge=none             no default docker0 (its 172.17/16 is off limits)
  --default-address-pool    networks without a subnet get 198.19.x.0/24

The compose network is `internal` (no gateway route) on 198.18.77.0/24.
It records the dockerd it started in STATE_DIR (pid, log), so `stop` ends
that one and never an engine someone else runs. Needs root. Stdlib only.
"""
import os
import shutil
import signal
import subprocess
import sys
import time

SOCKET = "/var/run/docker.sock"
DOCKERD_FLAGS = ["--storage-driver=vfs", "--iptables=false", "--ip-forward=false",
                 "--ip-masq=false", "--bridge=none", "--userland-proxy=false",
                 "--default-address-pool", "base=198.19.0.0/16,size=24"]


class EngineError(RuntimeError):
    pass


SKIP = 77  # ctest's SKIP_RETURN_CODE of the Docker tests


def unavailable(why):
    """Ends a Docker test that cannot run here: skipped (exit 77) on a
    developer machine, a failure (exit 1) where HSDP_REQUIRE_DOCKER=1 (.ci/run)
    says Docker is required."""
    if os.environ.get("HSDP_REQUIRE_DOCKER") == "1":
        print(f"FAILED: HSDP_REQUIRE_DOCKER=1 and {why}")
        sys.exit(1)
    print(f"SKIP: {why}")
    sys.exit(SKIP)


def docker_cli():
    """Debian's docker client (docker.io), else whatever `docker` is on PATH."""
    return "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else (
        shutil.which("docker") or "docker")


def answers(timeout_s=10):
    """True when an engine answers on the default socket."""
    if not os.path.exists(SOCKET):
        return False
    try:
        r = subprocess.run([docker_cli(), "info", "--format", "{{.ServerVersion}}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _pid_file(state_dir):
    return os.path.join(state_dir, "dockerd.pid")


def _is_dockerd(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return os.path.basename(f.read().split(b"\0")[0]) == b"dockerd"
    except OSError:
        return False


def start(state_dir, timeout_s=90):
    """Returns "running" (someone's engine answers) or "started" (ours, now
    answering). Raises EngineError with the reason when none can run."""
    if answers():
        return "running"
    dockerd = "/usr/sbin/dockerd" if os.path.exists("/usr/sbin/dockerd") else shutil.which(
        "dockerd")
    if dockerd is None:
        raise EngineError("dockerd is not installed (tools/scripts/bootstrap.sh installs docker.io)")
    if os.geteuid() != 0:
        raise EngineError("no Docker engine answers and starting dockerd needs root")
    os.makedirs(state_dir, exist_ok=True)
    log = open(os.path.join(state_dir, "dockerd.log"), "ab")
    p = subprocess.Popen([dockerd, *DOCKERD_FLAGS, "--pidfile", _pid_file(state_dir) + ".d"],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True)  # outlives this process: `stop` ends it
    with open(_pid_file(state_dir), "w") as f:
        f.write(str(p.pid))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if p.poll() is not None:
            os.unlink(_pid_file(state_dir))
            raise EngineError(f"dockerd exited with {p.returncode}: "
                              f"{_tail(os.path.join(state_dir, 'dockerd.log'))}")
        if answers(5):
            return "started"
        time.sleep(0.5)
    stop(state_dir)
    raise EngineError(f"dockerd did not answer within {timeout_s} s: "
                      f"{_tail(os.path.join(state_dir, 'dockerd.log'))}")


def started_here(state_dir):
    """True while the dockerd that start() started with STATE_DIR runs."""
    try:
        with open(_pid_file(state_dir)) as f:
            return _is_dockerd(int(f.read().strip()))
    except (OSError, ValueError):
        return False


def stop(state_dir, timeout_s=30):
    """Stops the dockerd that start() started with this STATE_DIR; True if one ran."""
    try:
        with open(_pid_file(state_dir)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return False
    try:
        if not _is_dockerd(pid):
            return False
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and _is_dockerd(pid):
            time.sleep(0.2)
        if _is_dockerd(pid):
            os.kill(pid, signal.SIGKILL)
        return True
    finally:
        try:
            os.unlink(_pid_file(state_dir))
        except OSError:
            pass


def _tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def main(argv):
    if len(argv) >= 2 and argv[1] == "probe":
        return 0 if answers() else 1
    if len(argv) != 3 or argv[1] not in ("start", "stop"):
        print(__doc__, file=sys.stderr)
        return 2
    if argv[1] == "start":
        try:
            print(start(argv[2]))
        except EngineError as e:
            print(f"docker engine: {e}", file=sys.stderr)
            return 1
        return 0
    print("stopped" if stop(argv[2]) else "nothing to stop")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
