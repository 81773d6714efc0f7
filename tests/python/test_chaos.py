"""The chaos harness (tools/chaos/): its seeded schedule, and a short chaos run
of an HSDP job across three hsdpd nodes whose verdict must hold.

The short run is what CI affords (about three minutes: every fault kind this
machine supports, once each): the nodes in network namespaces where they can
be made here (link faults), on etcd where the build has it (etcd faults),
else on loopback with the embedded coordinator. `tools/chaos/chaos.py
--seconds 3600` is the long run (docs/chaos.md).
"""
import os
import subprocess
import sys
import time

import pytest

from conftest import BUILD, REPO

CHAOS = os.path.join(REPO, "tools", "chaos")
sys.path.insert(0, CHAOS)
import schedule  # noqa: E402
sys.path.insert(0, os.path.join(REPO, "tools", "scripts"))
import netns_topology  # noqa: E402

KINDS = ["kill_trainer", "stop_trainer", "kill_daemon", "drain_daemon", "kill_coordinator",
         "disk_full"]


def _check_schedule(a, kinds, seconds, etcd):
    assert {f.kind for f in a} == set(kinds)
    assert [f.at_s for f in a] == sorted(f.at_s for f in a)
    busy = {}
    for f in a:
        assert f.at_s + f.duration_s < seconds, f
        for res in schedule._resources(f.kind, f.target, etcd):
            assert f.at_s >= busy.get(res, 0.0), f"{f} overlaps an earlier fault on {res}"
            busy[res] = f.at_s + f.duration_s
        lo, hi = schedule.DURATIONS[f.kind]
        assert lo <= f.duration_s <= hi, f
        if f.kind in schedule.TRAINER_KINDS:
            assert 0 <= f.target < 6
        elif f.kind == "kill_coordinator":
            assert f.target == 0
        elif f.kind in schedule.ETCD_KINDS:
            assert 0 <= f.target < schedule.ETCD_MEMBERS
        elif f.kind in schedule.LINK_KINDS:
            assert 0 <= f.target < 3


def test_a_seed_gives_one_schedule_with_every_kind_and_no_overlap_on_a_target():
    a = schedule.draw(11, 300, KINDS, 3, 6, rate_per_min=6)
    assert a == schedule.draw(11, 300, KINDS, 3, 6, rate_per_min=6)
    assert a != schedule.draw(12, 300, KINDS, 3, 6, rate_per_min=6)
    _check_schedule(a, KINDS, 300, etcd=False)
    with pytest.raises(ValueError):
        schedule.draw(1, 60, ["unplug_the_rack"], 3, 6)


def test_network_and_etcd_kinds_never_hit_one_member_twice_at_once():
    kinds = KINDS + list(schedule.LINK_KINDS) + list(schedule.ETCD_KINDS)
    for seed in range(20):
        a = schedule.draw(seed, 600, kinds, 3, 6, rate_per_min=12)
        assert a == schedule.draw(seed, 600, kinds, 3, 6, rate_per_min=12)
        _check_schedule(a, kinds, 600, etcd=True)
        # Quorum loss occupies every member: nothing else touches etcd meanwhile
        # (no member killed, no link of a node carrying a member cut or shaped).
        for q in (f for f in a if f.kind == "etcd_quorum_lost"):
            for f in a:
                if f is q or not (f.kind in schedule.ETCD_KINDS or f.kind in schedule.LINK_KINDS):
                    continue
                assert f.at_s >= q.at_s + q.duration_s or q.at_s >= f.at_s + f.duration_s, \
                    (q, f)
    # Without etcd kinds a link fault occupies only its link.
    assert schedule._resources("link_down", 1) == (("link", 1),)
    assert set(schedule._resources("etcd_quorum_lost", 2)) == {("etcd", m) for m in range(3)}


def _short_run_mode():
    """(chaos.py options, kinds): namespaces and etcd where this machine has them."""
    args, kinds = [], list(KINDS)
    if netns_topology.probe() is None:
        args.append("--netns")
        kinds += schedule.LINK_KINDS
    if all(os.access(os.path.join(BUILD, "third_party", "etcd", "usr", "bin", b), os.X_OK)
           for b in ("etcd", "etcdctl")):
        args += ["--store", "etcd"]
        kinds += schedule.ETCD_KINDS
    return args, kinds


@pytest.mark.skipif(os.geteuid() != 0, reason="the chaos run's disk_full fault mounts a tmpfs")
def test_a_short_chaos_run_ends_with_the_undisturbed_parameters(tmp_path):
    out = tmp_path / "run"
    mode, kinds = _short_run_mode()
    # Seed 60 over 60 s at 8 a minute: 11 faults, each of the ten kinds (where
    # namespaces or etcd are missing, the seed's schedule of the kinds left: 6 or 8
    # faults, each kind once).
    r = subprocess.run(
        [sys.executable, os.path.join(CHAOS, "chaos.py"), "--seed", "60", "--seconds", "60",
         "--rate", "8", "--nodes", "3", "--ranks-per-node", "2", "--steps", "160",
         "--ckpt-every", "8", "--kinds", ",".join(kinds), *mode, "--build", BUILD, "--python",
         sys.executable, "--out", str(out), "--deadline-s", "600"],
        capture_output=True, text=True, timeout=900)
    print(f"mode: {mode or 'loopback, embedded store'}")
    print(r.stdout[-6000:])
    assert r.returncode == 0, f"{r.stdout[-8000:]}\n{r.stderr[-4000:]}"
    assert "bitwise equal to the undisturbed run's" in r.stdout
    assert "verdict: OK" in r.stdout
    # Faults really happened and cost the job restarts.
    injected = [line for line in r.stdout.splitlines() if "] fault " in line and
                "skipped" not in line]
    assert len(injected) >= 4, r.stdout[-4000:]
    # The link and etcd faults of this mode were among them.
    for group, says in ((schedule.LINK_KINDS, "'s link"), (schedule.ETCD_KINDS, "etcd member")):
        if set(group) <= set(kinds):
            assert any(says in line for line in injected), r.stdout[-4000:]


def test_detection_reads_the_daemons_log_lines_and_the_rank_errors(tmp_path):
    import verdict
    at = 1_800_000_000.0
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at + 3))
    log = tmp_path / "hsdpd.log"
    log.write_text("=== chaos: start 1\n"
                   f"I {stamp}.250000 42 etcd_member.cc:279] cluster: joined\n"
                   f"W {stamp}.500000 42 coordinator.cc:252] cluster: node 2 "
                   "(198.18.40.12:7070) lost: no heartbeat for 3.1s; epoch 5\n")
    rows = verdict.log_lines(str(log))
    assert [round(t - at, 2) for t, _ in rows] == [3.25, 3.5]
    d = verdict.daemon_detection("link_down", 2, at, {0: rows, 2: []})
    assert d is not None and round(d[0], 2) == 3.5 and d[1] == 0
    assert verdict.daemon_detection("link_down", 1, at, {0: rows}) is None
    assert verdict.daemon_detection("link_down", 2, at + 10, {0: rows}) is None  # before it
    failures = [{"failing_at": at + 4.0, "errors": {
        1: "RuntimeError: ABORTED: node 2 hosting rank(s) [4, 5] was lost (...)"}}]
    j = verdict.job_detection("link_down", 2, at, failures, at + 60)
    assert j is not None and j[0] == 4.0 and "rank 1" in j[1]
    assert verdict.job_detection("link_down", 0, at, failures, at + 60) is None
    assert verdict.job_detection("kill_etcd_member", 0, at, failures, at + 60) is None
