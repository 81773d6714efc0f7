"""Runs tests of torch's distributed_test.py in this process, like upstream's
test/distributed/test_distributed_spawn.py: one fresh process group per test,
`world_size` spawned ranks, init_process_group(BACKEND, init_method="file://...").

Configured by the environment only, because the spawned ranks re-import this
module (multiprocessing "spawn" runs it as __mp_main__) and must set up the
same test class and backend registration:

  BACKEND            gloo | hsdpd (hsdpd: `import hsdp.torch` registers it)
  WORLD_SIZE         ranks per test
  HSDP_SUITE_LIFT_GATES=1
                     evaluate torch's skip decorators as if BACKEND were "gloo"
                     (the tests' bodies still run on BACKEND)
  HSDP_SUITE_START_METHOD=spawn|fork
                     how the ranks start: "spawn" as upstream's spawn driver
                     (each rank imports torch afresh), "fork" from this process
                     (several times faster; upstream's former fork driver)
  DISTRIBUTED_TESTS_DEFAULT_TIMEOUT
                     seconds before MultiProcessTestCase kills a test's ranks

Usage (run_suite.py drives this):
  suite_worker.py --list
  suite_worker.py --results FILE TEST [TEST ...]

Each finished test appends one JSON line to FILE:
  {"test": name, "result": "pass|fail|skip|timeout", "seconds": s, "detail": text}
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_HERE, "_stubs"))  # expecttest stand-in
_ARGS = sys.argv[1:]
del sys.argv[1:]  # common_utils parses sys.argv at import

BACKEND = os.environ["BACKEND"]
LIFT_GATES = os.environ.get("HSDP_SUITE_LIFT_GATES") == "1"
BUILTIN = ("gloo", "nccl", "mpi", "ucc")
START_METHOD = os.environ.get("HSDP_SUITE_START_METHOD", "spawn")

import torch  # noqa: E402

if BACKEND == "hsdpd":
    import hsdp.torch  # noqa: F401,E402 - registers the "hsdpd" backend

from torch.testing._internal import common_distributed  # noqa: E402

if BACKEND not in BUILTIN:
    # What a third-party backend is expected to do: declare itself a plugin.
    common_distributed.DistTestCases.backend_feature["plugin"].add(BACKEND)

if LIFT_GATES:
    # The decorators read the module-level BACKEND at import: import as "gloo",
    # then point the module (the tests' bodies and init_process_group) at BACKEND.
    os.environ["BACKEND"] = "gloo"
try:
    from torch.testing._internal.distributed import distributed_test as dt  # noqa: E402
finally:
    os.environ["BACKEND"] = BACKEND
dt.BACKEND = BACKEND
if LIFT_GATES and BACKEND not in BUILTIN:
    # Gates inside test bodies that name the backends whose profiler events
    # are checked (dist.get_backend() in PROFILING_SUPPORTED_BACKENDS).
    for name in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                 "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
        getattr(dt, name).append(BACKEND)

if LIFT_GATES and BACKEND not in BUILTIN:
    # _test_accumulate_gradients_no_sync builds its CPU model only when the
    # module's BACKEND reads "gloo" or "mpi" (a gate inside the body, with no
    # other use of the name): run it as for Gloo; the process group is the
    # BACKEND's, created before.
    _base = dt.DistributedTest._DistTestBase
    _orig_no_sync = _base._test_accumulate_gradients_no_sync

    def _no_sync_as_gloo(self, *args, **kwargs):
        dt.BACKEND = "gloo"
        try:
            return _orig_no_sync(self, *args, **kwargs)
        finally:
            dt.BACKEND = BACKEND
    _base._test_accumulate_gradients_no_sync = _no_sync_as_gloo


class TestDistBackendWithSpawn(dt.TestDistBackend, dt.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if START_METHOD == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()


def _test_names():
    import unittest
    return list(unittest.TestLoader().getTestCaseNames(TestDistBackendWithSpawn))


def _classify(result, test):
    import unittest  # noqa: F401
    for t, why in result.skipped:
        if t is test:
            return "skip", str(why)
    for kind in (result.errors, result.failures):
        for t, tb in kind:
            if t is test:
                return "fail", tb[-6000:]
    for t, tb in result.expectedFailures:
        if t is test:
            return "pass", "expected failure"
    for t in result.unexpectedSuccesses:
        if t is test:
            return "fail", "unexpected success"
    return "pass", ""


def _run(names, results_path):
    import json
    import time
    import unittest
    for name in names:
        test = TestDistBackendWithSpawn(name)
        result = unittest.TestResult()
        start = time.time()
        test.run(result)
        outcome, detail = _classify(result, test)
        elapsed = time.time() - start
        if outcome == "fail" and "timed out after" in detail and \
                elapsed >= 0.95 * common_distributed.TIMEOUT_DEFAULT:
            outcome = "timeout"  # MultiProcessTestCase killed the ranks
        rec = {"test": name, "result": outcome, "seconds": round(elapsed, 2),
               "detail": detail}
        with open(results_path, "a") as f:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    if _ARGS and _ARGS[0] == "--list":
        print("\n".join(_test_names()))
    elif len(_ARGS) >= 2 and _ARGS[0] == "--results":
        _run(_ARGS[2:], _ARGS[1])
    else:
        sys.exit("usage: suite_worker.py --list | --results FILE TEST [TEST ...]")
