#!/usr/bin/env python3
"""Collects a CUDA build into a bundle a GPU machine can carry (docs/gpu.md).

Called by gpu_bundle.sh after the build (or on an existing build with
--no-build). The GPU machine has CUDA, NCCL (pip's nvidia-nccl-cu13), Python
3.12 with torch and pybind11, a compiler and CMake, and none of gRPC,
protobuf, abseil, yaml-cpp, Gloo, prometheus-cpp; what it runs travels in
the working tree (64 MiB in all). The bundle:

  bin/      hsdpd, hsdpctl, hsdp-gpu-bench, hsdp-gpu-probe, hsdp-overlap-probe (stripped)
  tests/    every ctest entry labelled `gpu` (selected from ctest, not a
            fixed list) and the helpers they spawn (*_peer), stripped
  lib/      the shared libraries `ldd` names that the GPU machine lacks,
            under their SONAME (not glibc, libstdc++, libgcc, CUDA, NCCL)
  pykit/    what builds the Python extension there against its Python:
            the binding sources, every non-system header they include
            (abseil, protobuf, gRPC headers too), the project's static
            libraries, link.txt (the link inputs in order), build_ext.sh
  MANIFEST  one line per file: its kind, path, bytes; tests with stage
            (core: unit tests, daemon: integration tests)

--check DIR verifies an existing bundle: every MANIFEST file present, the
size inside the limit, no library `ldd` cannot find besides the ones the
GPU machine provides. Exit status non-zero on any failure.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

# Present on the GPU machine (system, driver, CUDA toolkit, pip's NCCL).
PROVIDED = re.compile(
    r"^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|librt\.|libpthread\.|libutil\.|"
    r"libstdc\+\+\.|libgcc_s\.|libcuda\.|libnvidia|libcudart\.|libnccl\.|libz\.so)")
BINARIES = ["hsdpd", "hsdpctl", "hsdp-gpu-bench", "hsdp-gpu-probe", "hsdp-overlap-probe"]
SYSTEM_HEADER_ROOTS = ("/usr/include/", "/usr/local/include/")
CARRIED_HEADER_TOPS = ("absl", "google", "grpc", "grpcpp", "grpc++", "re2", "upb")


def log(*a):
    print("gpu_bundle:", *a, file=sys.stderr)


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def gpu_tests(build):
    """(name, executable, labels) of every ctest entry labelled gpu."""
    out = run(["ctest", "--test-dir", build, "-N", "-L", "gpu", "--show-only=json-v1"])
    tests = []
    for t in json.loads(out).get("tests", []):
        labels = []
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels = p.get("value", [])
        cmd = t.get("command") or []
        if cmd:
            tests.append((t["name"], cmd[0], labels))
    return tests


def ldd(path):
    """{soname: resolved path or None (not found)}."""
    libs = {}
    try:
        out = run(["ldd", path])
    except subprocess.CalledProcessError:
        return libs  # static, or not an ELF executable
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(not found|\S+)", line)
        if m:
            libs[m.group(1)] = None if m.group(2) == "not found" else m.group(2)
    return libs


def copy_stripped(src, dst, strip=True):
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    shutil.copy2(src, dst)
    if strip and shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", dst], check=False,
                       capture_output=True)


def soname(path):
    try:
        out = run(["objdump", "-p", path])
    except (subprocess.CalledProcessError, FileNotFoundError):
        return os.path.basename(path)
    m = re.search(r"SONAME\s+(\S+)", out)
    return m.group(1) if m else os.path.basename(path)


def ninja_commands(build, target):
    return run(["ninja", "-C", build, "-t", "commands", target]).splitlines()


def python_kit(build, root, out, manifest):
    """Sources, headers, static libraries and the link list of hsdp._hsdp."""
    try:
        cmds = ninja_commands(build, "hsdp_python_ext")
    except (subprocess.CalledProcessError, FileNotFoundError) as e:
        raise SystemExit("gpu_bundle: the build has no hsdp_python_ext target (%s)" % e)
    kit = os.path.join(out, "pykit")
    compile_lines = [c for c in cmds if " -c " in c and "python_client/src/" in c]
    link_line = [c for c in cmds if "_hsdp" in c and " -shared" in c][-1]
    sources, includes, defines = [], [], set()
    headers = set()
    for line in compile_lines:
        args = line.split()
        if args and args[0].endswith("ccache"):
            args = args[1:]
        src = args[args.index("-c") + 1]
        sources.append(src)
        for a in args:
            if a.startswith("-I"):
                includes.append(os.path.normpath(os.path.join(build, a[2:])))
            elif a == "-isystem":
                pass
            elif a.startswith("-D"):
                defines.add(a)
        isys = [os.path.normpath(os.path.join(build, args[i + 1]))
                for i, a in enumerate(args) if a == "-isystem"]
        includes.extend(isys)
        dep_args, skip = [], False
        for a in args:
            if skip:
                skip = False
                continue
            if a in ("-o", "-c", "-MF", "-MT", "-MQ"):
                skip = True
                continue
            if a in ("-MD", "-MMD"):
                continue
            dep_args.append(a)
        deps = subprocess.run(dep_args + ["-M", src], cwd=build, capture_output=True,
                              text=True)
        if deps.returncode != 0:
            raise SystemExit("gpu_bundle: listing the headers of %s failed:\n%s"
                             % (src, deps.stderr[-2000:]))
        for tok in deps.stdout.replace("\\\n", " ").split():
            if tok.endswith(".h") or tok.endswith(".hpp") or tok.endswith(".inc"):
                headers.add(os.path.normpath(os.path.join(build, tok)))
    include_roots = sorted(set(includes), key=len, reverse=True)
    source_dirs = {os.path.dirname(os.path.normpath(os.path.join(build, src))) for src in sources}
    carried = 0
    for h in sorted(headers):
        if os.path.dirname(h) in source_dirs:  # "errors.h" next to errors.cc
            dst = os.path.join(kit, "src", os.path.basename(h))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(h, dst)
            continue
        rel = None
        for r in include_roots:
            if h.startswith(r.rstrip("/") + "/") and not r.startswith(SYSTEM_HEADER_ROOTS):
                rel = os.path.relpath(h, r)
                break
        if rel is None:
            for r in SYSTEM_HEADER_ROOTS:
                if h.startswith(r) and h[len(r):].split("/")[0] in CARRIED_HEADER_TOPS:
                    rel = h[len(r):]
        if rel is None or rel.split("/")[0] in ("pybind11",) or rel.startswith("python3"):
            continue  # libc, libstdc++, Python, pybind11: the GPU machine's own
        dst = os.path.join(kit, "include", rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(h, dst)
        carried += os.path.getsize(dst)
    for src in sources:
        dst = os.path.join(kit, "src", os.path.basename(src))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(os.path.join(build, src) if not os.path.isabs(src) else src, dst)
    manifest.append(("kit", "pykit/include", carried))
    # Link inputs, in order: the project's static libraries (carried), the
    # shared ones (carried in lib/ under their SONAME), -l of glibc's.
    link = []
    for a in link_line.split():
        if a.endswith(".a"):
            p = os.path.normpath(os.path.join(build, a))
            dst = os.path.join(kit, "lib", os.path.basename(p))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(p, dst)
            subprocess.run(["strip", "--strip-debug", dst], check=False, capture_output=True)
            link.append("static " + os.path.basename(p))
            manifest.append(("kit", "pykit/lib/" + os.path.basename(p), os.path.getsize(dst)))
        elif ".so" in a and a.startswith("/"):
            real = os.path.realpath(a)
            name = soname(real)
            if PROVIDED.match(name):
                link.append("system -l:" + name)
            else:
                link.append("shared " + name)
                yield_lib(real, name, out, manifest)
        elif a.startswith("-l"):
            name = a[2:]
            if name in ("dl", "m", "rt", "pthread"):
                link.append("system -l" + name)
            else:
                path = run(["gcc", "-print-file-name=lib%s.so" % name]).strip()
                real = os.path.realpath(path)
                sname = soname(real)
                link.append("shared " + sname)
                yield_lib(real, sname, out, manifest)
    with open(os.path.join(kit, "link.txt"), "w") as f:
        f.write("\n".join(link) + "\n")
    with open(os.path.join(kit, "defines.txt"), "w") as f:
        f.write("\n".join(sorted(defines)) + "\n")
    shutil.copy2(os.path.join(root, "tools", "scripts", "gpu_build_ext.sh"),
                 os.path.join(kit, "build_ext.sh"))


def yield_lib(real, name, out, manifest):
    dst = os.path.join(out, "lib", name)
    if os.path.exists(dst):
        return
    copy_stripped(real, dst)
    manifest.append(("lib", "lib/" + name, os.path.getsize(dst)))
    # What that library needs in turn.
    for dep, path in ldd(real).items():
        if path and not PROVIDED.match(dep):
            yield_lib(os.path.realpath(path), dep, out, manifest)


def collect(args):
    build = os.path.abspath(args.build_dir)
    out = os.path.abspath(args.out)
    root = os.path.abspath(args.root)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    manifest = []
    missing = []
    for b in BINARIES:
        p = os.path.join(build, "bin", b)
        if not os.path.exists(p):
            missing.append("bin/" + b)
            continue
        copy_stripped(p, os.path.join(out, "bin", b))
        manifest.append(("bin", "bin/" + b, os.path.getsize(os.path.join(out, "bin", b))))
    tests = gpu_tests(build)
    if not tests:
        missing.append("ctest entries labelled gpu (is the build configured with CUDA?)")
    seen = set()
    for name, exe, labels in tests:  # one entry per test case: one copy per binary
        if exe in seen:
            continue
        seen.add(exe)
        if not os.path.exists(exe):
            missing.append("tests/" + os.path.basename(exe))
            continue
        dst = os.path.join(out, "tests", os.path.basename(exe))
        copy_stripped(exe, dst)
        stage = "daemon" if any("integration" in l for l in labels) else "core"
        manifest.append(("test:" + stage, "tests/" + os.path.basename(exe), os.path.getsize(dst)))
    tdir = os.path.join(build, "tests")
    for f in sorted(os.listdir(tdir)) if os.path.isdir(tdir) else []:
        if f.endswith("_peer"):
            copy_stripped(os.path.join(tdir, f), os.path.join(out, "tests", f))
            manifest.append(("helper", "tests/" + f, os.path.getsize(os.path.join(out, "tests", f))))
    for kind, rel, _ in list(manifest):
        for dep, path in ldd(os.path.join(out, rel)).items():
            if PROVIDED.match(dep):
                continue
            if path is None:
                missing.append("library %s of %s (ldd: not found here)" % (dep, rel))
                continue
            yield_lib(os.path.realpath(path), dep, out, manifest)
    if not args.no_python:
        python_kit(build, root, out, manifest)
    with open(os.path.join(out, "MANIFEST"), "w") as f:
        for kind, rel, size in manifest:
            f.write("%s %s %d\n" % (kind, rel, size))
    if missing:
        for m in missing:
            log("MISSING", m)
        return 1
    return check(out, args.limit_mib)


def du(path):
    total = 0
    for d, _, files in os.walk(path):
        for f in files:
            p = os.path.join(d, f)
            if not os.path.islink(p):
                total += os.path.getsize(p)
    return total


def check(out, limit_mib):
    bad = []
    man = os.path.join(out, "MANIFEST")
    if not os.path.exists(man):
        log("no MANIFEST in", out)
        return 1
    kinds = set()
    with open(man) as f:
        for line in f:
            kind, rel, _ = line.split()
            kinds.add(kind.split(":")[0])
            if not os.path.exists(os.path.join(out, rel)):
                bad.append("missing " + rel)
    for need in ("bin", "test", "lib"):
        if need not in kinds:
            bad.append("no %s entry in MANIFEST" % need)
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.join(out, "lib"))
    for sub in ("bin", "tests"):
        d = os.path.join(out, sub)
        for f in sorted(os.listdir(d)) if os.path.isdir(d) else []:
            res = subprocess.run(["ldd", os.path.join(d, f)], capture_output=True, text=True,
                                 env=env)
            for line in res.stdout.splitlines():
                m = re.match(r"\s*(\S+)\s+=>\s+not found", line)
                if m and not PROVIDED.match(m.group(1)):
                    bad.append("%s/%s needs %s, which is not in lib/" % (sub, f, m.group(1)))
    size = du(out)
    limit = limit_mib << 20
    print("bundle %s: %.1f MiB of %d MiB allowed" % (out, size / 1048576.0, limit_mib))
    if size > limit:
        bad.append("bundle is %d bytes, over the %d MiB limit" % (size, limit_mib))
    for b in bad:
        log("CHECK FAILED:", b)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", default="build-gpu")
    ap.add_argument("--out", default="gpu-bundle")
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--limit-mib", type=int, default=56,
                    help="what the bundle may take of the 64 MiB a call carries (the work "
                         "tree travels too)")
    ap.add_argument("--no-python", action="store_true", help="no Python extension kit")
    ap.add_argument("--check", action="store_true", help="only check an existing bundle")
    args = ap.parse_args()
    if args.check:
        return check(os.path.abspath(args.out), args.limit_mib)
    return collect(args)


if __name__ == "__main__":
    sys.exit(main())
