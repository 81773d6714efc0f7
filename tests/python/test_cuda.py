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
