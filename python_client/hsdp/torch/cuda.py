"""CUDA tensors for the hsdpd device path (docs/gpu.md).

What this module does, and only this (the registration RPC and the
descriptors' device fields are wired in the C++ client, see docs/gpu.md):

* ``AllocationHandles`` finds, once per allocation, what the daemon maps: the
  allocation that holds a tensor (``cuMemGetAddressRange``: base and size),
  the legacy IPC handle of its base (``cudaIpcGetMemHandle``) and the GPU's
  UUID (``cuDeviceGetUuid``), through ``cuda-bindings`` (``CudaBindingsDriver``).
  Without cuda-bindings it falls back to torch's ``_share_cuda_`` — once per
  allocation, never per operation: each call re-wraps the storage in
  torch's IPC reference counting, records an interprocess event, and parks
  the block in torch's "limbo" until a consumer releases the counter, which
  the daemon never does (``TorchShareDriver`` releases it at once). torch's
  handle is 66 bytes on torch >= 2.4 (a version byte, the type byte ``'c'``,
  the 64 handle bytes); ``legacy_handle_from_share`` takes the 64 out.
* ``share_spec(tensor, handles)`` turns a CUDA tensor into a ``ShareSpec``:
  the legacy handle of its allocation, the byte offset of the tensor in it,
  its size, device and UUID. Handles stay opaque bytes.
* ``DeviceRegistrations`` keeps one daemon registration per (allocation,
  range), gives each allocation a generation, and holds an *anchor* per
  allocation (a storage inside it): PyTorch's caching allocator returns a
  segment to the driver (``empty_cache``, or when an allocation fails) only
  when every block in it is free, so the anchor keeps memory the daemon has
  open from being freed under it (``cudaFree`` of an IPC-opened allocation
  is undefined behaviour). ``release_all`` frees the registrations first,
  then the anchors.
* ``IpcEventPool`` rotates interprocess events: the trainer records one on
  its current stream before submitting, the daemon's stream waits on it; an
  event is reused only after the operation that used it completed.

Everything here needs torch with CUDA at run time, except the bookkeeping
classes, which take plain bytes and callables (so they are tested on
CPU-only machines with fakes).
"""
import collections
import ctypes
import threading

HANDLE_BYTES = 64
SHARE_HANDLE_BYTES = 66  # torch >= 2.4: version byte, type byte, 64 handle bytes
UUID_BYTES = 16
LEGACY_IPC = "legacy_ipc"
VMM_FD = "vmm_fd"
_TYPE_CUDA_MALLOC = ord("c")
_TYPE_EXPANDABLE = ord("e")


class ShareSpec(collections.namedtuple(
        "ShareSpec", "kind device handle offset_bytes size_bytes uuid",
        defaults=(b"",))):
    """One device range as the daemon registers it (uuid: 16 bytes or b"")."""


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


def legacy_handle_from_share(handle):
    """The 64 cudaIpcMemHandle bytes in the handle torch's ``_share_cuda_`` gives.

    torch >= 2.4 (c10 CUDACachingAllocator ``shareIpcHandle``): a version byte
    (2 in torch's source trees; 3 in torch 2.15.0's binary, whose getIpcDevPtr
    accepts <= 3),
    a type byte (``'c'``: a cudaMalloc block, followed by its 64-byte
    handle; ``'e'``: an expandable segment, another payload), then the
    payload. Older torch: the 64 bytes alone. Raises RuntimeError otherwise.
    """
    if isinstance(handle, (bytearray, memoryview)):
        handle = bytes(handle)
    if not isinstance(handle, bytes):
        raise RuntimeError("share handle: expected bytes, got %s" % type(handle).__name__)
    if len(handle) == HANDLE_BYTES:
        return handle
    if len(handle) >= 2 and handle[1] == _TYPE_EXPANDABLE:
        raise RuntimeError(
            "the tensor lives in an expandable segment, which has no legacy IPC handle: "
            "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")
    if len(handle) == SHARE_HANDLE_BYTES and handle[1] == _TYPE_CUDA_MALLOC:
        return handle[2:]
    raise RuntimeError(
        "share handle: %d bytes (version %s, type %r) is not a legacy CUDA IPC handle "
        "(64 bytes, or 66: version, 'c', 64 bytes)"
        % (len(handle), handle[0] if handle else None, chr(handle[1]) if len(handle) > 1 else None))


class CudaBindingsDriver:
    """The CUDA calls AllocationHandles needs, through cuda-bindings."""

    def __init__(self):
        from cuda.bindings import driver, runtime  # the GPU image has cuda-bindings
        self._driver = driver
        self._runtime = runtime

    @staticmethod
    def _check(err, what):
        if int(err) != 0:
            raise RuntimeError("%s failed: %s" % (what, err))

    def address_range(self, ptr):
        err, base, size = self._driver.cuMemGetAddressRange(ptr)
        self._check(err, "cuMemGetAddressRange")
        return int(base), int(size)

    def ipc_handle(self, base):
        err, h = self._runtime.cudaIpcGetMemHandle(base)
        if int(err) != 0:
            raise RuntimeError(
                "cudaIpcGetMemHandle failed (%s): not a cudaMalloc allocation (expandable "
                "segments? set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)" % (err,))
        return ctypes.string_at(h.getPtr(), HANDLE_BYTES)

    def device_uuid(self, device):
        err, dev = self._driver.cuDeviceGet(device)
        self._check(err, "cuDeviceGet")
        err, u = self._driver.cuDeviceGetUuid(dev)
        self._check(err, "cuDeviceGetUuid")
        return ctypes.string_at(u.getPtr(), UUID_BYTES)


class TorchShareDriver:
    """Fallback without cuda-bindings: torch's ``_share_cuda_``, once per allocation.

    ``locate(tensor) -> (base, size, handle)``; size is None (torch does not
    say; the daemon reads the real size itself). The IPC reference counter
    torch adds is released at once, so the block is not parked forever.
    """

    def locate(self, tensor):
        storage = tensor.untyped_storage()
        shared = storage._share_cuda_()
        handle = legacy_handle_from_share(shared[1])
        storage_offset = int(shared[3])  # of the storage in the allocation
        ref_counter, ref_offset = shared[4], shared[5]
        if ref_counter:
            try:
                type(storage)._release_ipc_counter_cuda(ref_counter, ref_offset)
            except Exception:  # noqa: BLE001 (best effort, as torch's own consumers)
                pass
        return storage.data_ptr() - storage_offset, None, handle

    @staticmethod
    def device_uuid(device):
        import torch
        uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
        if uuid is None:
            return b""
        text = str(uuid).replace("GPU-", "").replace("-", "")
        return bytes.fromhex(text) if len(text) == 2 * UUID_BYTES else b""


class AllocationHandles:
    """Legacy handles per allocation, found once and cached.

    ``driver``: ``address_range(ptr) -> (base, size)``, ``ipc_handle(base) ->
    64 bytes``, ``device_uuid(device) -> 16 bytes`` (CudaBindingsDriver), or
    an object with ``locate(tensor)`` and ``device_uuid`` (TorchShareDriver).
    ``lookup(device, ptr, tensor) -> (base, handle)``. ``forget(device, base)``
    drops an allocation (released to the driver). Thread-safe.
    """

    def __init__(self, driver=None):
        if driver is None:
            try:
                driver = CudaBindingsDriver()
            except ImportError:
                driver = TorchShareDriver()
        self._driver = driver
        self._lock = threading.Lock()
        self._ranges = {}  # device -> {base: (size or None, handle)}
        self._storages = {}  # TorchShareDriver: (device, storage ptr) -> (base, handle)
        self._uuids = {}
        self.lookups = 0   # driver calls made (tests)

    def uuid(self, device):
        with self._lock:
            if device in self._uuids:
                return self._uuids[device]
        u = bytes(self._driver.device_uuid(device))
        with self._lock:
            self._uuids[device] = u
        return u

    def _cached(self, device, ptr):
        for base, (size, handle) in self._ranges.get(device, {}).items():
            if size is not None and base <= ptr < base + size:
                return base, handle
        return None

    def lookup(self, device, ptr, tensor=None):
        located = hasattr(self._driver, "locate")
        storage_key = (device, tensor.untyped_storage().data_ptr()) if located else None
        with self._lock:
            hit = self._storages.get(storage_key) if located else self._cached(device, ptr)
        if hit is not None:
            return hit
        self.lookups += 1
        if located:  # torch's _share_cuda_: once per storage
            base, size, handle = self._driver.locate(tensor)
            with self._lock:
                self._storages[storage_key] = (base, bytes(handle))
        else:
            base, size = self._driver.address_range(ptr)
            handle = bytes(self._driver.ipc_handle(base))
        if len(handle) != HANDLE_BYTES:
            raise RuntimeError("a legacy IPC handle has %d bytes, got %d" % (
                HANDLE_BYTES, len(handle)))
        with self._lock:
            self._ranges.setdefault(device, {})[base] = (size, handle)
        return base, handle

    def forget(self, device, base):
        with self._lock:
            self._ranges.get(device, {}).pop(base, None)
            for k in [k for k, v in self._storages.items() if k[0] == device and v[0] == base]:
                del self._storages[k]

    def forget_all(self):
        """After the anchors went: an address may now name new memory."""
        with self._lock:
            self._ranges.clear()
            self._storages.clear()


def share_spec(tensor, handles=None):
    """The ShareSpec of a CUDA tensor: its allocation's legacy IPC handle, the
    tensor's byte offset in that allocation, its size, device and UUID.

    Raises TypeError for a non-CUDA tensor and RuntimeError when no legacy
    handle exists for it (e.g. expandable segments).
    """
    if getattr(getattr(tensor, "device", None), "type", None) != "cuda":
        raise TypeError("share_spec: expected a CUDA tensor, got %s" % (
            getattr(tensor, "device", type(tensor).__name__)))
    if not tensor.is_contiguous():
        raise RuntimeError("share_spec: the tensor must be contiguous")
    if handles is None:
        handles = AllocationHandles()
    device = tensor.device.index
    ptr = tensor.data_ptr()
    base, handle = handles.lookup(device, ptr, tensor)
    return ShareSpec(LEGACY_IPC, int(device), handle, ptr - base,
                     tensor.numel() * tensor.element_size(), handles.uuid(device))


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
        self._anchors = {}  # (device, handle) -> a storage inside the allocation

    def buffer_for(self, spec, anchor=None):
        """The buffer id of `spec`, registering it the first time. `anchor`
        (a storage inside the allocation) is kept while the allocation has
        registrations, so the allocator cannot return it to the driver."""
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
            if anchor is not None:
                self._anchors.setdefault((spec.device, spec.handle), anchor)
        if first != buffer_id:
            self._free(buffer_id)
        return first

    def anchored(self):
        """Allocations held open for the daemon (their count)."""
        with self._lock:
            return len(self._anchors)

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
        with self._lock:  # only once the daemon closed it
            self._anchors.pop((device, handle), None)
        return len(ids)

    def clear(self):
        """Frees every registration, then lets go of the anchors (the
        allocations may go back to the driver afterwards, never before)."""
        with self._lock:
            ids = list(self._ids.values())
            self._ids.clear()
        for buffer_id in ids:
            self._free(buffer_id)
        with self._lock:
            self._anchors.clear()

    release_all = clear

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
