#!/usr/bin/python3
"""The Debian package (tools/scripts/build_deb.sh, docs/packaging.md).

    deb_test.py deps      SRC BUILD   # the package's dependencies vs the lists
    deb_test.py container SRC BUILD   # install / start / upgrade / purge on Docker

deps (no engine): the .deb's Depends (computed by dpkg-shlibdeps) name exactly
  the runtime libraries of deploy/docker/base-packages.txt (the image base),
  every other one being part of Debian's minbase (what apt and dpkg depend
  on); each comes from a Debian source whose development package
  tools/scripts/bootstrap.sh installs; the unit, node.yaml (a conffile) and
  the maintainer scripts are in it.
container: in a clean Debian container (debootstrap minbase, nothing added;
  docker_images.py debian) the previous package (same files, version
  <v>~prev1) installs with apt, its dependencies resolved from the mirror
  this machine's apt uses (downloaded by a first container on the host
  network; the test's container has no network); nothing is enabled;
  `hsdpd --node-config /etc/hsdpd/node.yaml` (under a supervisor loop that
  starts it again once /usr/bin/hsdpd was replaced) serves `hsdpctl status`;
  a 2-rank C++ trainer (tests/packaging/trainer, linked to the packaged
  libhsdp_client.so) trains; `apt-get install` of the current package drains
  the old daemon (prerm), the new one starts, the trainer reconnects and
  goes on training with every result right; then the Python client: the
  wheel (tools/scripts/build_wheel.sh) installs with pip into a clean venv
  of the container's python3 (the wheel packaging.wheel built, or built
  here: pkg_util.the_wheel; python3-venv from the mirror, nothing else;
  torch, the tested 2.15.0, comes from the project's environment mounted
  read-only where the trainer images mount it: PyPI's torch is a 3 GB CUDA
  build, which the vfs storage driver would copy into the container), and
  the demo (tools/demo/train_demo.py, FSDP2, 2 ranks) trains through the
  packaged daemon; purge removes /etc/hsdpd and every file of the package.
Exit 77 (skipped) where no engine can run (not root, no dockerd); with
HSDP_REQUIRE_DOCKER=1 (.ci/run) a failure instead. Every wait is on a
condition, bounded.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

CMD = sys.argv[1] if len(sys.argv) > 1 else ""
SRC = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.getcwd()
BUILD = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else os.path.join(SRC, "build")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "tools", "scripts"))
from pkg_util import (build_deb, build_trainer, deb_field, install_tree, run,  # noqa: E402
                      the_wheel, wait_until)
from docker_engine import unavailable  # noqa: E402


def depends_names(deb):
    """Package names of the .deb's Depends (alternatives flattened)."""
    names = set()
    for dep in deb_field(deb, "Depends").split(","):
        for alt in dep.split("|"):
            if alt.strip():
                names.add(alt.split()[0].split(":")[0])
    return names


def minbase_closure():
    """apt, dpkg and everything they depend on (Depends, Pre-Depends), as
    this machine's dpkg database says: packages every minbase has."""
    table = {}
    out = run(["dpkg-query", "-W", "-f=${Package}\t${Depends}, ${Pre-Depends}\n"])
    for line in out.splitlines():
        name, _, deps = line.partition("\t")
        table[name] = {a.split()[0].split(":")[0] for d in deps.split(",") for a in d.split("|")
                       if a.strip()}
    seen, todo = set(), ["apt", "dpkg", "base-files", "bash", "coreutils"]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo += sorted(table.get(p, ()))
    return seen


def base_packages():
    with open(os.path.join(SRC, "deploy", "docker", "base-packages.txt")) as f:
        return {w for line in f for w in line.split("#")[0].split()}


class Deps(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hsdp-deb-")
        cls.deb = build_deb(SRC, BUILD, cls.tmp)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_name_and_the_contents(self):
        version = deb_field(self.deb, "Version")
        self.assertEqual(os.path.basename(self.deb), f"hsdpd_{version}_amd64.deb")
        files = run(["dpkg-deb", "-c", self.deb])
        for f in ("./usr/bin/hsdpd", "./usr/bin/hsdpctl", "./usr/bin/hsdp-bench",
                  "./etc/hsdpd/node.yaml", "./lib/systemd/system/hsdpd.service",
                  "./usr/lib/libhsdp_client.so.0.2.0", "./usr/lib/libhsdp_client.a",
                  "./usr/include/hsdp/client.h", "./usr/lib/cmake/hsdp/hsdpConfig.cmake",
                  "./usr/lib/pkgconfig/hsdp.pc"):
            self.assertIn(f, files)
        ctrl = os.path.join(self.tmp, "ctrl")
        run(["dpkg-deb", "-e", self.deb, ctrl])
        with open(os.path.join(ctrl, "conffiles")) as f:
            self.assertEqual(f.read().split(), ["/etc/hsdpd/node.yaml"])
        with open(os.path.join(ctrl, "prerm")) as f:
            self.assertIn("hsdpctl --socket \"$SOCKET\" drain", f.read())
        with open(os.path.join(ctrl, "postinst")) as f:
            self.assertNotIn("enable", f.read().replace("# ", "").split("set -e")[1])
        unit = run(["sh", "-c", f"dpkg-deb --fsys-tarfile {self.deb} | "
                               "tar -xO ./lib/systemd/system/hsdpd.service"])
        self.assertIn("ExecStart=/usr/bin/hsdpd --node-config /etc/hsdpd/node.yaml", unit)

    def test_dependencies_match_the_image_base(self):
        deps = depends_names(self.deb)
        base = base_packages()
        self.assertFalse(any("nccl" in d or "cuda" in d for d in deps), deps)
        # minbase's own packages (libc6, libstdc++6, libgcc-s1: what apt and
        # dpkg depend on, as installed here) need no listing.
        required = minbase_closure() & deps
        self.assertEqual(deps - base - required, set(),
                         "computed dependencies missing from deploy/docker/base-packages.txt")
        libs = {p for p in base if p.startswith("lib")}
        self.assertEqual(libs - deps, set(),
                         "base-packages.txt names libraries the package does not depend on")

    def test_bootstrap_installs_what_the_package_build_needs(self):
        with open(os.path.join(SRC, "tools", "scripts", "bootstrap.sh")) as f:
            text = f.read()
        listed = text.split("PACKAGES=(", 1)[1].split("\n)", 1)[0]
        packages = {w for line in listed.splitlines() for w in line.split("#")[0].split()}
        self.assertIn("dpkg-dev", packages)
        self.assertFalse([p for p in packages if "boost" in p])
        # Every runtime library the package depends on is built against the
        # development package of the same Debian source that bootstrap
        # installs (libabsl20220623 <- libabsl-dev, libgrpc29 <- libgrpc++-dev).
        def source(pkgs):
            out = run(["dpkg-query", "-W", "-f=${Package} ${source:Package}\n", *pkgs])
            return dict(line.split() for line in out.splitlines())
        deps = depends_names(self.deb) - minbase_closure()
        dev_sources = set(source(sorted(p for p in packages if p.endswith("-dev"))).values())
        missing = {d: src for d, src in source(sorted(deps)).items() if src not in dev_sources}
        self.assertEqual(missing, {}, "bootstrap.sh installs no development package of these")


# --- the container test ------------------------------------------------------
SUPERVISOR = ("while [ ! -e /stop ]; do ino=$(stat -c %i /usr/bin/hsdpd); "
              "/usr/bin/hsdpd --node-config /etc/hsdpd/node.yaml >>/var/log/hsdpd.log 2>&1; "
              "echo exit $? >>/var/log/hsdpd.log; "
              "while [ ! -e /stop ] && [ \"$(stat -c %i /usr/bin/hsdpd 2>/dev/null)\" = \"$ino\" ];"
              " do sleep 0.1; done; done")


# The pids of hsdpd processes (minbase has no procps).
PIDS = "grep -lx hsdpd /proc/[0-9]*/comm 2>/dev/null | cut -d/ -f3 | sort"


class Container(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import docker_engine
        import docker_images
        cls.docker_engine = docker_engine
        cls.tmp = tempfile.mkdtemp(prefix="hsdp-debc-")
        cls.state = os.path.join(BUILD, "docker", "packaging")
        try:
            docker_engine.start(cls.state)
        except docker_engine.EngineError as e:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            unavailable(str(e))
        cls.docker = docker_engine.docker_cli()
        cls.name = f"hsdpdeb{os.getpid()}"
        with docker_images._machine_lock():
            cls.image = docker_images.debian_image()
        debs = os.path.join(cls.tmp, "debs")
        version = deb_field(build_deb(SRC, BUILD, debs), "Version")
        cls.new_deb = f"hsdpd_{version}_amd64.deb"
        cls.old_version = f"{version}~prev1"
        cls.old_deb = os.path.basename(build_deb(SRC, BUILD, debs, cls.old_version))
        # The trainer, linked to libhsdp_client.so of an install tree; in the
        # container it runs with the package's /usr/lib/libhsdp_client.so.0.2.
        prefix = os.path.join(cls.tmp, "usr")
        install_tree(BUILD, prefix)
        trainer = build_trainer(SRC, prefix, os.path.join(cls.tmp, "trainer-build"))
        os.makedirs(os.path.join(cls.tmp, "t"))
        shutil.copy2(trainer, os.path.join(cls.tmp, "t", "trainer"))
        shutil.rmtree(prefix)
        apt = [f"{os.path.join(cls.tmp, 'lists')}:/var/lib/apt/lists",
               f"{os.path.join(cls.tmp, 'archives')}:/var/cache/apt/archives"]
        # The Python client's wheel (a persistent CMake folder, shared with
        # packaging.wheel: one compile), the demo, and torch's site-packages.
        wheel, _ = the_wheel(SRC, BUILD)
        wheels = os.path.join(cls.tmp, "wheel")
        os.makedirs(wheels)
        shutil.copy2(wheel, wheels)
        cls.wheel = os.path.basename(wheel)
        cls.mounts = ["-v", f"{debs}:/debs:ro", "-v", f"{cls.tmp}/t:/t:ro",
                      "-v", f"{wheels}:/wheel:ro",
                      "-v", f"{os.path.join(SRC, 'tools', 'demo')}:/demo:ro",
                      "-v", f"{docker_images.torch_site(BUILD)}:{docker_images.TORCH_MOUNT}:ro"]
        for m in apt:
            os.makedirs(m.split(":")[0], exist_ok=True)
            cls.mounts += ["-v", m]
        # The dependencies, from the mirror (host network), into the shared
        # apt lists and archives; the test's container has no network.
        cls.dk("run", "--rm", "--network", "host", *cls.mounts, cls.image, "sh", "-c",
               f"apt-get update -qq && apt-get install -qq -y --download-only /debs/{cls.new_deb} "
               "python3-venv",
               timeout=900)
        cls.dk("run", "-d", "--name", cls.name, "--network", "none", *cls.mounts, cls.image,
               "sleep", "infinity")

    @classmethod
    def tearDownClass(cls):
        subprocess.run([cls.docker, "rm", "-f", cls.name], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)
        cls.docker_engine.stop(cls.state)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def dk(cls, *args, timeout=300, check=True):
        r = subprocess.run([cls.docker, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"docker {' '.join(args[:4])}: exit {r.returncode}\n"
                                 f"{r.stdout[-4000:]}")
        return r

    def sh(self, script, check=True, timeout=300):
        return self.dk("exec", self.name, "sh", "-c", script, check=check, timeout=timeout)

    def status(self):
        r = self.sh("hsdpctl --json status", check=False, timeout=30)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def trainer_log(self):
        return self.sh("cat /tmp/trainer.log 2>/dev/null || true").stdout

    def test_install_start_upgrade_purge(self):
        # Install: dependencies resolved by apt (offline: what the first
        # container downloaded), nothing enabled or started.
        out = self.sh(f"apt-get install -y /debs/{self.old_deb}",
                      timeout=600).stdout
        self.assertEqual(self.sh("dpkg-query -W -f='${Version}' hsdpd").stdout,
                         self.old_version)
        self.assertIn("/etc/hsdpd/node.yaml",
                      self.sh("dpkg-query -W -f='${Conffiles}' hsdpd").stdout)
        self.assertEqual(self.sh("ls /etc/systemd/system/multi-user.target.wants/ "
                                 "2>/dev/null | grep -c hsdpd || true").stdout.strip(), "0")
        self.assertEqual(self.sh(PIDS).stdout.strip(), "", out)
        # Start as the unit does (no systemd in the container).
        self.dk("exec", "-d", self.name, "sh", "-c", SUPERVISOR)
        first = wait_until(self.status, 60, "`hsdpctl status` to answer")
        self.assertIn("version", json.dumps(first))
        pid1 = self.sh(PIDS).stdout.split()
        # A job: 2 ranks, every result checked, running until /tmp/stop.
        self.dk("exec", "-d", self.name, "sh", "-c",
                "/t/trainer --socket /run/hsdpd/hsdpd.sock --job upgrade --ranks 2 "
                "--until /tmp/stop >/tmp/trainer.log 2>&1; echo $? >/tmp/trainer.rc")
        wait_until(lambda: "progress 100 " in self.trainer_log(), 60, "the job to train")
        # Upgrade under the job: prerm drains the old daemon.
        out = self.sh(f"apt-get install -y /debs/{self.new_deb}",
                      timeout=600).stdout
        self.assertIn("draining the running daemon", out)
        self.assertEqual(self.sh("dpkg-query -W -f='${Version}' hsdpd").stdout,
                         deb_field(os.path.join(self.tmp, "debs", self.new_deb), "Version"))
        wait_until(self.status, 60, "the new daemon to answer `hsdpctl status`")
        self.assertNotEqual(self.sh(PIDS).stdout.split(), pid1)
        self.assertIn("exit 0", self.sh("cat /var/log/hsdpd.log").stdout,
                      "the drained daemon did not exit 0")
        # The job reconnected and trains on the new daemon.
        wait_until(lambda: any(line.startswith("progress") and not line.endswith(" 0")
                               for line in self.trainer_log().splitlines()), 120,
                   "the job to train after reconnecting",
                   lambda: f"trainer:\n{self.trainer_log()[-1500:]}\nhsdpd:\n"
                           f"{self.sh('cat /var/log/hsdpd.log').stdout[-3000:]}")
        self.sh("touch /tmp/stop")
        wait_until(lambda: self.sh("cat /tmp/trainer.rc 2>/dev/null || true").stdout.strip(),
                   120, "the trainer to finish")
        self.assertEqual(self.sh("cat /tmp/trainer.rc").stdout.strip(), "0", self.trainer_log())
        self.assertIn("trainer: OK", self.trainer_log())
        self.wheel_trains_the_demo()
        # Purge: the running daemon is drained, every file goes.
        self.sh("touch /stop")
        self.sh("apt-get purge -y hsdpd", timeout=600)
        wait_until(lambda: self.sh(PIDS).stdout.strip() == "", 60,
                   "hsdpd to stop")
        left = self.sh("ls -d /etc/hsdpd /usr/bin/hsdpd /usr/bin/hsdpctl /usr/lib/libhsdp_client* "
                       "/lib/systemd/system/hsdpd.service /usr/include/hsdp "
                       "/usr/lib/cmake/hsdp /usr/lib/pkgconfig/hsdp.pc 2>/dev/null || true")
        self.assertEqual(left.stdout.strip(), "")
        self.assertNotIn("ii", self.sh("dpkg -l hsdpd 2>/dev/null | tail -n 1 || true").stdout)

    def wheel_trains_the_demo(self):
        """The wheel in a clean venv; the demo through the packaged daemon."""
        self.sh("apt-get install -y python3-venv", timeout=600)
        self.assertEqual(self.sh("ls /opt/venv 2>/dev/null || true").stdout.strip(), "")
        # --system-site-packages: the mounted torch (and its numpy) is the
        # system's; everything of hsdp comes from the wheel, offline.
        self.sh("python3 -m venv --system-site-packages /opt/venv && "
                f"/opt/venv/bin/pip install -q --no-index /wheel/{self.wheel}", timeout=600)
        where = self.sh("cd / && /opt/venv/bin/python -c "
                        "'import hsdp, hsdp.torch, torch; print(hsdp.__file__, torch.__version__)'"
                        ).stdout.split()
        self.assertTrue(where[0].startswith("/opt/venv/lib/python3.11/site-packages/hsdp/"),
                        where)
        self.assertEqual(self.sh("test -x /opt/venv/bin/hsdprun && echo yes").stdout.strip(),
                         "yes")
        r = self.sh("cd / && HSDPD_SOCKET=/run/hsdpd/hsdpd.sock /opt/venv/bin/python "
                    "/demo/train_demo.py --mode fsdp2 --world 2 --steps 6", check=False,
                    timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout[-4000:])
        self.assertIn("FSDP2 fully_shard", r.stdout)
        self.assertIn("loss ", r.stdout)


if __name__ == "__main__":
    cls = {"deps": Deps, "container": Container}.get(CMD)
    if cls is None:
        print(__doc__)
        sys.exit(2)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    ok = unittest.TextTestRunner(verbosity=2).run(suite).wasSuccessful()
    sys.exit(0 if ok else 1)
