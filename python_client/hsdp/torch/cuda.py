"""CUDA tensors for the hsdpd device path (docs/gpu.md).

What this module does, and only this (the registration RPC and the
descriptors' device fields are wired in the C++ client, see docs/gpu.md):

* ``share_spec(tensor)`` turns a CUDA tensor from PyTorch's caching allocator
  into what the daemon maps: the legacy IPC handle of the allocation the
  tensor lives in (``cudaIpcGetMemHandle`` of the block base, as torch's own
  ``_share_cuda_`` exports it), the byte offset of the tensor in that
  allocation, its size and device. Handles stay opaque bytes.
* ``DeviceRegistrations`` keeps one daemon registration per (allocation,
  range) and gives each allocation a generation: when the caching allocator
  hands the same handle out for a new allocation after ``empty_cache()``,
  ``forget_allocation`` bumps the generation so the daemon never reuses a
  stale mapping (the daemon keys its cache by handle bytes + generation).
* ``IpcEventPool`` rotates interprocess events: the trainer records one on
  its current stream before submitting, the daemon's stream waits on it; an
  event is reused only after the operation that used it completed (a
  re-recorded event could otherwise make the daemon wait for a later
  producer).

Everything here needs torch with CUDA at run time, except the bookkeeping
classes, which take plain bytes and callables (so they are tested on
CPU-only machines).
"""
import collections
import threading

HANDLE_BYTES = 64
LEGACY_IPC = "legacy_ipc"
VMM_FD = "vmm_fd"


class ShareSpec(collections.namedtuple(
        "ShareSpec", "kind device handle offset_bytes size_bytes")):
    """One device range as the daemon registers it."""


def cuda_available():
    """(True, "") when CUDA tensors can be shared, else (False, reason)."""
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, "torch.cuda.is_available() is False (no GPU or a CPU-only torch %s)" % (
            torch.__version__)
    return True, ""


def share_spec(tensor):
    """The ShareSpec of a CUDA tensor (legacy IPC handle of its allocation).

    Raises TypeError for a non-CUDA tensor and RuntimeError when torch cannot
    export a legacy handle for it (e.g. expandable segments).
    """
    import torch
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cuda":
        raise TypeError("share_spec: expected a CUDA tensor, got %s" % (
            getattr(tensor, "device", type(tensor).__name__)))
    if not tensor.is_contiguous():
        raise RuntimeError("share_spec: the tensor must be contiguous")
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    shared = storage._share_cuda_()
    # (device, handle, storage bytes, storage offset in the allocation, ...)
    device, handle, _storage_bytes, storage_offset = shared[0], shared[1], shared[2], shared[3]
    if not isinstance(handle, (bytes, bytearray)) or len(handle) != HANDLE_BYTES:
        raise RuntimeError(
            "share_spec: torch exported a %s-byte handle, not a %d-byte legacy IPC handle "
            "(expandable segments? set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)"
            % (len(handle) if handle is not None else "missing", HANDLE_BYTES))
    offset = int(storage_offset) + tensor.storage_offset() * tensor.element_size()
    return ShareSpec(LEGACY_IPC, int(device), bytes(handle), offset,
                     tensor.numel() * tensor.element_size())


class DeviceRegistrations:
    """One registration per (device, handle, generation, offset, size).

    ``register(spec, generation) -> buffer_id`` and ``free(buffer_id)`` are the
    client's calls (injected). Thread-safe.
    """

    def __init__(self, register, free):
        self._register = register
        self._free = free
        self._lock = threading.Lock()
        self._generation = {}  # (device, handle) -> generation
        self._ids = {}  # (device, handle, generation, offset, size) -> buffer id

    def buffer_for(self, spec):
        """The buffer id of `spec`, registering it the first time."""
        with self._lock:
            gen = self._generation.setdefault((spec.device, spec.handle), 0)
            key = (spec.device, spec.handle, gen, spec.offset_bytes, spec.size_bytes)
            found = self._ids.get(key)
        if found is not None:
            return found
        buffer_id = self._register(spec, gen)
        with self._lock:
            # Another thread may have raced us: keep the first, free ours.
            first = self._ids.setdefault(key, buffer_id)
        if first != buffer_id:
            self._free(buffer_id)
        return first

    def forget_allocation(self, device, handle):
        """The allocation behind `handle` was released (torch.cuda.empty_cache):
        free its registrations and start a new generation for the handle."""
        with self._lock:
            gen = self._generation.get((device, handle), 0)
            self._generation[(device, handle)] = gen + 1
            stale = [k for k in self._ids if k[0] == device and k[1] == handle and k[2] == gen]
            ids = [self._ids.pop(k) for k in stale]
        for buffer_id in ids:
            self._free(buffer_id)
        return len(ids)

    def clear(self):
        with self._lock:
            ids = list(self._ids.values())
            self._ids.clear()
        for buffer_id in ids:
            self._free(buffer_id)

    def __len__(self):
        with self._lock:
            return len(self._ids)


class IpcEventPool:
    """Interprocess producer events, each registered with the daemon once.

    ``make_event() -> (event, handle_bytes)``, ``register(handle) -> event_id``
    are injected. ``acquire()`` returns (event, event_id) not used by any
    operation in flight; ``release(event_id)`` when its operation completed.
    Grows up to ``limit`` events; beyond that ``acquire`` raises RuntimeError
    (too many operations in flight for the pool).
    """

    def __init__(self, make_event, register, limit=256):
        self._make_event = make_event
        self._register = register
        self._limit = limit
        self._lock = threading.Lock()
        self._free = collections.deque()
        self._all = {}  # event id -> event

    def acquire(self):
        with self._lock:
            if self._free:
                event_id = self._free.popleft()
                return self._all[event_id], event_id
            if len(self._all) >= self._limit:
                raise RuntimeError(
                    "IpcEventPool: %d device operations in flight; wait for some to complete"
                    % self._limit)
        event, handle = self._make_event()
        if len(handle) != HANDLE_BYTES:
            raise RuntimeError("IpcEventPool: an event handle has %d bytes, not %d"
                               % (len(handle), HANDLE_BYTES))
        event_id = self._register(bytes(handle))
        with self._lock:
            self._all[event_id] = event
        return event, event_id

    def release(self, event_id):
        with self._lock:
            if event_id not in self._all:
                raise KeyError("IpcEventPool: unknown event id %r" % (event_id,))
            if event_id in self._free:
                raise RuntimeError("IpcEventPool: event %r released twice" % (event_id,))
            self._free.append(event_id)

    def size(self):
        with self._lock:
            return len(self._all)


def torch_event_factory(device):
    """make_event for IpcEventPool on torch: an interprocess, timing-free event."""
    import torch

    def make():
        event = torch.cuda.Event(interprocess=True, enable_timing=False)
        with torch.cuda.device(device):
            event.record(torch.cuda.current_stream(device))  # ipc_handle() needs a recorded event
        return event, event.ipc_handle()

    return make
