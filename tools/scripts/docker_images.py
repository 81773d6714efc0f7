#!/usr/bin/python3
"""Builds the hsdpd Docker images from a local build, with no registry.

    docker_images.py build [--build-dir build] [--tag latest]   # prints the images as JSON
    docker_images.py remove --tag TAG                            # the images of TAG
    docker_images.py bases                                       # only the cached base
    docker_images.py debian                                      # the clean Debian image

Two steps, the first cached per machine by a content hash:

1. hsdpd-base:<hash> -- `debootstrap --variant=minbase bookworm` with the
   packages of deploy/docker/base-packages.txt, from the mirror this machine's
   apt uses, then `docker import`. <hash> covers the package list and the
   recipe (build_base below): a change makes a new base, and nothing else does.
2. hsdpd:<tag> and hsdpd-trainer:<tag> -- deploy/Dockerfile: one layer on
   the base: this build's Debian package (tools/scripts/build_deb.sh,
   installed with dpkg, which refuses it when the base lacks a dependency
   the package declares) and, in the trainer, the Python package (build/python,
   stripped, until the wheel exists) and the demo.

`debian` builds (once per machine, cached like the base) hsdpd-debian:<hash>,
plain `debootstrap --variant=minbase bookworm` with nothing added: the clean
Debian the packaging tests install the .deb into (tests/packaging/deb_test.py).

torch is not in any image: the trainer containers mount the site-packages
of the project's environment read-only (torch_site below; the compose files
take it from $HSDP_TORCH_SITE, default ../build/venv/...).

Needs a running engine (docker_engine.py start), root for debootstrap, and a
build (tools/scripts/build.sh). Stdlib only.
"""
import argparse
import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from docker_engine import docker_cli  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCKER_DIR = os.path.join(ROOT, "deploy", "docker")
SUITE = "bookworm"
CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                         "hsdpd")
# The files of the image, as deploy/Dockerfile's COPY and RUN lines name them.
BINARIES = ["hsdpd", "hsdpctl", "hsdp-bench"]
DEB = "build/packages/hsdpd.deb"
DEMO = ["tools/demo/train_demo.py", "tools/demo/transformer.py"]
LABEL = "org.hsdpd.image"


class ImageError(RuntimeError):
    pass


def log(msg):
    print(f"docker_images: {msg}", file=sys.stderr, flush=True)


def docker(*args, timeout=1800, check=True, capture=True):
    # BuildKit: the legacy builder makes a container and a full (vfs) copy of
    # the filesystem for every instruction, ENV and ENTRYPOINT included
    # (4m40s against 26 s for the trainer image here).
    env = dict(os.environ, DOCKER_BUILDKIT="1")
    r = subprocess.run([docker_cli(), *args], stdout=subprocess.PIPE if capture else None,
                       stderr=subprocess.STDOUT if capture else None, text=True,
                       timeout=timeout, env=env)
    if check and r.returncode != 0:
        raise ImageError(f"docker {' '.join(args[:3])} ...: exit {r.returncode}\n"
                         f"{(r.stdout or '')[-4000:]}")
    return r


def image_exists(ref):
    return docker("image", "inspect", ref, check=False).returncode == 0


def image_size(ref):
    """Bytes of the image (its layers, as `docker images` counts them)."""
    return int(docker("image", "inspect", "-f", "{{.Size}}", ref).stdout.strip())


@contextlib.contextmanager
def _machine_lock():
    """One image build per machine at a time (they share the bases)."""
    path = os.path.join(CACHE_DIR, "docker-images.lock")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _read_packages():
    with open(os.path.join(DOCKER_DIR, "base-packages.txt")) as f:
        return [w for line in f for w in line.split("#")[0].split()]


def _apt_mirror():
    """The Debian mirror this machine's apt uses (deb.debian.org by default)."""
    for path in ("/etc/apt/sources.list.d/debian.sources", "/etc/apt/sources.list"):
        try:
            with open(path) as f:
                for line in f:
                    w = line.split()
                    if w[:1] == ["URIs:"] and len(w) > 1 and "security" not in w[1]:
                        return w[1]
                    if w[:1] == ["deb"] and len(w) > 2 and "security" not in w[-2]:
                        return next(x for x in w[1:] if "://" in x)
        except (OSError, StopIteration):
            continue
    return "http://deb.debian.org/debian"


def build_base(tag, packages):
    """debootstrap minbase + `packages` into a folder, then `docker import`."""
    if shutil.which("debootstrap") is None:
        raise ImageError("debootstrap is not installed (tools/scripts/bootstrap.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="hsdpd-base-") as tmp:
        root = os.path.join(tmp, "root")
        r = subprocess.run(["debootstrap", "--variant=minbase", "--include=" + ",".join(packages),
                            SUITE, root, _apt_mirror()],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=1200)
        if r.returncode != 0:
            raise ImageError(f"debootstrap failed:\n{r.stdout[-3000:]}")
        for d in ("var/cache/apt/archives", "var/lib/apt/lists", "var/log"):
            for name in os.listdir(os.path.join(root, d)):
                p = os.path.join(root, d, name)
                if os.path.isfile(p) or os.path.islink(p):
                    os.unlink(p)
        tar = subprocess.Popen(["tar", "-C", root, "--numeric-owner", "-c", "."],
                               stdout=subprocess.PIPE)
        r = subprocess.run([docker_cli(), "import", "--change", "ENV LANG=C.UTF-8",
                            "--change", f"LABEL {LABEL}=base", "-", tag], stdin=tar.stdout,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=600)
        tar.stdout.close()
        if tar.wait() != 0 or r.returncode != 0:
            raise ImageError(f"docker import failed: {r.stdout[-2000:]}")


def base_image():
    """hsdpd-base:<hash>, built now when this machine lacks it."""
    packages = _read_packages()
    h = hashlib.sha256()
    h.update("\n".join(packages).encode())
    h.update(SUITE.encode())
    h.update(inspect.getsource(build_base).encode())
    tag = f"hsdpd-base:{h.hexdigest()[:16]}"
    if not image_exists(tag):
        log(f"building {tag} (debootstrap {SUITE} minbase; once per machine)")
        build_base(tag, packages)
    return tag


def debian_image():
    """hsdpd-debian:<hash>: debootstrap minbase of SUITE, nothing added (a
    clean Debian for the packaging tests), built now when this machine lacks it."""
    h = hashlib.sha256()
    h.update(SUITE.encode())
    h.update(inspect.getsource(build_base).encode())
    tag = f"hsdpd-debian:{h.hexdigest()[:16]}"
    if not image_exists(tag):
        log(f"building {tag} (debootstrap {SUITE} minbase, nothing added; once per machine)")
        build_base(tag, ["apt"])  # apt is minbase's own: nothing is added
    return tag


def torch_site(build_dir):
    """The site-packages with torch that the trainer containers mount read-only
    at /usr/local/lib/python3.11/dist-packages: $HSDP_TORCH_SITE, else the
    project's environment BUILD/venv (tools/scripts/python_env.sh), whose
    interpreter is Debian bookworm's python3.11, the image's own.

    torch stays out of the images: with the vfs storage driver every image
    layer and every container is a full copy of its filesystem, and a
    trainer image with torch is 3.4 GB per container (four trainers filled
    a CI machine's disk). A read-only bind mount costs no copy."""
    site = os.environ.get("HSDP_TORCH_SITE")
    if not site:
        lib = os.path.join(build_dir, "venv", "lib")
        found = sorted(os.path.join(lib, d, "site-packages") for d in
                       (os.listdir(lib) if os.path.isdir(lib) else []) if d.startswith("python3"))
        site = found[0] if found else os.path.join(lib, "python3.11", "site-packages")
    site = os.path.abspath(site)
    if not os.path.isdir(os.path.join(site, "torch")):
        raise ImageError(f"{site} has no torch: make the project's environment first "
                         f"(tools/scripts/python_env.sh) or set HSDP_TORCH_SITE")
    return site


TORCH_MOUNT = "/usr/local/lib/python3.11/dist-packages"


def _foreign_libraries(files):
    """Shared libraries `files` link (ldd) that no Debian package owns."""
    libs = set()
    for f in files:
        r = subprocess.run(["ldd", f], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=60)
        for line in r.stdout.splitlines():
            if "not found" in line:
                raise ImageError(f"{f}: {line.strip()}")
            parts = line.split("=>")
            if len(parts) == 2 and parts[1].strip().startswith("/"):
                libs.add(parts[1].split()[0])
    # The files of every installed package (dpkg's lists; `dpkg -S` per file
    # is seconds each on a busy machine). A package names a file under the
    # path it installed (/lib or /usr/lib, the link or its target).
    owned = set()
    info = "/var/lib/dpkg/info"
    for name in os.listdir(info):
        if name.endswith(".list"):
            with open(os.path.join(info, name), errors="replace") as f:
                owned.update(line.rstrip("\n") for line in f if ".so" in line)
    owned |= {os.path.realpath(p) for p in owned}
    return sorted(lib for lib in libs
                  if lib not in owned and os.path.realpath(lib) not in owned)


def stage_context(build_dir, ctx):
    """The build context of deploy/Dockerfile: the checkout's paths, with
    build/packages/hsdpd.deb made from `build_dir` (tools/scripts/build_deb.sh)."""
    if os.path.exists(ctx):
        shutil.rmtree(ctx)
    bins = [os.path.join(build_dir, "bin", b) for b in BINARIES]
    ext = [os.path.join(dp, f) for dp, _, fs in os.walk(os.path.join(build_dir, "python"))
           for f in fs if f.endswith(".so")]
    for p in bins:
        if not os.path.isfile(p):
            raise ImageError(f"{p} is missing: build first (tools/scripts/build.sh)")
    # Every library is a Debian package's: the package's dependencies are
    # computed from them (dpkg-shlibdeps), the base must hold them.
    foreign = _foreign_libraries(bins + ext)
    if foreign:
        raise ImageError(f"linked from outside Debian's packages: {', '.join(foreign)}")
    pkg_dir = os.path.join(ctx, os.path.dirname(DEB))
    r = subprocess.run([os.path.join(ROOT, "tools", "scripts", "build_deb.sh"), "--build-dir",
                        build_dir, "--out", os.path.join(ctx, "cpack")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if r.returncode != 0:
        raise ImageError(f"build_deb.sh failed:\n{r.stdout[-3000:]}")
    os.makedirs(pkg_dir)
    os.rename(r.stdout.strip().splitlines()[-1], os.path.join(ctx, DEB))
    shutil.rmtree(os.path.join(ctx, "cpack"))
    shutil.copytree(os.path.join(build_dir, "python"), os.path.join(ctx, "build", "python"),
                    symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for p in DEMO:
        os.makedirs(os.path.join(ctx, os.path.dirname(p)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, p), os.path.join(ctx, p))
    to_strip = [os.path.join(ctx, "build", "python",
                             os.path.relpath(e, os.path.join(build_dir, "python"))) for e in ext]
    if to_strip:
        subprocess.run(["strip", "--strip-debug", *to_strip], check=True, timeout=300)


def build(build_dir, tag):
    """Builds (bases when missing) and returns {"hsdpd": ref, "trainer": ref, ...}."""
    site = torch_site(build_dir)
    with _machine_lock():
        base = base_image()
    ctx = os.path.join(build_dir, "docker", "context")
    stage_context(build_dir, ctx)
    dockerfile = os.path.join(ROOT, "deploy", "Dockerfile")
    refs = {"hsdpd": f"hsdpd:{tag}", "trainer": f"hsdpd-trainer:{tag}"}
    for target, ref in (("hsdpd", refs["hsdpd"]), ("hsdpd-trainer", refs["trainer"])):
        log(f"building {ref}")
        docker("build", "--network", "host", "-q", "--target", target,
               "--build-arg", f"BASE_IMAGE={base}",
               "--label", f"{LABEL}={tag}", "-f", dockerfile, "-t", ref, ctx)
    # Every library the daemon and the extension link resolves in the image.
    for ref, files in ((refs["hsdpd"], "/usr/bin/hsdpd /usr/bin/hsdpctl /usr/bin/hsdp-bench"),
                       (refs["trainer"], "/usr/bin/hsdpd /opt/hsdp/python/hsdp/_hsdp*.so")):
        r = docker("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", ref,
                   "-c", f"ldd {files}", timeout=300)
        if "not found" in r.stdout:
            raise ImageError(f"{ref} lacks libraries:\n{r.stdout}")
    # The trainer image's python imports torch from the mounted site and the
    # client from the image (the extension was built for this interpreter).
    r = docker("run", "--rm", "--network", "none", "-v", f"{site}:{TORCH_MOUNT}:ro",
               "--entrypoint", "python3", refs["trainer"], "-c",
               "import torch, torch.distributed, hsdp.torch; print('torch', torch.__version__)",
               timeout=300, check=False)
    if r.returncode != 0:
        raise ImageError(f"{refs['trainer']} with {site} at {TORCH_MOUNT} cannot import "
                         f"torch and hsdp.torch:\n{r.stdout[-3000:]}")
    return dict(refs, base=base, torch_site=site,
                sizes={k: image_size(v) for k, v in
                       (("base", base), ("hsdpd", refs["hsdpd"]), ("trainer", refs["trainer"]))})


def remove(tag):
    """Removes the images of `tag` (never the bases); the names removed."""
    gone = []
    for repo in ("hsdpd-trainer", "hsdpd"):
        if docker("rmi", "-f", f"{repo}:{tag}", check=False).returncode == 0:
            gone.append(f"{repo}:{tag}")
    return gone


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("build", "remove", "bases", "debian"))
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--tag", default="latest")
    args = ap.parse_args()
    try:
        if args.command == "build":
            print(json.dumps(build(os.path.abspath(args.build_dir), args.tag), indent=1))
        elif args.command == "debian":
            with _machine_lock():
                print(json.dumps({"debian": debian_image()}))
        elif args.command == "bases":
            with _machine_lock():
                print(json.dumps({"base": base_image()}))
        else:
            print(json.dumps(remove(args.tag)))
    except (ImageError, subprocess.TimeoutExpired) as e:
        print(f"docker_images: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
