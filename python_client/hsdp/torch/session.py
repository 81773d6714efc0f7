"""The process-wide hsdpd session behind every "hsdpd" process group.

One hsdp.Client per process, attached when the default process group is
created (global rank and world size), shared by all subgroups, detached when
a new default group replaces it or at exit. The job id is $HSDP_JOB_ID, or
one that global rank 0 makes up and publishes through torch's store, so
that several jobs (and successive init_process_group calls) never collide.
"""
import atexit
import os
import threading
import uuid

from hsdp.client import Client

_lock = threading.Lock()
_session = None

JOB_KEY = "hsdp/job_id"


def _agree_job_id(store, rank):
    env = os.environ.get("HSDP_JOB_ID")
    if env:
        return env
    if rank == 0:
        store.set(JOB_KEY, f"torch-{uuid.uuid4().hex[:12]}")
    return store.get(JOB_KEY).decode()


def attach(store, rank, world_size, timeout_s):
    """Attaches this process (global `rank` of `world_size`); replaces an older session."""
    global _session
    job_id = _agree_job_id(store, rank)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    with _lock:
        old, _session = _session, None
    if old is not None:
        old.close()
    client = Client(job_id=job_id, rank=rank, world_size=world_size, local_rank=local_rank,
                    connect_timeout=min(max(timeout_s, 1.0), 60.0))
    with _lock:
        _session = client
    return client


def current():
    """The attached session; RuntimeError before init_process_group("hsdpd")."""
    with _lock:
        s = _session
    if s is None:
        raise RuntimeError(
            "no hsdpd session: call torch.distributed.init_process_group('hsdpd', ...) first")
    return s


def get():
    with _lock:
        return _session


def close():
    global _session
    with _lock:
        s, _session = _session, None
    if s is not None:
        s.close()


atexit.register(close)
