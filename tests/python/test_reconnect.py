"""A torch process group over hsdpd survives a restart of the daemon.

Two ranks all-reduce through the "hsdpd" backend; the test kills the daemon
and starts a new one on the same socket; the ranks' next all-reduce fails
(it went to the dead daemon), and their retry runs on the new daemon with
the same process group and the right result: the client library connected
again, registered the buffers again and re-created the groups by itself.
"""
import os
import threading

import mp_runner
from conftest import BUILD, Daemon
from waiting import wait_until


def _wait_for(path, timeout=60):
    wait_until(lambda: os.path.exists(path), timeout, path, interval=0.01)


def reconnect_worker(rank, world, marks):
    import torch
    import torch.distributed as dist
    x = torch.full((8,), float(rank + 1))
    dist.all_reduce(x)
    before = x.tolist()
    open(os.path.join(marks, f"ready.{rank}"), "w").close()
    _wait_for(os.path.join(marks, "restarted"))
    y = torch.full((8,), float(10 * (rank + 1)))
    first_error = None
    try:
        dist.all_reduce(y)  # submitted to the daemon that was killed
    except Exception as e:  # noqa: BLE001
        first_error = str(e)
    y = torch.full((8,), float(10 * (rank + 1)))
    dist.all_reduce(y)  # the retry: reconnected
    z = torch.full((8,), float(rank))
    dist.all_reduce(z)  # and later ones need nothing more
    return before, first_error, y.tolist(), z.tolist()


def _run_across_a_daemon_restart(tmp_path, worker, env_extra):
    """Runs `worker` on two ranks over hsdpd; once both wrote ready.<rank>, kills
    the daemon and starts a new one on the same socket, then writes `restarted`.
    Returns the ranks' results."""
    binary = os.path.join(BUILD, "bin", "hsdpd")
    os.makedirs(tmp_path / "d")
    d = Daemon(binary, str(tmp_path / "d"))
    marks = str(tmp_path)
    env = [{"HSDPD_SOCKET": d.socket, **env_extra}] * 2
    out = {}

    def launch():
        out["results"] = mp_runner.launch(worker, 2, (marks,), "hsdpd", marks, 120, env=env)

    t = threading.Thread(target=launch)
    t.start()
    try:
        for r in range(2):
            _wait_for(os.path.join(marks, f"ready.{r}"))
        d.proc.kill()
        d.proc.wait()
        d = Daemon(binary, d.dir)  # the same socket path
        open(os.path.join(marks, "restarted"), "w").close()
        t.join(150)
        assert not t.is_alive()
    finally:
        d.stop()
    return out["results"]


def test_a_torch_process_group_survives_a_daemon_restart(tmp_path):
    results = _run_across_a_daemon_restart(tmp_path, reconnect_worker,
                                           {"HSDP_JOB_ID": "torch-reconnect"})
    for before, first_error, y, z in results:
        assert before == [3.0] * 8
        assert first_error is not None and "lost the connection to hsdpd" in first_error, \
            first_error
        assert y == [30.0] * 8
        assert z == [1.0] * 8


def no_reconnect_worker(rank, world, marks):
    import torch
    import torch.distributed as dist
    import hsdp.torch.session as session
    x = torch.full((8,), float(rank + 1))
    dist.all_reduce(x)
    open(os.path.join(marks, f"ready.{rank}"), "w").close()
    _wait_for(os.path.join(marks, "restarted"))
    errors = []
    for _ in range(2):  # the op in flight, and a retry: neither reconnects
        y = torch.full((8,), float(10 * (rank + 1)))
        try:
            dist.all_reduce(y)
            errors.append(None)
        except Exception as e:  # noqa: BLE001
            errors.append(str(e))
    # What a job that recovers by itself does: end its groups and session, make
    # them again (here over a fresh store), and go on with the new daemon.
    dist.destroy_process_group()
    session.close()
    store = dist.FileStore(os.path.join(marks, "store-again"), world)
    dist.init_process_group("hsdpd", store=store, rank=rank, world_size=world)
    z = torch.full((8,), float(rank))
    dist.all_reduce(z)
    return x.tolist(), errors, z.tolist()


def test_with_hsdp_reconnect_0_calls_fail_until_the_job_makes_its_groups_again(tmp_path):
    results = _run_across_a_daemon_restart(
        tmp_path, no_reconnect_worker,
        {"HSDP_JOB_ID": "torch-no-reconnect", "HSDP_RECONNECT": "0"})
    for before, errors, z in results:
        assert before == [3.0] * 8
        # The retry fails too instead of reconnecting (it would run alone in the
        # groups' next epoch while the peers recover).
        assert len(errors) == 2 and all(e is not None and "lost the connection to hsdpd" in e
                                        for e in errors), errors
        assert z == [1.0] * 8


def test_hsdp_reconnect_takes_0_or_1_and_refuses_anything_else(monkeypatch):
    from hsdp.torch import session
    import pytest
    for value, want in (("0", False), ("1", True), ("", True)):
        monkeypatch.setenv("HSDP_RECONNECT", value)
        assert session.reconnect_wanted() is want
    monkeypatch.delenv("HSDP_RECONNECT")
    assert session.reconnect_wanted() is True
    monkeypatch.setenv("HSDP_RECONNECT", "no")
    with pytest.raises(ValueError, match="HSDP_RECONNECT"):
        session.reconnect_wanted()
