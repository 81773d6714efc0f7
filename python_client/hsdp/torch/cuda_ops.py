"""CUDA tensors in the torch backend: submission through the daemon's device path.

ProcessGroupHsdp hands CUDA tensors here (all-reduce, all-gather into a
tensor, reduce-scatter from a tensor, broadcast). For each operation:

1. every tensor becomes a device buffer of the daemon: its allocation's
   legacy IPC handle (found once per allocation by ``AllocationHandles``,
   never by calling torch's ``_share_cuda_`` per op) + its offset, registered
   once per range by ``DeviceRegistrations``, which also anchors the
   allocation so the caching allocator never frees memory the daemon has
   open; every request names the GPU by UUID (the daemon may number GPUs
   differently);
2. an interprocess event from ``IpcEventPool`` (pooled: none is created per
   op) is recorded on the current stream and passed as ``wait_event``: the
   daemon's stream waits on it, so the collective never reads before the
   producer kernels finished, and the trainer never synchronises its stream
   on the CPU;
3. the returned ``CudaWork`` keeps the inputs and outputs alive until the
   operation is done; its ``wait()`` makes the current stream wait on the
   daemon's completion event of the operation, enqueued through
   ``Work.wait_on_stream`` before the op that reuses that event can be
   submitted, then frees the producer event for reuse.

No CUDA type crosses into the client library: handles are bytes. Nothing
here has run on a GPU yet (docs/gpu.md, "Never run on a GPU").
"""
import threading

import torch
import torch.distributed as dist

from hsdp.dtypes import hsdp_dtype
from hsdp.torch import reduce_ops
from hsdp.torch.cuda import (AllocationHandles, DeviceRegistrations, IpcEventPool, share_spec,
                             torch_event_factory)


class CudaWork(dist.Work):
    """Work of a device operation: wait() orders the current CUDA stream after it.

    Holds the operation's inputs and outputs until it is done: the daemon
    reads and writes them on its stream, so their memory must not be reused
    by the caching allocator before."""

    def __init__(self, raw, path, device, event_id, inputs, outputs, timeout_s):
        super().__init__()
        self._raw = raw
        self._path = path
        self._device = device
        self._event_id = event_id
        self._inputs = inputs
        self._outputs = outputs
        self._timeout_s = timeout_s
        self._released = False
        self._lock = threading.Lock()

    def is_completed(self):
        return self._raw.test()

    def is_success(self):
        return self._raw.test() and self._raw.exception() is None

    def _release(self):
        with self._lock:
            if not self._released:
                self._released = True
                self._path.release_event(self._device, self._event_id)
                self._inputs = None  # the daemon is done with them

    def wait(self, timeout=None):
        """Makes the current stream wait for the operation (the daemon records
        its completion event once the collective is done); True. The stream
        wait is enqueued before the op that reuses the completion event can
        be submitted (Work.wait_on_stream), so it never waits on a later op."""
        stream = torch.cuda.current_stream(self._device)

        def stream_wait(event_id):
            event = self._path.completion_event(self._device, event_id)
            if event is not None:
                event.wait(stream)

        try:
            self._raw.wait_on_stream(stream_wait, self._timeout_s)  # raises the op's error
        finally:
            if self._raw.test():
                self._release()
        return True

    def synchronize(self):
        self.wait()
        torch.cuda.current_stream(self._device).synchronize()

    def result(self):
        return self._outputs


class CudaPath:
    """The device path of one ProcessGroupHsdp."""

    def __init__(self, client, group, timeout_s):
        raw = client.raw
        if not raw.device_memory:
            raise RuntimeError(
                "hsdpd backend: CUDA tensor, but this session has no device memory: the "
                "node's hsdpd runs no device engine (engine.kind: nccl or auto with a GPU; "
                "docs/gpu.md)")
        self._raw = raw
        self._group = group
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._regs = DeviceRegistrations(self._register, raw.free_device_buffer)
        self._handles = AllocationHandles()
        self._pools = {}       # device -> IpcEventPool
        self._completion = {}  # device -> [torch.cuda.Event] by slot

    def _register(self, spec, generation):
        return self._raw.register_device_buffer(
            kind=spec.kind, device=spec.device, handle=spec.handle, offset=spec.offset_bytes,
            size=spec.size_bytes, generation=generation, device_uuid=spec.uuid)

    def _pool(self, device):
        with self._lock:
            pool = self._pools.get(device)
            if pool is None:
                uuid = self._handles.uuid(device)
                pool = IpcEventPool(
                    torch_event_factory(device),
                    lambda h: self._raw.register_device_event(device, h, device_uuid=uuid))
                self._pools[device] = pool
                # Ask for the completion events before the first submission
                # on this device (ops submitted earlier carry none).
                self._completion[device] = [
                    torch.cuda.Event.from_ipc_handle(device, h)
                    for h in self._raw.completion_events(device, device_uuid=uuid)]
            return pool

    def completion_event(self, device, event_id):
        events = self._completion.get(device, [])
        if event_id <= 0 or event_id > len(events):
            return None
        return events[event_id - 1]

    def release_event(self, device, event_id):
        self._pools[device].release(event_id)

    def ref(self, t):
        return (self._regs.buffer_for(share_spec(t, self._handles), anchor=t.untyped_storage()), 0)

    def release_memory(self):
        """Lets the caching allocator free what the daemon has open: frees
        every registration (the daemon closes the allocations), then the
        anchors. Call before torch.cuda.empty_cache() when memory is tight;
        no operation may be in flight."""
        self._regs.release_all()
        self._handles.forget_all()

    def submit(self, tensors, outputs, submit):
        """Records a producer event on the current stream of the tensors'
        device, then `submit(refs, wait_event)` -> raw work."""
        device = tensors[0].device.index
        for t in tensors:
            if t.device.type != "cuda" or t.device.index != device:
                raise RuntimeError("hsdpd backend: every tensor of one operation must be on "
                                   f"one CUDA device (got {t.device} and cuda:{device})")
        refs = [self.ref(t) for t in tensors]
        pool = self._pool(device)
        event, event_id = pool.acquire()
        event.record(torch.cuda.current_stream(device))
        try:
            raw = submit(refs, event_id)
        except BaseException:
            pool.release(event_id)
            raise
        return CudaWork(raw, self, device, event_id, list(tensors), outputs, self._timeout_s)

    # -- the collectives ProcessGroupHsdp routes here ---------------------------
    def allreduce(self, t, op):
        name, premul = reduce_ops.to_hsdp(op, "allreduce")
        dt = _dtype(t)
        return self.submit([t], [t], lambda r, ev: self._raw.all_reduce(
            self._group, r[0], r[0], t.numel(), dt, op=name, premul=premul, wait_event=ev))

    def all_gather_into_tensor(self, output, input_):  # noqa: A002
        dt = _dtype(input_)
        return self.submit([input_, output], [output], lambda r, ev: self._raw.all_gather(
            self._group, r[0], r[1], input_.numel(), dt, wait_event=ev))

    def reduce_scatter_tensor(self, output, input_, op):
        name, premul = reduce_ops.to_hsdp(op, "reduce_scatter")
        dt = _dtype(output)
        return self.submit([input_, output], [output], lambda r, ev: self._raw.reduce_scatter(
            self._group, r[0], r[1], output.numel(), dt, op=name, premul=premul, wait_event=ev))

    def broadcast(self, t, root):
        dt = _dtype(t)
        return self.submit([t], [t], lambda r, ev: self._raw.broadcast(
            self._group, r[0], r[0], t.numel(), dt, root, wait_event=ev))

    def close(self):
        self.release_memory()


def _dtype(t):
    name = hsdp_dtype(t.dtype)
    if name is None:
        raise TypeError(f"hsdpd backend: dtype {t.dtype} is not supported on device buffers")
    if not t.is_contiguous():
        raise RuntimeError("hsdpd backend: CUDA tensors must be contiguous")
    return name
