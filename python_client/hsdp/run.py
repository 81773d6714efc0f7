"""hsdprun: torchrun with hsdpd as torch's default backend in the workers.

    hsdprun --nproc-per-node 4 train.py ...        # the console script (the wheel)
    python -m hsdp.run --nproc-per-node 4 train.py ...

Takes exactly torchrun's arguments (torch.distributed.run: single node,
--nnodes with c10d rendezvous, --max-restarts, ...) and runs torchrun with
them, after setting, for the workers it starts:
- HSDP_DEFAULT_BACKEND=1 (kept when already set to a device list such as
  "cpu,cuda"; see hsdp.torch.autoload),
- PYTHONPATH with hsdp/_boot first (its sitecustomize.py makes
  hsdp.torch.autoload run as soon as a worker imports torch), and the
  directory holding this hsdp package last when it is not on the path yet.
So a training script that lets torch pick the backend (init_process_group()
with no backend, Backend.default_device_backend_map["cpu"], a device mesh)
runs over hsdpd with no change. HSDP_REPLACE_GLOO=1 in hsdprun's environment
also serves groups named "gloo" with hsdpd (docs/torch-defaults.md). The
workers need a reachable hsdpd ($HSDPD_SOCKET or the default socket).
"""
import os
import sys

import hsdp

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(hsdp.__file__)), "_boot")
PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(hsdp.__file__)))


def worker_environment(env=None):
    """The environment hsdprun gives torchrun (and so its workers): a new dict."""
    env = dict(os.environ if env is None else env)
    value = env.get("HSDP_DEFAULT_BACKEND", "").strip()
    if value in ("", "0"):
        env["HSDP_DEFAULT_BACKEND"] = "1"
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    parts = [BOOT_DIR] + [p for p in parts if os.path.abspath(p) != BOOT_DIR]
    if not any(os.path.abspath(p) == PACKAGE_PARENT for p in parts) and \
            not _importable_without(PACKAGE_PARENT):
        parts.append(PACKAGE_PARENT)
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def _importable_without(directory):
    """True if `hsdp` is found on this interpreter's default path (site-packages) anyway."""
    import site
    paths = set(site.getsitepackages() + [site.getusersitepackages()])
    return os.path.abspath(directory) in {os.path.abspath(p) for p in paths}


def main(argv=None):
    """hsdprun's entry point: torchrun's main() with the workers' environment set."""
    from hsdp.torch import autoload
    autoload.requested_devices(os.environ.get("HSDP_DEFAULT_BACKEND", "1") or "1")  # checked
    os.environ.update(worker_environment())
    from torch.distributed.run import main as torchrun_main
    return torchrun_main(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    main()
