"""Where the bytes of one collective live.

A Plan maps each user tensor/array of one collective either to the hsdpd
buffer it already lives in (zero-copy) or to a staging lease (copied in now,
copied out when the operation has completed). finish() runs the copy-outs and
returns the leases; release() returns the leases without copying (after a
failure). A Plan is used by one thread at a time.
"""
import numpy as np

from hsdp.memory import ALIGN, align_up, is_torch, numpy_view


def region_like(lease, x, offset=0):
    """A view of `lease` at `offset` with x's dtype and shape."""
    if is_torch(x):
        return lease.view(x.dtype, x.numel(), offset).view(x.shape)
    return numpy_view(lease.buffer, offset, x.nbytes, x.dtype, x.shape)


def copy_into(dst, src):
    if is_torch(dst):
        dst.copy_(src)
    else:
        np.copyto(dst, src)


class Plan:
    def __init__(self, session):
        self._session = session
        self._leases = []
        self._copy_outs = []
        self.staged_bytes = 0

    # -- building ------------------------------------------------------------
    def scratch(self, nbytes):
        """A staging lease of >= nbytes and its (buffer_id, offset) ref."""
        lease = self._session.staging.acquire(max(nbytes, 1))
        self._leases.append(lease)
        self.staged_bytes += nbytes
        return lease, (lease.buffer.id, 0)

    def locate(self, x):
        found = self._session.registry.locate_array(x)
        return None if found is None else (found[0].id, found[1])

    def input(self, x):
        """Ref of x's data for reading (zero-copy or staged and copied in)."""
        ref = self.locate(x)
        if ref is not None:
            return ref
        lease, ref = self.scratch(_nbytes(x))
        copy_into(region_like(lease, x), x)
        return ref

    def output(self, x):
        """Ref where the result for x is written (copied out at finish())."""
        ref = self.locate(x)
        if ref is not None:
            return ref
        lease, ref = self.scratch(_nbytes(x))
        self._copy_outs.append(lambda: copy_into(x, region_like(lease, x)))
        return ref

    def inout(self, x):
        """In-place operand: read and written."""
        ref = self.locate(x)
        if ref is not None:
            return ref
        lease, ref = self.scratch(_nbytes(x))
        copy_into(region_like(lease, x), x)
        self._copy_outs.append(lambda: copy_into(x, region_like(lease, x)))
        return ref

    def packed(self, xs, copy_in=True, copy_out=False, align=ALIGN):
        """One staging region holding xs back to back (each at an aligned offset).

        Returns (lease, ref, offsets). Used by coalesced collectives.
        """
        offsets, total = [], 0
        for x in xs:
            offsets.append(total)
            total = align_up(total + _nbytes(x), align)
        lease, ref = self.scratch(total)
        for x, off in zip(xs, offsets):
            if copy_in:
                copy_into(region_like(lease, x, off), x)
            if copy_out:
                self._copy_outs.append(
                    lambda x=x, off=off: copy_into(x, region_like(lease, x, off)))
        return lease, ref, offsets

    def after(self, fn):
        """Runs fn() at finish(), after the copy-outs registered before it."""
        self._copy_outs.append(fn)

    @property
    def zero_copy(self):
        return not self._leases

    # -- completion ----------------------------------------------------------
    def finish(self):
        try:
            for fn in self._copy_outs:
                fn()
        finally:
            self.release()

    def release(self):
        leases, self._leases, self._copy_outs = self._leases, [], []
        for lease in leases:
            lease.release()

    def abandon(self):
        """The operation may still write its buffers: keep them out of the pool."""
        self._leases, self._copy_outs = [], []


def _nbytes(x):
    return x.numel() * x.element_size() if is_torch(x) else x.nbytes


def split_counts(what, splits, total, n, unit="elements"):
    """Per-rank counts of an all-to-all: `splits` checked (n non-negative
    counts adding up to `total`), or equal blocks when it is empty/None.
    ValueError naming `what` otherwise."""
    if not splits:
        if total % n:
            raise ValueError(f"{what}: {total} {unit} do not split into {n} equal blocks")
        return [total // n] * n
    splits = [int(s) for s in splits]
    if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != total:
        raise ValueError(f"{what}: expected {n} non-negative counts adding up to {total} "
                         f"{unit}, got {splits}")
    return splits
