#!/usr/bin/env python3
"""packaging.wheel: the pip wheel of python_client/ trains the demo from a fresh venv.

1. Builds the wheel with tools/scripts/build_wheel.sh (scikit-build-core and
   pybind11 from the project's wheel cache) into BUILD/wheel/dist, or takes
   the one there when it is newer than every file it is made from
   (tests/packaging/pkg_util.py the_wheel: packaging.deb_container tests the
   same wheel, and a build is a full compile each time).
2. Checks the wheel: its name and tag, hsdp/ and hsdp/_hsdp*.so, the entry
   points, and the extension's ABI (docs/packaging.md): what it links (no
   libtorch, no libpython), every library found, exports PyInit__hsdp only.
3. Makes a venv of /usr/bin/python3 without the build folder anywhere on its
   path and installs the wheel (hsdp[torch]) there, offline. torch: by default
   the venv reads the tested torch from the project's environment
   (build/venv) through a .pth line; --torch install installs it into the new
   venv from the wheel cache instead (1 min 45 s and 5.4 GB of disk more here).
4. In that venv: `import hsdp` and `import hsdp.torch` come from the venv's
   site-packages and register the "hsdpd" backend; with HSDP_DEFAULT_BACKEND=1
   torch's own autoload (the wheel's `torch.backends` entry point) maps the
   cpu default backend to "hsdpd" on `import torch` alone.
5. Starts build/bin/hsdpd and runs tools/demo/train_demo.py (2 ranks) through
   it: exit status 0, every step went through hsdpd, the loss finite and lower
   at the end; the daemon stops cleanly.
"""
import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "tools", "pylib"))
import localproc  # noqa: E402


def log(msg):
    print(f"wheel_test: {msg}", flush=True)


def fail(msg):
    print(f"wheel_test: FAILED: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def run(cmd, env=None, cwd=None, timeout=900, check=True):
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env, cwd=cwd, timeout=timeout, text=True,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    if check and p.returncode != 0:
        fail(f"{' '.join(map(str, cmd))} exited {p.returncode}:\n{p.stdout[-6000:]}")
    return p, time.monotonic() - t0


def clean_env(**extra):
    """The environment of everything run in the venv: no PYTHONPATH, no virtualenv."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP",
                        "HSDP_DEFAULT_BACKEND", "HSDP_REPLACE_GLOO",
                        "TORCH_DEVICE_BACKEND_AUTOLOAD")}
    env.update(extra)
    return env


def check_wheel(whl, version):
    name = os.path.basename(whl)
    want = f"hsdp-{version}-cp311-cp311-linux_x86_64.whl"
    if name != want:
        fail(f"wheel is {name}, expected {want}")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        eps = z.read(f"hsdp-{version}.dist-info/entry_points.txt").decode()
        meta = z.read(f"hsdp-{version}.dist-info/METADATA").decode()
    exts = [n for n in names if re.fullmatch(r"hsdp/_hsdp\.cpython-311-x86_64-linux-gnu\.so", n)]
    for need in ("hsdp/__init__.py", "hsdp/client.py", "hsdp/torch/__init__.py",
                 "hsdp/torch/backend.py", "hsdp_autoload.py"):
        if need not in names:
            fail(f"{need} missing from the wheel: {names}")
    if len(exts) != 1:
        fail(f"the wheel holds {len(exts)} extensions: {names}")
    # The package, its dist-info, and torch's plugin hook (a module of its own, so
    # that torch importing it imports no hsdp).
    stray = [n for n in names
             if not (n.startswith("hsdp/") or n.startswith("hsdp-") or n == "hsdp_autoload.py")]
    if stray:
        fail(f"files outside hsdp/ in the wheel: {stray}")
    for line in ("hsdprun = hsdp.run:main", "hsdpd = hsdp_autoload:autoload"):
        if line not in eps:
            fail(f"entry point {line!r} not declared:\n{eps}")
    if "Requires-Dist: torch>=2.7; extra == \"torch\"" not in meta:
        fail("the torch extra is not declared")
    if re.search(r"^Requires-Dist: torch", meta, re.M) and "extra ==" not in \
            re.search(r"^Requires-Dist: torch.*$", meta, re.M).group(0):
        fail("torch is a hard dependency")
    log(f"{name}: {len(names)} files, entry points and extras as declared")


def check_abi(so):
    needed = re.findall(r"\(NEEDED\).*\[(.+)\]", run(["readelf", "-d", so])[0].stdout)
    bad = [n for n in needed if re.match(r"lib(torch|c10|python)", n)]
    if bad:
        fail(f"the extension links {bad}")
    ldd = run(["ldd", so])[0].stdout
    if "not found" in ldd:
        fail(f"the extension's libraries are not all found:\n{ldd}")
    dyn = run(["objdump", "-T", so])[0].stdout
    # Defined dynamic symbols: PyInit__hsdp, and libstdc++'s vague-linkage
    # templates and typeinfo (namespace std is default-visibility in its
    # headers); nothing of the client, the protos, abseil or gRPC.
    defined = [l.split()[-1] for l in dyn.splitlines()
               if len(l.split()) >= 6 and "*UND*" not in l and re.match(r"^[0-9a-f]{16} ", l)]
    if "PyInit__hsdp" not in defined:
        fail("the extension does not export PyInit__hsdp")
    leaked = [n for n in defined if re.search(r"hsdp|absl|grpc|google|protobuf|upb", n)
              and n != "PyInit__hsdp"]
    if leaked:
        fail(f"the extension exports {len(leaked)} of its own symbols: {leaked[:10]}")
    glibc = sorted(set(re.findall(r"GLIBC_([0-9.]+)", dyn)),
                   key=lambda v: tuple(map(int, v.split("."))))
    log(f"extension links {' '.join(needed)}; exports PyInit__hsdp and no symbol of its own "
        f"libraries ({len(defined)} defined, std:: templates); newest glibc "
        f"symbol version GLIBC_{glibc[-1]}")


def venv_with_wheel(tmp, whl, cache, torch_mode, test_python, source):
    venv = os.path.join(tmp, "venv")
    run(["/usr/bin/python3", "-m", "venv", venv])
    py = os.path.join(venv, "bin", "python")
    site = run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])[0]
    site = site.stdout.strip()
    if torch_mode == "link":
        torch_dir = run([test_python, "-c",
                         "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))"])[0]
        with open(os.path.join(site, "hsdp_test_torch.pth"), "w") as f:
            f.write(torch_dir.stdout.strip() + "\n")
    else:
        _, dt = run([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", cache,
                     "-r", os.path.join(source, "python_client", "requirements-torch.txt")],
                    env=clean_env())
        log(f"torch installed into the venv from the wheel cache in {dt:.0f} s")
    _, dt = run([py, "-m", "pip", "install", "-q", "--no-index", "--find-links", cache,
                 f"{whl}[torch]"], env=clean_env())
    log(f"hsdp[torch] installed into {venv} in {dt:.1f} s (torch: {torch_mode})")
    return venv, py, site


CHECK = r"""
import importlib.metadata as md, json, os, sys
site, build = sys.argv[1], sys.argv[2]
import hsdp, hsdp._hsdp
import torch, torch.distributed as dist
import hsdp.torch
out = {
    "hsdp": hsdp.__file__, "ext": hsdp._hsdp.__file__, "torch": torch.__version__,
    "backend": "hsdpd" in dist.Backend.backend_list,
    # Every other hsdp on the path (the build folder's build/python above all).
    "other_hsdp": [p for p in sys.path if p and os.path.realpath(p) != os.path.realpath(site)
                   and (os.path.exists(os.path.join(p, "hsdp")) or
                        os.path.realpath(p).startswith(os.path.join(build, "python")))],
    "version": md.version("hsdp"),
    "torch_backends": sorted(f"{e.name} = {e.value}"
                             for e in md.entry_points(group="torch.backends")),
}
print(json.dumps(out))
"""

AUTOLOAD = r"""
import torch, torch.distributed as dist
print(dist.Backend.default_device_backend_map.get("cpu"))
"""


def check_imports(py, site, build, version, tmp):
    p, _ = run([py, "-c", CHECK, site, build], env=clean_env(), cwd=tmp)
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for key in ("hsdp", "ext"):
        if not got[key].startswith(site + os.sep):
            fail(f"{key} imported from {got[key]}, not from the venv ({site})")
    if got["other_hsdp"]:
        fail(f"another hsdp is on sys.path: {got['other_hsdp']}")
    if not got["backend"]:
        fail("import hsdp.torch did not register the backend \"hsdpd\"")
    if got["version"] != version:
        fail(f"installed hsdp {got['version']}, expected {version}")
    if "hsdpd = hsdp_autoload:autoload" not in got["torch_backends"]:
        fail(f"torch.backends entry points: {got['torch_backends']}")
    # torch's autoload of `torch.backends` entry points, with the opt-in set.
    p, _ = run([py, "-c", AUTOLOAD], env=clean_env(HSDP_DEFAULT_BACKEND="1"), cwd=tmp)
    if p.stdout.strip().splitlines()[-1] != "hsdpd":
        fail(f"HSDP_DEFAULT_BACKEND=1 + import torch: cpu default backend is "
             f"{p.stdout.strip()!r}, expected 'hsdpd'")
    log(f"import hsdp, hsdp.torch from {os.path.dirname(got['hsdp'])} (torch {got['torch']}): "
        f"\"hsdpd\" registered; torch's autoload maps cpu to hsdpd")


def start_daemon(build, tmp):
    sock = os.path.join(tmp, "hsdpd.sock")
    logf = open(os.path.join(tmp, "hsdpd.log"), "w")
    proc = subprocess.Popen([os.path.join(build, "bin", "hsdpd"), "--socket", sock],
                            stdout=logf, stderr=subprocess.STDOUT, preexec_fn=localproc.die_with_parent)
    # Waits on the condition (the socket accepts) or the daemon's exit.
    if not localproc.wait_for_socket(sock, proc, 30):
        proc.kill()
        fail(f"hsdpd did not start:\n{open(logf.name).read()[-3000:]}")
    return proc, sock, logf


def run_demo(py, source, sock, tmp, steps):
    demo = os.path.join(source, "tools", "demo", "train_demo.py")
    p, dt = run([py, demo, "--steps", str(steps), "--world", "2"],
                env=clean_env(HSDPD_SOCKET=sock), cwd=tmp, timeout=600, check=False)
    print(p.stdout, flush=True)
    if p.returncode != 0:
        fail(f"the demo exited {p.returncode}")
    steps_seen = re.findall(r"^step +(\d+) +loss (\S+) .*hsdpd: (\d+) ops", p.stdout, re.M)
    if len(steps_seen) != steps:
        fail(f"{len(steps_seen)} step lines, expected {steps}")
    if any(int(ops) == 0 for _, _, ops in steps_seen):
        fail("a step ran no operation through hsdpd")
    m = re.search(r"^loss (\S+) -> (\S+)$", p.stdout, re.M)
    if not m:
        fail("no 'loss a -> b' line")
    first, last = float(m.group(1)), float(m.group(2))
    losses = [float(l) for _, l, _ in steps_seen]
    if not all(math.isfinite(x) for x in losses) or not last < first:
        fail(f"the loss did not go down: {losses}")
    mode = re.search(r"^hsdpd demo: 2 ranks, ([^,]+),", p.stdout, re.M)
    log(f"demo ({mode.group(1) if mode else '?'}) trained through hsdpd in {dt:.1f} s: "
        f"loss {first:.4f} -> {last:.4f}, {sum(int(o) for _, _, o in steps_seen)} hsdpd ops")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--test-python", required=True,
                    help="the project's environment (its torch is the tested one)")
    ap.add_argument("--torch", choices=("link", "install"),
                    default=os.environ.get("HSDP_WHEEL_TEST_TORCH", "link"))
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--wheel", help="test this wheel instead of building one")
    args = ap.parse_args()
    source, build = os.path.abspath(args.source), os.path.abspath(args.build)
    cache = os.environ.get("HSDP_WHEEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "hsdpd", "wheels")
    with open(os.path.join(source, "CMakeLists.txt")) as f:
        version = re.search(r"project\(hsdpd\s+VERSION\s+([0-9.]+)", f.read()).group(1)
    tmp = tempfile.mkdtemp(prefix="hsdp-wheel-test-")
    try:
        if args.wheel:
            whl = os.path.abspath(args.wheel)
        else:
            sys.path.insert(0, os.path.join(source, "tests", "packaging"))
            from pkg_util import the_wheel
            whl, dt = the_wheel(source, build)
            log(f"wheel built in {dt:.0f} s" if dt else f"wheel of this checkout: {whl}")
        check_wheel(whl, version)
        venv, py, site = venv_with_wheel(tmp, whl, cache, args.torch, args.test_python, source)
        check_abi(os.path.join(site, "hsdp", "_hsdp.cpython-311-x86_64-linux-gnu.so"))
        check_imports(py, site, build, version, tmp)
        daemon, sock, logf = start_daemon(build, tmp)
        try:
            run_demo(py, source, sock, tmp, args.steps)
        finally:
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)
            try:
                rc = daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                fail("hsdpd did not stop on SIGTERM")
            logf.close()
        if rc != 0:
            fail(f"hsdpd exited {rc}:\n{open(logf.name).read()[-3000:]}")
        log("PASSED")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
