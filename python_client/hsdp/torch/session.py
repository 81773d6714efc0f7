"""The process-wide hsdpd session behind every "hsdpd" process group.

One hsdp.Client per process, attached when the default process group is
created (global rank and world size), shared by all subgroups, detached when
a new default group replaces it or at exit. The job id is $HSDP_JOB_ID, or
one that the first process to attach makes up and publishes through torch's
store, so
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
ELECT_KEY = "hsdp/job_id_elect"


def _agree_job_id(store):
    """$HSDP_JOB_ID, else the id published by the first process to get here."""
    env = os.environ.get("HSDP_JOB_ID")
    if env:
        return env
    if store.add(ELECT_KEY, 1) == 1:
        store.set(JOB_KEY, f"torch-{uuid.uuid4().hex[:12]}")
    return store.get(JOB_KEY).decode()


def reconnect_wanted():
    """False when $HSDP_RECONNECT is "0": a job that recovers by itself (it ends
    its process groups and makes them again) wants every call after the daemon
    went away to fail, not to reconnect and run in the groups' next epoch while
    its peers do something else. Any other value, or unset: reconnect."""
    value = os.environ.get("HSDP_RECONNECT", "1").strip()
    if value not in ("0", "1", ""):
        raise ValueError(f"HSDP_RECONNECT: {value!r} is neither 0 nor 1")
    return value != "0"


def attach(store, rank, world_size, timeout_s):
    """Attaches this process (global `rank` of `world_size`); replaces an older session."""
    global _session
    job_id = _agree_job_id(store)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    with _lock:
        old, _session = _session, None
    if old is not None:
        old.close()
    client = Client(job_id=job_id, rank=rank, world_size=world_size, local_rank=local_rank,
                    connect_timeout=min(max(timeout_s, 1.0), 60.0), reconnect=reconnect_wanted())
    with _lock:
        _session = client
    return client


def current():
    """The attached session; RuntimeError before any "hsdpd" process group exists."""
    with _lock:
        s = _session
    if s is None:
        raise RuntimeError(
            "no hsdpd session: call torch.distributed.init_process_group('hsdpd', ...) or "
            "create a group with new_group(..., backend='hsdpd') first")
    return s


def current_or_attach(timeout_s):
    """The session; attaches one for a default group of another backend (e.g. Gloo
    default group + new_group(backend="hsdpd")), agreeing on the job id through
    the default store."""
    s = get()
    if s is not None:
        return s
    import torch.distributed as dist
    store = dist.distributed_c10d._get_default_store()
    return attach(store, dist.get_rank(), dist.get_world_size(), timeout_s)


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
