"""hsdp.Client and hsdp._hsdp: zero-copy buffers, errors, option checks."""
import os
import time

import numpy as np
import pytest
import torch
import torch.utils.dlpack

import hsdp


@pytest.fixture
def client(hsdpd):
    c = hsdp.Client(socket_path=hsdpd.socket, job_id=f"single-{os.getpid()}-{id(hsdpd)}")
    yield c
    c.close()


def test_daemon_not_running_is_a_clear_connection_error(tmp_path):
    with pytest.raises(hsdp.Unavailable) as e:
        hsdp.Client(socket_path=str(tmp_path / "none.sock"), connect_timeout=0.3)
    assert isinstance(e.value, ConnectionError)
    assert isinstance(e.value, hsdp.HsdpError)
    assert e.value.code_name == "UNAVAILABLE" and e.value.code == 14
    assert "none.sock" in str(e.value) and "is it running" in str(e.value)


def test_socket_from_environment(hsdpd, monkeypatch):
    monkeypatch.setenv("HSDPD_SOCKET", hsdpd.socket)
    assert hsdp.default_socket_path() == hsdpd.socket
    with hsdp.Client(job_id="env-socket") as c:
        assert c.socket_path == hsdpd.socket


def test_buffer_protocol_and_dlpack_are_zero_copy(client):
    buf = client.buffer(4096, "zc")
    arr = np.frombuffer(buf, dtype=np.float32)
    t = torch.utils.dlpack.from_dlpack(buf.dlpack(0, 4096, "float32", [32, 32]))
    whole = torch.utils.dlpack.from_dlpack(buf)           # __dlpack__ protocol
    assert whole.dtype == torch.uint8 and whole.numel() == 4096
    arr[5] = 42.0
    assert t.view(-1)[5].item() == 42.0
    t[0, 0] = 7.0
    assert arr[0] == 7.0
    assert buf.exports == 3
    with pytest.raises(hsdp.FailedPrecondition, match="exported view"):
        client.free(buf)
    del arr, t, whole
    assert buf.exports == 0
    client.free(buf)
    assert buf.freed
    with pytest.raises(BufferError):
        memoryview(buf)


def test_client_tensor_and_array_live_in_shared_memory(client):
    t = client.tensor((8, 4), torch.bfloat16)
    a = client.array((3, 5), np.int64)
    assert t.shape == (8, 4) and t.dtype == torch.bfloat16 and t.abs().sum() == 0
    assert client.locate(t) is not None and client.locate(a) is not None
    assert client.locate(torch.zeros(4)) is None
    assert client.locate(t[:, 1]) is None            # not contiguous: staged
    buf, off = client.locate(t[2])
    assert off == 2 * 4 * 2


def test_dlpack_rejects_bad_views(client):
    buf = client.buffer(64)
    with pytest.raises(hsdp.OutOfRange):
        buf.dlpack(0, 128)
    with pytest.raises(ValueError, match="shape"):
        buf.dlpack(0, 64, "float32", [3])
    with pytest.raises(ValueError, match="dtype"):
        buf.dlpack(0, 64, "complex64")


def test_bad_arguments_raise_value_errors(client):
    g = client.world
    buf = client.buffer(1024)
    with pytest.raises(hsdp.InvalidArgument, match="unknown dtype"):
        client.raw.all_reduce(g, buf, buf, 4, "complex")
    with pytest.raises(ValueError, match="reduce op"):
        client.raw.all_reduce(g, buf, buf, 4, "float32", op="median")
    with pytest.raises(ValueError, match="outside buffer"):
        client.raw.all_reduce(g, buf, buf, 1024, "float32")
    with pytest.raises(ValueError, match="unknown buffer"):
        client.raw.all_reduce(g, (12345, 0), (12345, 0), 4, "float32")
    with pytest.raises(ValueError, match="pre_divide"):
        client.raw.all_reduce(g, buf, buf, 4, "float32", pre_divide=0.0)
    with pytest.raises(ValueError, match="cannot be reduced"):
        client.all_reduce(torch.zeros(3, dtype=torch.complex64))
    with pytest.raises(ValueError, match="nbytes"):
        client.buffer(0)
    with pytest.raises(ValueError, match="rank"):
        hsdp.Client(rank=3, world_size=2)


def test_single_rank_collectives_and_work(client):
    x = client.tensor((16,))
    x.copy_(torch.arange(16.0))
    w = client.all_reduce(x, op="avg", async_op=True)
    w.wait(timeout=30)
    assert w.test() and w.exec_ns >= 0
    assert torch.equal(x, torch.arange(16.0))
    y = torch.arange(6, dtype=torch.float64)          # staged
    client.all_reduce(y, premul=2.0, op="premul_sum")
    assert torch.equal(y, torch.arange(6, dtype=torch.float64) * 2)
    assert client.staging.stats()["buffers"] >= 1


def test_staging_pool_reuses_registered_buffers(client):
    for _ in range(20):
        client.all_reduce(torch.ones(1000))
    stats = client.staging.stats()
    assert stats["allocations"] <= 2 and stats["acquisitions"] >= 20


def test_detach_cancels_use(hsdpd):
    c = hsdp.Client(socket_path=hsdpd.socket, job_id="detach-test")
    g = c.world
    c.close()
    t0 = time.monotonic()
    # Refused at once with CANCELLED naming the detach -- not a timeout
    # (DeadlineExceeded would mean the call hung until wait() gave up).
    with pytest.raises(hsdp.Cancelled) as e:
        c.raw.barrier(g).wait(timeout=5)
    assert "detached" in str(e.value)
    assert time.monotonic() - t0 < 1.0


def test_priority_class_from_argument_and_environment(hsdpd, monkeypatch):
    # The session daemon lists no classes: every job is in "default" (level 4),
    # which it may name; a class the daemon does not have is refused, from the
    # argument and from $HSDP_PRIORITY_CLASS, naming the known ones.
    job = f"qos-{os.getpid()}"
    with hsdp.Client(socket_path=hsdpd.socket, job_id=job + "-a",
                     priority_class="default") as c:
        assert c.world.size == 1
    with pytest.raises(hsdp.InvalidArgument) as e:
        hsdp.Client(socket_path=hsdpd.socket, job_id=job + "-b", priority_class="gold")
    assert "priority_class" in str(e.value) and "known: default" in str(e.value)
    monkeypatch.setenv("HSDP_PRIORITY_CLASS", "gold")
    with pytest.raises(hsdp.InvalidArgument):
        hsdp.Client(socket_path=hsdpd.socket, job_id=job + "-c")
    # An explicit argument wins over the environment.
    with hsdp.Client(socket_path=hsdpd.socket, job_id=job + "-d", priority_class="") as c:
        x = c.array((4,), np.float32)
        x.fill(2.0)
        c.all_reduce(x, latency_critical=True)
        assert float(x[0]) == 2.0
