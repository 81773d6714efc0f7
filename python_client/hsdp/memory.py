"""Shared-memory bookkeeping of one session: which addresses belong to hsdpd
buffers (for zero-copy detection) and a pool of staging buffers.

Thread-safety: BufferRegistry and StagingPool may be used from several
threads (the torch backend completes operations on helper threads).
"""
import bisect
import threading

import numpy as np

try:
    import torch
    import torch.utils.dlpack
except ImportError:  # pragma: no cover
    torch = None

# Staged regions are aligned so any dtype view of them is aligned.
ALIGN = 512


def align_up(n, a=ALIGN):
    return (n + a - 1) // a * a


def is_torch(x):
    return torch is not None and isinstance(x, torch.Tensor)


def address_of(x):
    """(address, nbytes) of a torch tensor's or numpy array's first element."""
    if is_torch(x):
        return x.data_ptr(), x.numel() * x.element_size()
    return x.__array_interface__["data"][0], x.nbytes


def is_contiguous(x):
    return x.is_contiguous() if is_torch(x) else x.flags.c_contiguous


def torch_view(buf, offset, nbytes, dtype=None, shape=None, keepalive=None):
    """A torch tensor over [offset, offset + nbytes) of `buf` (zero-copy)."""
    u8 = torch.utils.dlpack.from_dlpack(buf.dlpack(offset, nbytes, "uint8", None, keepalive))
    if dtype is not None and dtype != torch.uint8:
        u8 = u8.view(dtype)
    return u8 if shape is None else u8.view(shape)


def numpy_view(buf, offset, nbytes, dtype=np.uint8, shape=None):
    """A numpy array over [offset, offset + nbytes) of `buf` (zero-copy)."""
    dtype = np.dtype(dtype)
    arr = np.frombuffer(buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
    return arr if shape is None else arr.reshape(shape)


class BufferRegistry:
    """Address ranges of registered buffers -> (buffer, offset) lookups."""

    def __init__(self):
        self._lock = threading.Lock()
        self._starts = []
        self._bufs = []

    def add(self, buf):
        with self._lock:
            i = bisect.bisect(self._starts, buf.address)
            self._starts.insert(i, buf.address)
            self._bufs.insert(i, buf)

    def remove(self, buf):
        with self._lock:
            for i, b in enumerate(self._bufs):
                if b is buf:
                    del self._starts[i], self._bufs[i]
                    return

    def locate(self, address, nbytes):
        """(buffer, offset) when [address, address + nbytes) lies in one buffer."""
        with self._lock:
            i = bisect.bisect(self._starts, address) - 1
            if i < 0:
                return None
            buf = self._bufs[i]
        off = address - buf.address
        if off + nbytes <= buf.nbytes and not buf.freed:
            return buf, off
        return None

    def locate_array(self, x):
        """(buffer, offset) for a contiguous tensor/array living in a buffer, else None."""
        if is_torch(x) and x.device.type != "cpu":
            return None
        if not is_contiguous(x):
            return None
        addr, nbytes = address_of(x)
        return self.locate(addr, nbytes)


class Lease:
    """Exclusive use of one staging buffer until released to its pool."""

    __slots__ = ("pool", "buffer", "nbytes", "_u8")

    def __init__(self, pool, buffer, u8):
        self.pool = pool
        self.buffer = buffer
        self.nbytes = buffer.nbytes
        self._u8 = u8

    def u8(self, offset=0, nbytes=None):
        """A uint8 torch tensor (or numpy array without torch) over part of the lease."""
        end = self.nbytes if nbytes is None else offset + nbytes
        return self._u8[offset:end]

    def view(self, dtype, numel, offset=0):
        """A 1-D view of `numel` elements of `dtype` at byte `offset`."""
        if is_torch(self._u8):
            size = torch.empty((), dtype=dtype).element_size()
            return self._u8[offset:offset + numel * size].view(dtype)
        dtype = np.dtype(dtype)
        return self._u8[offset:offset + numel * dtype.itemsize].view(dtype)

    def release(self):
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool._put(self)


class StagingPool:
    """Registered staging buffers reused across collectives, grown on demand.

    acquire(n) hands out a whole buffer of the smallest size class >= n
    (classes: powers of two split in four steps, >= min_bytes), allocating
    and registering a new one only when none of that class is free. Buffers
    are never unregistered until close(), so the steady state performs no
    registration at all.
    """

    def __init__(self, alloc, min_bytes=1 << 20):
        self._alloc = alloc  # alloc(nbytes, name) -> hsdp._hsdp.Buffer
        self._min = min_bytes
        self._lock = threading.Lock()
        self._free = {}   # size class -> [Lease]
        self._all = []    # every Lease ever created
        self.allocations = 0
        self.acquisitions = 0

    def size_class(self, nbytes):
        n = max(int(nbytes), self._min)
        p = 1 << (n - 1).bit_length()
        step = max(p // 8, 1)
        return (n + step - 1) // step * step

    def acquire(self, nbytes):
        cls = self.size_class(nbytes)
        with self._lock:
            self.acquisitions += 1
            free = self._free.get(cls)
            if free:
                lease = free.pop()
                lease.pool = self
                return lease
        buf = self._alloc(cls, f"staging-{cls}")
        u8 = torch_view(buf, 0, cls) if torch is not None else numpy_view(buf, 0, cls)
        lease = Lease(self, buf, u8)
        with self._lock:
            self.allocations += 1
            self._all.append(lease)
        return lease

    def _put(self, lease):
        with self._lock:
            self._free.setdefault(lease.nbytes, []).append(lease)

    def stats(self):
        with self._lock:
            return {
                "buffers": len(self._all),
                "bytes": sum(l.nbytes for l in self._all),
                "free_buffers": sum(len(v) for v in self._free.values()),
                "allocations": self.allocations,
                "acquisitions": self.acquisitions,
            }

    def close(self):
        """Drops the pool's views; returns the buffers (the caller frees them)."""
        with self._lock:
            leases, self._all, self._free = self._all, [], {}
        bufs = []
        for lease in leases:
            lease._u8 = None
            bufs.append(lease.buffer)
        return bufs
