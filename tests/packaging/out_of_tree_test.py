#!/usr/bin/python3
"""The installed tree serves a C++ trainer built outside this project.

    out_of_tree_test.py SRC BUILD

1. `cmake --install BUILD --prefix TMP/usr`: the files are exactly the
   shipped ones (bin/hsdpd, hsdpctl, hsdp-bench; the client library shared
   and static; the public headers; the CMake package; hsdp.pc; the unit with
   TMP's paths; etc/hsdpd/node.yaml) and nothing else.
2. tests/packaging/trainer configured with CMAKE_PREFIX_PATH=TMP/usr
   (find_package(hsdp CONFIG REQUIRED), hsdp::client and
   hsdp::client_static), built, run against TMP/usr/bin/hsdpd: 2 ranks,
   every all-reduce checked.
3. The same main.cc compiled with `pkg-config --cflags --libs hsdp` (the
   .pc found through PKG_CONFIG_PATH, its prefix relative to it), run.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pkg_util import Daemon, build_trainer, install_tree, run  # noqa: E402

SRC = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else os.getcwd()
BUILD = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else os.path.join(SRC, "build")
TRAINER_SRC = os.path.join(SRC, "tests", "packaging", "trainer")

EXPECTED = {
    "bin/hsdpd", "bin/hsdpctl", "bin/hsdp-bench",
    "etc/hsdpd/node.yaml", "lib/systemd/system/hsdpd.service",
    "include/hsdp/client.h", "include/hsdp/stragglers.h", "include/hsdp/types.h",
    "include/hsdp/work.h",
    "lib/libhsdp_client.a", "lib/libhsdp_client.so", "lib/libhsdp_client.so.0.2",
    "lib/libhsdp_client.so.0.2.0",
    "lib/cmake/hsdp/hsdpConfig.cmake", "lib/cmake/hsdp/hsdpConfigVersion.cmake",
    "lib/cmake/hsdp/hsdpTargets.cmake", "lib/pkgconfig/hsdp.pc",
}


class OutOfTree(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="hsdp-oot-")
        cls.prefix = os.path.join(cls.tmp, "usr")
        install_tree(BUILD, cls.prefix)
        cls.daemon = Daemon(cls.prefix, cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_trainer(self, exe, job):
        out = run([exe, "--socket", self.daemon.socket, "--job", job, "--ranks", "2",
                   "--steps", "40"], timeout=120)
        self.assertIn("trainer: OK steps 40", out)

    def test_the_install_tree_is_the_shipped_files(self):
        files = set()
        for dp, _, fs in os.walk(self.prefix):
            for f in fs:
                files.add(os.path.relpath(os.path.join(dp, f), self.prefix))
        # The per-configuration targets file (hsdpTargets-<config>.cmake).
        files = {f for f in files if not f.startswith("lib/cmake/hsdp/hsdpTargets-")}
        self.assertEqual(files, EXPECTED)
        with open(os.path.join(self.prefix, "lib/systemd/system/hsdpd.service")) as f:
            unit = f.read()
        self.assertIn(f"ExecStart={self.prefix}/bin/hsdpd --node-config "
                      f"{self.prefix}/etc/hsdpd/node.yaml", unit)
        # The shared library has a SONAME and exports only hsdp:: symbols.
        dyn = run(["objdump", "-p", os.path.join(self.prefix, "lib/libhsdp_client.so")])
        self.assertIn("SONAME               libhsdp_client.so.0.2", dyn)
        syms = run(["nm", "-D", "-C", "--defined-only",
                    os.path.join(self.prefix, "lib/libhsdp_client.so.0.2.0")]).splitlines()
        foreign = [s for s in syms if "hsdp::" not in s]
        self.assertEqual(foreign, [], "symbols outside hsdp:: exported")

    def test_a_cmake_project_finds_the_package_and_trains(self):
        build = os.path.join(self.tmp, "cmake-trainer")
        build_trainer(SRC, self.prefix, build, static=True)
        needed = run(["objdump", "-p", os.path.join(build, "trainer")])
        self.assertIn("libhsdp_client.so.0.2", needed)
        self.run_trainer(os.path.join(build, "trainer"), "oot-cmake")
        static = run(["objdump", "-p", os.path.join(build, "trainer_static")])
        self.assertNotIn("libhsdp_client", static)
        self.run_trainer(os.path.join(build, "trainer_static"), "oot-cmake-static")

    def test_pkg_config_builds_the_trainer(self):
        env = dict(os.environ, PKG_CONFIG_PATH=os.path.join(self.prefix, "lib", "pkgconfig"))
        flags = run(["pkg-config", "--cflags", "--libs", "hsdp"], env=env).split()
        libdir = run(["pkg-config", "--variable=libdir", "hsdp"], env=env).strip()
        self.assertEqual(os.path.realpath(libdir), os.path.join(self.prefix, "lib"))
        exe = os.path.join(self.tmp, "pc-trainer")
        run(["c++", "-std=c++20", "-O1", os.path.join(TRAINER_SRC, "main.cc"), "-o", exe,
             *flags, f"-Wl,-rpath,{libdir}"], env=env)
        self.run_trainer(exe, "oot-pkg-config")


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
