"""The device-memory calls of the Python client against a real hsdpd on the
fake device (engine.device: fake, TEST ONLY): "device memory" is a memfd this
process owns, passed as a VMM handle; producer events are fake shared event
blocks in /dev/shm (the format of daemon/device/fake_shm.h). On a CUDA
machine the torch backend test submits real CUDA tensors; here it skips.
"""
import mmap
import os
import struct
import tempfile

import pytest

from cluster_util import queued_ops
from conftest import Daemon
from waiting import wait_until

EVENT_MAGIC = 0x544E5645484D5346  # "FSHMEVNT", fake_shm.h kEventMagic


def _hsdpd_binary():
    build = os.environ.get("HSDP_BUILD_DIR", os.path.join(os.path.dirname(__file__), "..", "..",
                                                          "build"))
    return os.path.join(os.path.abspath(build), "bin", "hsdpd")


@pytest.fixture
def fake_device_daemon():
    tmp = tempfile.mkdtemp(prefix="hsdp-pydev.")
    cfg = os.path.join(tmp, "node.yaml")
    with open(cfg, "w") as f:
        f.write("engine:\n  kind: nccl\n  device: fake\n  threads: 1\n")
    d = Daemon(_hsdpd_binary(), tmp, ["--node-config", cfg])
    yield d
    d.stop()


class FakeEvent:
    """A producer event the fake device understands (two u64 counters)."""

    def __init__(self):
        self.name = "/hsdp-fakeev-py%d-%d" % (os.getpid(), id(self) % 100000)
        self.path = "/dev/shm" + self.name
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, 16)
        self.map = mmap.mmap(fd, 16)
        os.close(fd)
        raw = struct.pack("<Q", EVENT_MAGIC) + self.name.encode() + b"\0"
        self.handle = raw + b"\0" * (64 - len(raw))

    def record(self):
        rec, = struct.unpack_from("<Q", self.map, 0)
        struct.pack_into("<Q", self.map, 0, rec + 1)

    def complete(self):
        rec, = struct.unpack_from("<Q", self.map, 0)
        struct.pack_into("<Q", self.map, 8, rec)

    def close(self):
        self.map.close()
        os.unlink(self.path)


def test_device_buffers_and_producer_event_through_the_bindings(fake_device_daemon):
    from hsdp import _hsdp
    from hsdp.errors import InvalidArgument
    c = _hsdp.Client(socket_path=fake_device_daemon.socket, job_id="pydev", device="cuda:0")
    assert c.device_memory
    nbytes = 1 << 16
    fd = os.memfd_create("hsdp-fake-device-py")
    os.ftruncate(fd, nbytes)
    mem = mmap.mmap(fd, nbytes)
    buf = c.register_device_buffer(kind="vmm_fd", device=0, fd=fd, allocation_bytes=nbytes,
                                   size=nbytes, generation=1)
    assert buf & (1 << 62)
    events = c.completion_events(0)
    assert len(events) > 0 and all(len(h) == 64 for h in events)
    g = c.new_group([0])
    ev = FakeEvent()
    try:
        ev_id = c.register_device_event(0, ev.handle)
        struct.pack_into("<4f", mem, 0, -1, -1, -1, -1)  # what a premature read would see
        ev.record()
        w = c.all_reduce(g, (buf, 0), (buf, 4096), 4, "float32", wait_event=ev_id)
        # The daemon holds the operation (behind the producer event) before we look.
        wait_until(lambda: (queued_ops(fake_device_daemon.socket) or 0) >= 1, 30,
                   "the all_reduce never reached the daemon")
        assert not w.test(), "the collective ran before its producer event completed"
        struct.pack_into("<4f", mem, 0, 1.5, 2.5, 3.5, 4.5)
        ev.complete()
        w.wait(30)
        assert struct.unpack_from("<4f", mem, 4096) == (1.5, 2.5, 3.5, 4.5)
        assert 1 <= w.completion_event_id <= len(events)
        # wait_on_stream hands the completion event id to the callback (the
        # stream wait is enqueued inside it); its error
        # comes back as raised.
        seen = []
        w.wait_on_stream(seen.append, 30)
        assert seen == [w.completion_event_id]
        w2 = c.all_reduce(g, (buf, 0), (buf, 4096), 4, "float32")

        def boom(event_id):
            raise ValueError("stream wait failed %d" % event_id)

        with pytest.raises(ValueError, match="stream wait failed"):
            w2.wait_on_stream(boom, 30)
        # The GPU named by UUID (trainers and the daemon may number GPUs differently): the fake daemon's GPU 0.
        uuid = b"hsdp-fake-gpu" + bytes([0, 0, 0])
        assert len(c.completion_events(5, device_uuid=uuid)) == len(events)
        with pytest.raises(InvalidArgument, match="GPU-5a5a5a5a"):
            c.completion_events(0, device_uuid=b"\x5a" * 16)
        c.free_device_event(ev_id)
    finally:
        ev.close()
    # Errors keep their types and messages.
    with pytest.raises(InvalidArgument, match="outside device buffer"):
        c.all_reduce(g, (buf, nbytes - 4), (buf, 0), 4, "float32")
    with pytest.raises(InvalidArgument, match="kind"):
        c.register_device_buffer(kind="opaque", device=0, size=4)
    c.free_device_buffer(buf)
    c.detach()
    mem.close()
    os.close(fd)


def test_cuda_tensors_through_the_torch_backend():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA: torch %s sees no GPU (the device path of the torch backend runs "
                    "only on a GPU machine: tools/scripts/run_gpu_tests.sh)" % torch.__version__)
    pytest.skip("run by tools/scripts/run_gpu_tests.sh against a daemon with engine.kind: nccl")


def test_cuda_path_needs_device_memory():
    # A CUDA tensor on a session without device memory (a CPU-only daemon)
    # gets a clear error naming the fix, before anything is submitted.
    from hsdp.torch.cuda_ops import CudaPath

    class Raw:
        device_memory = False

    class FakeClient:
        raw = Raw()

    with pytest.raises(RuntimeError, match="engine.kind: nccl"):
        CudaPath(FakeClient(), None, 10.0)
