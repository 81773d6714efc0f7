"""The CUDA side of the Python client (hsdp.torch.cuda).

The bookkeeping (registration cache with allocation generations, the
interprocess event pool) runs everywhere. The parts that need a GPU — real
CUDA tensors exported through torch's caching allocator — skip with the
reason on CPU-only machines (CI runs torch 1.13 CPU).
"""
import importlib.util
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "python_client", "hsdp", "torch", "cuda.py")


def _load():
    # The module needs only torch (lazily): load it from the source tree so
    # this test does not depend on the compiled client.
    spec = importlib.util.spec_from_file_location("hsdp_torch_cuda", SRC)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cuda = _load()


def _spec(handle=b"a" * 64, offset=0, size=1024, device=0):
    return cuda.ShareSpec(cuda.LEGACY_IPC, device, handle, offset, size)


class FakeClient:
    def __init__(self):
        self.next = 1
        self.registered = {}
        self.freed = []

    def register(self, spec, generation):
        bid = (1 << 62) | self.next
        self.next += 1
        self.registered[bid] = (spec, generation)
        return bid

    def free(self, bid):
        self.freed.append(bid)


def test_same_range_registers_once_and_ranges_of_one_allocation_are_separate():
    c = FakeClient()
    regs = cuda.DeviceRegistrations(c.register, c.free)
    a = regs.buffer_for(_spec(offset=0))
    assert regs.buffer_for(_spec(offset=0)) == a
    b = regs.buffer_for(_spec(offset=1024))
    assert b != a
    assert len(c.registered) == 2 and len(regs) == 2
    assert all(gen == 0 for _, gen in c.registered.values())


def test_a_reused_handle_gets_a_new_generation_and_stale_buffers_are_freed():
    c = FakeClient()
    regs = cuda.DeviceRegistrations(c.register, c.free)
    old = regs.buffer_for(_spec())
    other = regs.buffer_for(_spec(handle=b"b" * 64))
    assert regs.forget_allocation(0, b"a" * 64) == 1
    assert c.freed == [old]
    new = regs.buffer_for(_spec())
    assert new != old
    assert c.registered[new][1] == 1  # the daemon sees a new identity
    assert regs.buffer_for(_spec(handle=b"b" * 64)) == other  # untouched
    regs.clear()
    assert sorted(c.freed) == sorted([old, new, other])


def test_event_pool_never_hands_out_an_event_in_flight():
    made = []

    def make():
        made.append(object())
        return made[-1], bytes([len(made)]) * 64

    ids = iter(range(100, 200))
    pool = cuda.IpcEventPool(make, lambda handle: next(ids), limit=2)
    e1, id1 = pool.acquire()
    e2, id2 = pool.acquire()
    assert id1 != id2 and e1 is not e2
    with pytest.raises(RuntimeError, match="in flight"):
        pool.acquire()
    pool.release(id1)
    e3, id3 = pool.acquire()
    assert (e3, id3) == (e1, id1)  # reused only after release
    with pytest.raises(KeyError):
        pool.release(12345)
    pool.release(id2)
    with pytest.raises(RuntimeError, match="twice"):
        pool.release(id2)
    assert pool.size() == 2


def test_event_pool_checks_handle_size():
    pool = cuda.IpcEventPool(lambda: (object(), b"short"), lambda h: 1)
    with pytest.raises(RuntimeError, match="64"):
        pool.acquire()


def test_share_spec_refuses_cpu_tensors():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="CUDA tensor"):
        cuda.share_spec(torch.zeros(4))


def test_share_spec_of_a_cuda_tensor_names_its_allocation_and_offset():
    ok, why = cuda.cuda_available()
    if not ok:
        pytest.skip("no GPU: " + why)
    import torch
    base = torch.zeros(1 << 20, device="cuda")
    view = base[1000:2000]
    whole = cuda.share_spec(base)
    part = cuda.share_spec(view)
    assert whole.kind == cuda.LEGACY_IPC and len(whole.handle) == 64
    assert part.handle == whole.handle  # one allocation, one handle
    assert part.offset_bytes == whole.offset_bytes + 1000 * 4
    assert part.size_bytes == 1000 * 4
    make = cuda.torch_event_factory(0)
    event, handle = make()
    assert len(handle) == 64


# --- torch's 66-byte handle, handles per allocation,
# anchors, the CudaWork's lifetime and stream-wait order ----------------------

def test_share_handle_of_torch_2_4_and_later_is_66_bytes():
    payload = bytes(range(64))
    for version in (2, 3):  # torch's source trees write 2, torch 2.15.0's binary 3 ('c' alike)
        assert cuda.legacy_handle_from_share(bytes([version]) + b"c" + payload) == payload
    assert cuda.legacy_handle_from_share(payload) == payload  # torch before versioning
    with pytest.raises(RuntimeError, match="expandable"):
        cuda.legacy_handle_from_share(b"\x02e" + b"x" * 80)
    with pytest.raises(RuntimeError, match="not a legacy"):
        cuda.legacy_handle_from_share(b"\x02c" + payload + b"extra")


class FakeDevice:
    def __init__(self, index):
        self.type = "cuda"
        self.index = index


class FakeStorage:
    released = []

    def __init__(self, ptr, alloc_offset, handle66):
        self.ptr = ptr
        self.alloc_offset = alloc_offset
        self.handle66 = handle66
        self.shared = 0

    def data_ptr(self):
        return self.ptr

    def _share_cuda_(self):
        self.shared += 1
        return (0, self.handle66, 4096, self.alloc_offset, b"/torch_123_456", 7,
                b"\0" * 64, True)

    @classmethod
    def _release_ipc_counter_cuda(cls, handle, offset):
        cls.released.append((handle, offset))


class FakeTensor:
    def __init__(self, ptr, nbytes, device=0, storage=None):
        self.device = FakeDevice(device)
        self._ptr = ptr
        self._nbytes = nbytes
        self._storage = storage

    def is_contiguous(self):
        return True

    def data_ptr(self):
        return self._ptr

    def numel(self):
        return self._nbytes // 4

    def element_size(self):
        return 4

    def untyped_storage(self):
        return self._storage


class FakeDriver:
    """cuMemGetAddressRange / cudaIpcGetMemHandle / cuDeviceGetUuid over a table."""

    def __init__(self, allocations):
        self.allocations = allocations  # base -> size
        self.handle_calls = 0

    def address_range(self, ptr):
        for base, size in self.allocations.items():
            if base <= ptr < base + size:
                return base, size
        raise RuntimeError("not an allocation")

    def ipc_handle(self, base):
        self.handle_calls += 1
        return base.to_bytes(8, "little") * 8

    def device_uuid(self, device):
        return bytes([0xA0 + device]) * 16


def test_handles_are_found_once_per_allocation_with_base_and_offset():
    drv = FakeDriver({0x10000: 0x20000, 0x80000: 0x1000})
    handles = cuda.AllocationHandles(drv)
    a = cuda.share_spec(FakeTensor(0x10000 + 256, 1024), handles)
    b = cuda.share_spec(FakeTensor(0x10000 + 0x8000, 4096), handles)
    c = cuda.share_spec(FakeTensor(0x80000 + 16, 64), handles)
    for _ in range(10):  # per op: no driver call at all
        cuda.share_spec(FakeTensor(0x10000 + 256, 1024), handles)
    assert drv.handle_calls == 2 and handles.lookups == 2
    assert a.handle == b.handle != c.handle and len(a.handle) == 64
    assert (a.offset_bytes, b.offset_bytes, c.offset_bytes) == (256, 0x8000, 16)
    assert a.size_bytes == 1024 and a.uuid == bytes([0xA0]) * 16


def test_torch_fallback_shares_once_per_storage_and_releases_torchs_counter():
    payload = bytes(range(64))
    storage = FakeStorage(ptr=0x5000 + 4096, alloc_offset=4096, handle66=b"\x03c" + payload)

    class Driver(cuda.TorchShareDriver):
        @staticmethod
        def device_uuid(device):
            return b"u" * 16

    FakeStorage.released.clear()
    handles = cuda.AllocationHandles(Driver())
    spec = cuda.share_spec(FakeTensor(0x5000 + 4096 + 64, 256, storage=storage), handles)
    cuda.share_spec(FakeTensor(0x5000 + 4096, 64, storage=storage), handles)
    assert spec.handle == payload  # the 64 bytes out of torch's 66
    assert spec.offset_bytes == 4096 + 64  # from the allocation base
    assert storage.shared == 1  # _share_cuda_ once, not per op
    assert FakeStorage.released == [(b"/torch_123_456", 7)]  # not parked in torch's limbo


def test_registrations_anchor_the_allocation_until_the_daemon_closed_it():
    import weakref

    class Anchor:
        pass

    c = FakeClient()
    order = []
    regs = cuda.DeviceRegistrations(c.register, lambda bid: order.append(("free", regs.anchored())))
    anchor = Anchor()
    ref = weakref.ref(anchor)
    regs.buffer_for(_spec(offset=0), anchor=anchor)
    regs.buffer_for(_spec(offset=1024), anchor=Anchor())  # same allocation: one anchor
    del anchor
    assert ref() is not None and regs.anchored() == 1
    regs.release_all()
    assert order == [("free", 1), ("free", 1)]  # registrations freed while still anchored
    assert regs.anchored() == 0 and ref() is None


def _cuda_ops():
    pytest.importorskip("torch")
    try:
        from hsdp.torch import cuda_ops
    except ImportError as e:
        pytest.skip("hsdp package not importable: %s" % e)
    return cuda_ops


class FakeRawWork:
    def __init__(self, event_id):
        self.event_id = event_id
        self.inside = False
        self.done = False

    def test(self):
        return self.done

    def exception(self):
        return None

    def wait(self, timeout=None):
        self.done = True

    def wait_on_stream(self, stream_wait, timeout=None):
        self.done = True
        self.inside = True
        try:
            stream_wait(self.event_id)
        finally:
            self.inside = False


class FakeEvent:
    def __init__(self, raw):
        self.raw = raw
        self.waits = []

    def wait(self, stream):
        self.waits.append((stream, self.raw.inside))


class FakePath:
    def __init__(self, raw):
        self.event = FakeEvent(raw)
        self.released = []

    def completion_event(self, device, event_id):
        return self.event if event_id == 3 else None

    def release_event(self, device, event_id):
        self.released.append(event_id)


def test_cuda_work_enqueues_the_stream_wait_before_the_slot_is_reused(monkeypatch):
    cuda_ops = _cuda_ops()
    import torch
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")
    raw = FakeRawWork(event_id=3)
    path = FakePath(raw)
    work = cuda_ops.CudaWork(raw, path, 0, 42, [object()], ["out"], 5.0)
    assert work.wait() is True
    # The wait was enqueued inside Work.wait_on_stream, i.e. while the op
    # that reuses completion slot 3 cannot be submitted.
    assert path.event.waits == [("stream", True)]
    assert path.released == [42]


def test_cuda_work_keeps_inputs_and_outputs_until_done(monkeypatch):
    import weakref
    cuda_ops = _cuda_ops()
    import torch
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: "stream")

    class T:
        pass

    raw = FakeRawWork(event_id=0)
    inp, out = T(), T()
    in_ref = weakref.ref(inp)
    work = cuda_ops.CudaWork(raw, FakePath(raw), 0, 1, [inp], [out], 5.0)
    del inp
    assert in_ref() is not None  # the daemon may still read it
    work.wait()
    assert in_ref() is None  # released once done
    assert work.result() == [out]
