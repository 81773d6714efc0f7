"""Failures reach Python as clear exceptions: timeouts, a dead daemon, bad tensors."""
import os

import pytest
import torch

import hsdp
from conftest import BUILD, Daemon


def test_wait_timeout_is_a_timeout_error(hsdpd):
    # Rank 0 of a 2-rank job submits alone: the op cannot complete.
    with hsdp.Client(socket_path=hsdpd.socket, job_id=f"lonely-{os.getpid()}", rank=0,
                     world_size=2) as c:
        g = c.new_group([0, 1])
        w = c.all_reduce(c.tensor((4,)), group=g, async_op=True)
        with pytest.raises(hsdp.DeadlineExceeded) as e:
            w.wait(timeout=0.2)
        assert isinstance(e.value, TimeoutError)
        assert not w.test()


def test_daemon_death_fails_pending_work(tmp_path):
    d = Daemon(os.path.join(BUILD, "bin", "hsdpd"), str(tmp_path))
    try:
        c = hsdp.Client(socket_path=d.socket, job_id="doomed", rank=0, world_size=2)
        w = c.all_reduce(c.tensor((4,)), group=c.new_group([0, 1]), async_op=True)
        d.proc.kill()
        d.proc.wait()
        with pytest.raises(hsdp.HsdpError) as e:
            w.wait(timeout=20)
        assert isinstance(e.value, (hsdp.Unavailable, hsdp.Cancelled, hsdp.Aborted)), e.value
    finally:
        d.stop()


def bad_tensor_worker(rank, world):
    import torch.distributed as dist
    msgs = []
    for call in (lambda: dist.all_reduce(torch.zeros(2, device="meta")),
                 lambda: dist.broadcast(torch.zeros(2).to_sparse(), 0)):
        try:
            call()
            msgs.append("")
        except Exception as e:  # noqa: BLE001
            msgs.append(str(e))
    return msgs


def test_unsupported_tensors_name_the_problem(run):
    for msgs in run(bad_tensor_worker, 2):
        assert "CPU tensors only" in msgs[0], msgs[0]
        assert "sparse" in msgs[1], msgs[1]


def fsdp2_adapter_worker(rank, world):
    import torch.distributed as dist
    import hsdp.torch
    from hsdp.torch import HsdpAllGather, HsdpReduceScatter
    client = hsdp.torch.client()
    ag, rs = HsdpAllGather(), HsdpReduceScatter()
    out = ag.allocate((world * 8,), dtype=torch.float32, device=torch.device("cpu"))
    assert client.locate(out) is not None
    inp = out.narrow(0, rank * 8, 8)  # FSDP2 gathers in place from its slice
    inp.fill_(rank + 1)
    before = client.staging.stats()["acquisitions"]
    ag(out, inp, dist.distributed_c10d._get_default_group(), async_op=False)
    assert client.staging.stats()["acquisitions"] == before, "all-gather was not zero-copy"
    got_ag = out.tolist()
    rs_in = rs.allocate((world * 4,), dtype=torch.float32, device="cpu")
    rs_in.copy_(torch.arange(world * 4, dtype=torch.float32))
    rs_out = rs.allocate((4,), dtype=torch.float32, device="cpu")
    rs(rs_out, rs_in, dist.distributed_c10d._get_default_group(), dist.ReduceOp.SUM)
    got_rs = rs_out.tolist()
    import gc
    from waiting import eventually
    free_before = client.staging.stats()["free_buffers"]
    del out, inp, rs_in, rs_out

    def freed():  # the completer thread drops its references shortly after
        gc.collect()
        return client.staging.stats()["free_buffers"] - free_before >= 3
    eventually(freed, 5, interval=0.01)
    return got_ag, got_rs, client.staging.stats()["free_buffers"] - free_before


def test_fsdp2_comm_adapters_are_zero_copy_and_recycle_memory(run):
    world = 2
    for rank, (ag, rs, freed) in enumerate(run(fsdp2_adapter_worker, world)):
        assert ag == [1.0] * 8 + [2.0] * 8
        assert rs == [world * v for v in range(rank * 4, rank * 4 + 4)]
        assert freed == 3  # every allocate() lease went back to the pool
