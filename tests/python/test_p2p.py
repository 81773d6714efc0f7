"""Point-to-point and all-to-all in the daemon, through hsdp.Client, against numpy.

Each worker opens its own session (a job of its own) next to the torch
process group the runner sets up.
"""
import os
import tempfile

import numpy as np
import pytest

import hsdp
from waiting import wait_until


@pytest.fixture
def hsdpd_short_timeout(hsdpd):
    """A second daemon with a 1.5 s collective timeout; workers spawned meanwhile use it."""
    from conftest import BUILD, Daemon
    tmp = tempfile.mkdtemp(prefix="hsdp-p2p-")
    cfg = os.path.join(tmp, "node.yaml")
    with open(cfg, "w") as f:
        f.write("timeouts:\n  collective_ms: 1500\n  shutdown_grace_ms: 200\n")
    d = Daemon(os.path.join(BUILD, "bin", "hsdpd"), tmp, ["--node-config", cfg])
    old = os.environ["HSDPD_SOCKET"]
    os.environ["HSDPD_SOCKET"] = d.socket
    try:
        yield d
    finally:
        os.environ["HSDPD_SOCKET"] = old
        d.stop()


def _client(job, rank, world_size):
    return hsdp.Client(job_id=job, rank=rank, world_size=world_size)


def _ring_and_any_source(rank, world_size, job):
    with _client(job, rank, world_size) as c:
        out = {}
        # A ring: everyone sends to the next rank and receives from the previous one.
        nxt, prv = (rank + 1) % world_size, (rank - 1) % world_size
        x = np.arange(5, dtype=np.float32) + 100 * rank
        y = np.zeros(5, dtype=np.float32)
        ws = c.send(x, nxt, tag=7, async_op=True)
        wr = c.recv(y, prv, tag=7, async_op=True)
        ws.wait(timeout=30)
        wr.wait(timeout=30)
        out["ring"] = y.tolist()
        out["ring_peer"] = wr.peer
        # Tags keep messages apart; posting order is kept per tag.
        if rank == 0:
            # Asynchronous: a send completes when its receive has taken the data.
            works = [c.send(np.full(3, v, dtype=np.float64), 1, tag=tag, async_op=True)
                     for tag, v in ((1, 10.0), (2, 20.0), (1, 11.0))]
            for w in works:
                w.wait(timeout=30)
        elif rank == 1:
            got = []
            for tag in (2, 1, 1):
                z = np.zeros(3, dtype=np.float64)
                c.recv(z, 0, tag=tag)
                got.append(float(z[0]))
            out["tags"] = got
        # Any source: rank 0 receives one message from every other rank.
        if rank == 0:
            senders = []
            for _ in range(world_size - 1):
                z = np.zeros(2, dtype=np.int64)
                w = c.recv(z, -1, tag=3, async_op=True)
                w.wait(timeout=30)
                senders.append((w.peer, int(z[0])))
            out["any"] = sorted(senders)
        else:
            c.send(np.full(2, rank * 1000, dtype=np.int64), 0, tag=3)
        # Empty messages match too.
        if rank == 0:
            c.send(np.zeros(0, dtype=np.float32), 1, tag=9)
        elif rank == 1:
            c.recv(np.zeros(0, dtype=np.float32), 0, tag=9)
        c.barrier()
        return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_send_recv_ring_tags_and_any_source(run, world_size):
    res = run(_ring_and_any_source, world_size, f"p2p-{world_size}")
    for rank, out in enumerate(res):
        prv = (rank - 1) % world_size
        assert out["ring"] == (np.arange(5) + 100 * prv).tolist()
        assert out["ring_peer"] == prv
    assert res[1]["tags"] == [20.0, 10.0, 11.0]
    assert res[0]["any"] == [(r, r * 1000) for r in range(1, world_size)]


def _mismatch_and_timeout(rank, world_size, job, timed_out_file):
    with _client(job, rank, world_size) as c:
        if rank == 0:
            try:
                c.send(np.zeros(4, dtype=np.float32), 1, tag=5)
            except hsdp.InvalidArgument as e:
                mismatch = str(e)
            else:
                mismatch = "no error"
            # Nobody ever receives this one: the daemon times it out.
            try:
                c.send(np.zeros(1, dtype=np.float32), 1, tag=6)
            except hsdp.DeadlineExceeded as e:
                timeout = str(e)
            else:
                timeout = "no error"
            with open(timed_out_file, "w"):
                pass
            return mismatch, timeout
        try:
            c.recv(np.zeros(5, dtype=np.float32), 0, tag=5)
        except hsdp.InvalidArgument as e:
            mismatch = str(e)
        else:
            mismatch = "no error"
        # Stay attached until rank 0's unmatched send has timed out.
        wait_until(lambda: os.path.exists(timed_out_file), 60, "rank 0's send never returned")
        return mismatch, None


def test_send_recv_size_mismatch_and_unmatched_timeout(hsdpd_short_timeout, tmp_path):
    import mp_runner
    res = mp_runner.launch(_mismatch_and_timeout, 2, ("p2p-errors", str(tmp_path / "timed-out")),
                           "gloo", str(tmp_path), 120)
    for mismatch, _ in res:
        assert "sends 4 float32" in mismatch and "expects 5 float32" in mismatch, mismatch
    assert "timed out after" in res[0][1] and "waiting for the matching recv" in res[0][1]


def _all_to_all(rank, world_size, job):
    with _client(job, rank, world_size) as c:
        # Equal blocks of 3.
        x = (np.arange(3 * world_size, dtype=np.float32) + 100 * rank)
        y = np.zeros(3 * world_size, dtype=np.float32)
        c.all_to_all(y, x)
        # Uneven: rank r sends (r + j + 1) elements to rank j.
        in_splits = [rank + j + 1 for j in range(world_size)]
        out_splits = [j + rank + 1 for j in range(world_size)]
        xs = np.concatenate([np.full(n, 10 * rank + j, dtype=np.int64)
                             for j, n in enumerate(in_splits)])
        ys = np.zeros(sum(out_splits), dtype=np.int64)
        c.all_to_all(ys, xs, out_splits=out_splits, in_splits=in_splits)
        # Splits that disagree fail at every rank.
        bad = list(out_splits)
        bad[0] += 1 if rank == 0 else 0
        try:
            c.all_to_all(np.zeros(sum(bad), dtype=np.int64), xs, out_splits=bad,
                         in_splits=in_splits)
            err = "no error"
        except hsdp.InvalidArgument as e:
            err = str(e)
        return y.tolist(), ys.tolist(), err


@pytest.mark.parametrize("world_size", [2, 3])
def test_all_to_all_equal_and_uneven_against_numpy(run, world_size):
    res = run(_all_to_all, world_size, f"a2a-{world_size}")
    for j, (y, ys, err) in enumerate(res):
        want = np.concatenate([np.arange(3 * world_size, dtype=np.float32)[3 * j:3 * j + 3] + 100 * i
                               for i in range(world_size)])
        assert y == want.tolist()
        want_s = np.concatenate([np.full(i + j + 1, 10 * i + j) for i in range(world_size)])
        assert ys == want_s.tolist()
        assert "splits" in err and "expects" in err, err


def _torch_p2p_and_all_to_all(rank, world_size):
    import torch
    import torch.distributed as dist
    out = {}
    # all_to_all_single, uneven: rank r sends (r + j + 1) rows of width 2 to rank j.
    in_splits = [rank + j + 1 for j in range(world_size)]
    out_splits = [i + rank + 1 for i in range(world_size)]
    x = torch.cat([torch.full((n, 2), float(10 * rank + j)) for j, n in enumerate(in_splits)])
    y = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(y, x, out_splits, in_splits)
    out["single"] = y[:, 0].tolist()
    # all_to_all with tensor lists of different sizes.
    ins = [torch.full((j + 1,), float(rank)) for j in range(world_size)]
    outs = [torch.zeros(rank + 1) for _ in range(world_size)]
    dist.all_to_all(outs, ins)
    out["lists"] = [o.tolist() for o in outs]
    # send / recv from any source, with the sender reported.
    if rank == 0:
        got = []
        for _ in range(world_size - 1):
            t = torch.zeros(3)
            src = dist.recv(t)
            got.append((src, t[0].item()))
        out["any"] = sorted(got)
    else:
        dist.send(torch.full((3,), float(rank)), 0)
    # an empty all_reduce (DDP's zero-element metadata)
    e = torch.zeros(0)
    dist.all_reduce(e)
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_torch_backend_all_to_all_and_any_source(run, world_size):
    res = run(_torch_p2p_and_all_to_all, world_size)
    for j, out in enumerate(res):
        want = [float(10 * i + j) for i in range(world_size) for _ in range(i + j + 1)]
        assert out["single"] == want
        assert out["lists"] == [[float(i)] * (j + 1) for i in range(world_size)]
    assert res[0]["any"] == [(r, float(r)) for r in range(1, world_size)]
