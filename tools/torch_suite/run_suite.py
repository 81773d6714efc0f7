#!/usr/bin/env python3
"""Runs PyTorch's own distributed test suite against the hsdpd and/or Gloo backends.

The tests are DistributedTest._DistTestBase of torch's
torch/testing/_internal/distributed/distributed_test.py (shipped with
the torch wheel), driven as upstream's test/distributed/test_distributed_spawn.py
does: one fresh process group per test, `world_size` ranks,
init_process_group(BACKEND, init_method="file://..."). See suite_worker.py.

  run_suite.py --list [--filter RE]
  run_suite.py [--backend hsdpd|gloo] [--world-size 2 3] [--filter RE] [--out DIR]
  run_suite.py --compare [--world-size 2 3]      # gloo and hsdpd in one run
  run_suite.py --ci                              # the ctest `torch_suite` mode

--ci runs, against hsdpd, the tests listed in expected_gloo_pass.txt (tests that
pass over Gloo here) and fails on any that does not pass, except those in
known_gaps.txt (each with a category and a reason).

Every test runs under a bounded time (--timeout): MultiProcessTestCase kills
its ranks at the limit, and a watchdog kills the whole worker (its process
group) a little later if that did not work; either way the test is recorded
as "timeout". hsdpd runs get a private daemon (build/bin/hsdpd on a temporary
socket, $HSDPD_SOCKET). Only loopback is used (file:// store, Gloo on
127.0.0.1).
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
WORKER = os.path.join(HERE, "suite_worker.py")
sys.path.insert(0, os.path.join(REPO, "tools", "pylib"))
import localproc  # noqa: E402
# The ranks run in the interpreter that runs this script (ctest: the project's
# environment, build/venv; tools/scripts/python_env.sh).
PYTHON = sys.executable
RESULTS = ("pass", "fail", "skip", "timeout")
WATCHDOG_GRACE_S = 30


# -- the hsdpd daemon --------------------------------------------------------
class Daemon:
    def __init__(self, binary, workdir):
        self.socket = os.path.join(workdir, "hsdpd.sock")
        self.log = os.path.join(workdir, "hsdpd.log")
        self._logf = open(self.log, "a")
        self.proc = subprocess.Popen([binary, "--socket", self.socket],
                                     stdout=self._logf, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        if localproc.wait_for_socket(self.socket, self.proc, 20):
            return
        self.stop()
        raise RuntimeError(f"hsdpd did not start; see {self.log}")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        localproc.stop(self.proc)
        self._logf.close()


# -- test lists ----------------------------------------------------------------
def _worker_env(backend, world_size, args, workdir, daemon=None):
    env = dict(os.environ)
    pypath = [os.path.join(args.build, "python")]
    env["PYTHONPATH"] = os.pathsep.join(pypath + [p for p in env.get("PYTHONPATH", "").split(
        os.pathsep) if p])
    env.update({
        "BACKEND": backend,
        "WORLD_SIZE": str(world_size),
        "TEMP_DIR": workdir,
        "INIT_METHOD": "file://" + os.path.join(workdir, "shared_init_file"),
        "HSDP_SUITE_START_METHOD": args.start_method,
        "DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": str(args.timeout),
        "MASTER_ADDR": "127.0.0.1",
        "GLOO_SOCKET_IFNAME": env.get("GLOO_SOCKET_IFNAME", "lo"),
        "OMP_NUM_THREADS": "1",
    })
    if args.lift_gates:
        env["HSDP_SUITE_LIFT_GATES"] = "1"
    else:
        env.pop("HSDP_SUITE_LIFT_GATES", None)
    if daemon is not None:
        env["HSDPD_SOCKET"] = daemon.socket
        env.pop("HSDP_JOB_ID", None)
    return env


def list_tests(args):
    with tempfile.TemporaryDirectory(prefix="torch-suite-list-") as d:
        out = subprocess.run([PYTHON, WORKER, "--list"], env=_worker_env("gloo", 2, args, d),
                             capture_output=True, text=True, check=True).stdout
    names = [n for n in out.split() if n.startswith("test")]
    if args.filter:
        rx = re.compile(args.filter)
        names = [n for n in names if rx.search(n)]
    return names


def read_list(path):
    """Lines `WS TEST [rest]` (WS: a world size or *); '#' starts a comment.
    Returns {(ws or '*', test): rest}."""
    out = {}
    with open(path) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split(None, 2)
            out[(parts[0], parts[1])] = parts[2] if len(parts) > 2 else ""
    return out


def _listed(table, ws, test):
    return (str(ws), test) in table or ("*", test) in table


# -- running -------------------------------------------------------------------
def _read_results(path):
    done = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    rec = json.loads(line)
                    done[rec["test"]] = rec
    return done


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_config(backend, world_size, tests, args, binary):
    """Runs `tests` for one (backend, world size): {test: record}, wall seconds."""
    workdir = tempfile.mkdtemp(prefix=f"torch-suite-{backend}-ws{world_size}-")
    daemon = Daemon(binary, workdir) if backend == "hsdpd" else None
    results_path = os.path.join(workdir, "results.jsonl")
    log_path = os.path.join(args.out, f"{backend}-ws{world_size}.log") if args.out else \
        os.path.join(workdir, "worker.log")
    start = time.time()
    records = {}
    remaining = list(tests)
    try:
        while remaining:
            if daemon is not None and not daemon.alive():
                print(f"  hsdpd exited (log {daemon.log}); restarting it", flush=True)
                daemon = Daemon(binary, workdir)
            env = _worker_env(backend, world_size, args, workdir, daemon)
            with open(log_path, "a") as logf:
                proc = subprocess.Popen([PYTHON, WORKER, "--results", results_path, *remaining],
                                        env=env, stdout=logf, stderr=subprocess.STDOUT,
                                        start_new_session=True, cwd=workdir)
                last_progress, n_done = time.time(), 0
                while True:
                    try:
                        proc.wait(1)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    except BaseException:
                        _kill_group(proc)
                        raise
                    done = _read_results(results_path)
                    finished = sum(1 for t in remaining if t in done)
                    if finished != n_done:
                        n_done, last_progress = finished, time.time()
                        _progress(backend, world_size, done, tests)
                    if time.time() - last_progress > args.timeout + WATCHDOG_GRACE_S:
                        _kill_group(proc)
                        break
            done = _read_results(results_path)
            records.update({t: done[t] for t in remaining if t in done})
            left = [t for t in remaining if t not in done]
            if left:
                # The worker died or was killed during left[0].
                hung = left[0]
                status = "timeout" if proc.returncode in (-signal.SIGKILL, None) else "fail"
                records[hung] = {"test": hung, "result": status,
                                 "seconds": round(time.time() - last_progress, 2),
                                 "detail": f"worker ended (rc {proc.returncode}) during this "
                                           f"test; see {log_path}"}
                with open(results_path, "a") as f:
                    f.write(json.dumps(records[hung]) + "\n")
                left = left[1:]
            remaining = left
    finally:
        if daemon is not None:
            daemon.stop()
            if args.out:
                shutil.copy(daemon.log, os.path.join(args.out, f"hsdpd-daemon-ws{world_size}.log"))
        shutil.rmtree(workdir, ignore_errors=True)
    return records, time.time() - start


def _progress(backend, ws, done, tests):
    if not sys.stdout.isatty():
        return
    n = sum(1 for t in tests if t in done)
    print(f"\r  {backend} ws={ws}: {n}/{len(tests)}", end="", flush=True)


def counts(records):
    c = {k: 0 for k in RESULTS}
    for r in records.values():
        c[r["result"]] += 1
    return c


def _reason(rec):
    detail = (rec.get("detail") or "").strip()
    if rec["result"] == "skip":
        return detail.splitlines()[0] if detail else ""
    # The most telling line: the last "Error:" / "Exception" line of the traceback.
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Exceeded|Unimplemented|Unavailable)\b", ln) or \
                ln.startswith(("AssertionError", "RuntimeError", "NotImplementedError")):
            return ln[:200]
    return lines[-1][:200] if lines else ""


# -- main ----------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=("hsdpd", "gloo"), default="hsdpd")
    ap.add_argument("--compare", action="store_true",
                    help="run gloo and hsdpd; print side-by-side counts and the tests that "
                         "pass on Gloo but not on hsdpd")
    ap.add_argument("--world-size", type=int, nargs="+", default=[2, 3])
    ap.add_argument("--filter", help="regular expression on test names")
    ap.add_argument("--tests-file", help="run only the tests listed (WS TEST lines)")
    ap.add_argument("--list", action="store_true", help="list the tests and exit")
    ap.add_argument("--timeout", type=int, default=90, help="seconds per test")
    ap.add_argument("--start-method", choices=("fork", "spawn"), default="fork",
                    help="how ranks start: fork (default, fast) or spawn (as upstream)")
    ap.add_argument("--lift-gates", action="store_true",
                    help="evaluate torch's backend-name skip gates as for gloo")
    ap.add_argument("--out", help="directory for results.json, summary and logs")
    ap.add_argument("--build", default=os.environ.get("HSDP_BUILD_DIR",
                                                      os.path.join(REPO, "build")))
    ap.add_argument("--ci", action="store_true",
                    help="hsdpd (gates lifted) on expected_gloo_pass.txt; fail unless pass or "
                         "a known gap")
    ap.add_argument("--expected", default=os.path.join(HERE, "expected_gloo_pass.txt"))
    ap.add_argument("--known-gaps", default=os.path.join(HERE, "known_gaps.txt"))
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if args.ci:
        args.lift_gates = True  # the expected tests run, not skip on hsdpd's name
    # ctest and users stop runs with SIGTERM: unwind, so the daemon and workers go too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    names = list_tests(args)
    if args.list:
        print("\n".join(names))
        return 0
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        args.out = os.path.abspath(args.out)
    binary = os.path.join(args.build, "bin", "hsdpd")
    backends = ["gloo", "hsdpd"] if args.compare else ["hsdpd"] if args.ci else [args.backend]
    if "hsdpd" in backends and not os.access(binary, os.X_OK):
        print(f"{binary} not found: build first", file=sys.stderr)
        return 2

    selected = None
    if args.ci:
        selected = read_list(args.expected)
    elif args.tests_file:
        selected = read_list(args.tests_file)

    report = {"torch": None, "start_method": args.start_method, "lift_gates": args.lift_gates,
              "timeout_s": args.timeout, "runs": []}
    t0 = time.time()
    for ws in args.world_size:
        tests = [n for n in names if selected is None or _listed(selected, ws, n)]
        for backend in backends:
            print(f"{backend} ws={ws}: {len(tests)} tests", flush=True)
            records, wall = run_config(backend, ws, tests, args, binary)
            c = counts(records)
            if sys.stdout.isatty():
                print()
            print(f"{backend} ws={ws}: " + " ".join(f"{k}={c[k]}" for k in RESULTS) +
                  f"  ({wall:.0f} s)", flush=True)
            report["runs"].append({"backend": backend, "world_size": ws, "wall_s": round(wall, 1),
                                   "counts": c, "results": records})
    report["wall_s"] = round(time.time() - t0, 1)
    import torch
    report["torch"] = torch.__version__

    lines = summarize(report, args)
    print("\n".join(lines))
    if args.out:
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(report, f, indent=1, sort_keys=True)
        with open(os.path.join(args.out, "summary.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
    if args.ci:
        return ci_verdict(report, args)
    return 0


def summarize(report, args):
    lines = ["", f"torch {report['torch']}, start method {report['start_method']}, "
             f"{'gates lifted, ' if report['lift_gates'] else ''}"
             f"timeout {report['timeout_s']} s/test, total wall {report['wall_s']:.0f} s", ""]
    lines.append(f"{'backend':8} {'ws':>3} " + " ".join(f"{k:>8}" for k in RESULTS) + "   wall_s")
    for run in report["runs"]:
        c = run["counts"]
        lines.append(f"{run['backend']:8} {run['world_size']:>3} " +
                     " ".join(f"{c[k]:>8}" for k in RESULTS) + f"   {run['wall_s']:>6.0f}")
    by = {(r["backend"], r["world_size"]): r["results"] for r in report["runs"]}
    for ws in sorted({r["world_size"] for r in report["runs"]}):
        gloo, hsdpd = by.get(("gloo", ws)), by.get(("hsdpd", ws))
        if gloo is None or hsdpd is None:
            continue
        gap = sorted(t for t, r in gloo.items()
                     if r["result"] == "pass" and hsdpd.get(t, {}).get("result") != "pass")
        lines += ["", f"ws={ws}: {len(gap)} tests pass on Gloo but not on hsdpd:"]
        for t in gap:
            r = hsdpd.get(t, {"result": "missing"})
            lines.append(f"  {t:60} {r['result']:8} {_reason(r) if 'detail' in r else ''}")
    return lines


def ci_verdict(report, args):
    gaps = read_list(args.known_gaps) if os.path.exists(args.known_gaps) else {}
    bad, fixed, details = [], [], []
    for run in report["runs"]:
        ws = run["world_size"]
        for t, r in sorted(run["results"].items()):
            known = _listed(gaps, ws, t)
            if r["result"] != "pass" and not known:
                bad.append(f"  ws={ws} {t}: {r['result']}: {_reason(r)}")
                tail = (r.get("detail") or "").strip().splitlines()[-40:]
                details.append(f"--- ws={ws} {t} (last {len(tail)} lines) ---")
                details += ["  " + ln for ln in tail]
            elif r["result"] == "pass" and known:
                fixed.append(f"  ws={ws} {t}")
    if fixed:
        print("\nknown gaps that pass now (remove them from known_gaps.txt):")
        print("\n".join(fixed))
    if bad:
        print(f"\nFAILED: {len(bad)} tests pass over Gloo but not over hsdpd and are not "
              "known gaps:")
        print("\n".join(bad))
        print("\n" + "\n".join(details))
        return 1
    print("\nOK: every expected test passes over hsdpd or is a known gap")
    return 0


if __name__ == "__main__":
    sys.exit(main())
