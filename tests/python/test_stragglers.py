"""hsdp.stragglers: a step watcher names the rank that kept the others waiting."""
import os
import threading
import time

import pytest

import hsdp
from hsdp import stragglers

DELAY = 0.04
OPS = 5


def _run_ops(client, errors):
    try:
        # 128 KiB: above data_plane.small_op_bytes, so through the daemon, which
        # is what sees arrivals (small ops run in the group's arena).
        x = client.array(32768)
        for _ in range(OPS):
            if client.rank == 1:
                time.sleep(DELAY)  # rank 1 is the straggler
            client.all_reduce(x)
    except BaseException as e:  # noqa: B902 - reported by the test
        errors.append(e)


def test_step_watcher_names_the_delayed_rank(hsdpd):
    job = f"py-stragglers-{os.getpid()}"
    clients = [hsdp.Client(socket_path=hsdpd.socket, job_id=job, rank=r, world_size=2)
               for r in range(2)]
    try:
        watch = stragglers.StepWatcher(job_id=job, socket_path=hsdpd.socket)
        assert watch.step() == []
        errors = []
        threads = [threading.Thread(target=_run_ops, args=(c, errors)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, errors
        delays = watch.step()
        assert len(delays) == 1, delays
        d = delays[0]
        assert (d.job_id, d.rank, d.ops, d.op_names) == (job, 1, OPS, ["all_reduce"])
        assert OPS * DELAY * 0.75 <= d.waited_seconds <= OPS * DELAY * 4
        assert str(d).startswith("rank 1 delayed this step's all_reduce by ")
        assert str(d).endswith(f"ms ({OPS} ops)")
        assert watch.step() == []  # nothing new since the last step

        ranks = stragglers.report(job, hsdpd.socket)
        assert ranks[0]["rank"] == 1 and ranks[0]["times_last"] == OPS
        assert [e["seq"] for e in ranks[0]["recent"]] == list(range(1, OPS + 1))
    finally:
        for c in clients:
            c.close()


def test_report_without_daemon_raises_unavailable(tmp_path):
    with pytest.raises(hsdp.Unavailable):
        stragglers.report(socket_path=str(tmp_path / "none.sock"), timeout=1.0)
