"""Job ids in the Python client: the default derived from the launcher's run
id (one rule, shared with the C++ client), and owner_uid (join another uid's
job: root and the daemon's uid only, and only a job that exists)."""
import os

import pytest

import hsdp

LAUNCHER_VARS = ("HSDP_JOB_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                 "PMIX_NAMESPACE")


@pytest.fixture
def no_launcher(monkeypatch):
    for v in LAUNCHER_VARS:
        monkeypatch.delenv(v, raising=False)
    return monkeypatch


def test_default_job_id_comes_from_the_launcher(hsdpd, no_launcher):
    no_launcher.setenv("TORCHELASTIC_RUN_ID", f"run-{os.getpid()}")
    with hsdp.Client(socket_path=hsdpd.socket) as c:
        assert c.job_id == f"torchelastic-run-{os.getpid()}"
    no_launcher.setenv("HSDP_JOB_ID", f"explicit-{os.getpid()}")
    with hsdp.Client(socket_path=hsdpd.socket) as c:
        assert c.job_id == f"explicit-{os.getpid()}"


def test_without_a_launcher_id_a_single_rank_job_gets_its_own(hsdpd, no_launcher):
    with hsdp.Client(socket_path=hsdpd.socket) as a, hsdp.Client(socket_path=hsdpd.socket) as b:
        assert a.job_id.startswith("solo-") and b.job_id.startswith("solo-")
        assert a.job_id != b.job_id          # two single-rank jobs never collide


def test_without_a_launcher_id_a_multi_rank_job_is_refused(hsdpd, no_launcher):
    with pytest.raises(hsdp.InvalidArgument, match="job_id: not set"):
        hsdp.Client(socket_path=hsdpd.socket, rank=0, world_size=2)


def test_owner_uid_names_whose_job_to_join(hsdpd):
    me = os.geteuid()
    name = f"owned-{os.getpid()}"
    with hsdp.Client(socket_path=hsdpd.socket, job_id=name, rank=0, world_size=2) as c0:
        # Naming oneself is the same as naming nobody.
        with hsdp.Client(socket_path=hsdpd.socket, job_id=name, rank=1, world_size=2,
                         owner_uid=me) as c1:
            assert c1.job_id == c0.job_id
        # The test's daemon runs as this uid, so the caller is the daemon's uid
        # (or root): it may name another owner, but only of a job that exists.
        other = me + 4242
        with pytest.raises(hsdp.NotFound, match=f"uid {other} has no job"):
            hsdp.Client(socket_path=hsdpd.socket, job_id=name, rank=1, world_size=2,
                        owner_uid=other)
