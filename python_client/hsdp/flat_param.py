"""Flat parameters for FSDP/HSDP-style training without torch's FSDP.

    fp = hsdp.flat_param.FlatParameters(model, client, shard_size=-1, reduce_op="avg")
    opt = torch.optim.SGD(fp.parameters(), lr=0.1)   # optimises the local shards
    for batch in data:
        fp.unshard()                  # all-gather the shards into the full buffers
        loss(model(batch)).backward() # gradients accumulate in hsdpd memory
        fp.reduce_grads()             # one submission per bucket (async)
        fp.sync()                     # wait; shard gradients appear on fp.parameters()
        opt.step(); fp.zero_grad()

Gradient accumulation over micro-batches, two ways:
- set_requires_grad_sync(False) on all but the last micro-batch: nothing is
  communicated, full gradients accumulate (no_sync; memory: full gradients).
- set_requires_all_reduce(False) on all but the last (HSDP): every micro-batch
  is reduce-scattered in the shard group and sync() accumulates the shard; the
  last one (True) adds the accumulated shard and all-reduces the sum across
  the replicate group ONCE. Call sync() after each micro-batch's
  reduce_grads(), before the next backward (it clears the full gradients).

Layout: the trainable parameters are packed into buckets of hsdpd memory,
each parameter view at a 512-byte aligned offset; a bucket is padded so that
every shard is 512-byte aligned too. Each bucket has a full parameter buffer
(what the module's parameters view), a full gradient buffer (what their
.grad view), a parameter shard and a gradient shard. Gradients are reduced
with ONE daemon submission per bucket: reduce-scatter in the shard group,
or the composite reduce-scatter + all-reduce across the replicate group for
HSDP (shard_size < world). Options follow the seeds' hsdp() API: every bad
value is a ValueError naming it and the allowed values.
"""
import math

import torch

from hsdp import _hsdp
from hsdp.dtypes import hsdp_dtype
from hsdp.memory import ALIGN, align_up, torch_view

REDUCE_OPS = ("sum", "avg")
REDUCE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class FlatParameters:
    """Packs `module`'s trainable parameters into sharded flat buffers in hsdpd memory.

    Args:
        module: the model (its parameters must be on CPU, not meta).
        client: an hsdp.Client (rank/world from it); default: the hsdp.torch session.
        shard_size: ranks per shard group; -1 = all ranks (FSDP); must divide the world.
        reduce_op: "avg" (default) or "sum".
        reduce_dtype: None (parameter dtype) or float32/float16/bfloat16/float64 on the wire.
        pre_divide, post_divide: explicit divide factors (default: the power-of-two rule
            of hsdp.default_pre_divide_factor for "avg", 1 and 1 for "sum").
        bucket_size: KB per gradient bucket; -1 = all in one, 0 = one bucket per parameter.
        sync_module_states: broadcast global rank 0's parameters at construction.
    Thread-safety: one training thread.
    """

    def __init__(self, module, client=None, *, shard_size=-1, reduce_op="avg",
                 reduce_dtype=None, pre_divide=None, post_divide=None, bucket_size=-1,
                 sync_module_states=True):
        if client is None:
            from hsdp.torch import session
            client = session.current()
        self._client = client
        world, rank = client.world_size, client.rank
        self._validate(module, world, shard_size, reduce_op, reduce_dtype, pre_divide,
                       post_divide, bucket_size)
        self.shard_size = world if shard_size == -1 else shard_size
        self.replicas = world // self.shard_size
        self.reduce_op = reduce_op
        self.reduce_dtype = reduce_dtype
        self.bucket_size = bucket_size
        if reduce_op == "avg":
            pre = pre_divide if pre_divide is not None else \
                float(_hsdp.default_pre_divide_factor(world))
            post = post_divide if post_divide is not None else world / pre
        else:
            pre = pre_divide if pre_divide is not None else 1.0
            post = post_divide if post_divide is not None else 1.0
        self.pre_divide, self.post_divide = float(pre), float(post)
        self._sync_grads = True
        self._all_reduce = True
        self._pending = []  # (bucket, Work, kind): kind is "done", "partial" or "final"

        block = rank // self.shard_size
        shard_ranks = list(range(block * self.shard_size, (block + 1) * self.shard_size))
        replicate_ranks = list(range(rank % self.shard_size, world, self.shard_size))
        # Every rank creates every group in the same order (daemon matching).
        self._world = client.new_group(list(range(world)))
        self.shard_group = client.new_group(shard_ranks)
        self.replicate_group = client.new_group(replicate_ranks)
        self.shard_rank = self.shard_group.rank

        params = [p for p in module.parameters() if p.requires_grad]
        self.dtype = params[0].dtype
        self._buckets = [self._make_bucket(ps) for ps in self._split(params)]
        if sync_module_states:
            for b in self._buckets:
                self._client.broadcast(b.full, root=0, group=self._world)
                b.shard.data.copy_(b.full_chunk)

    # -- validation ----------------------------------------------------------
    @staticmethod
    def _validate(module, world, shard_size, reduce_op, reduce_dtype, pre, post, bucket_size):
        if not isinstance(shard_size, int) or isinstance(shard_size, bool) or \
                not (shard_size == -1 or (shard_size > 0 and world % shard_size == 0)):
            raise ValueError(f"shard_size: {shard_size!r} is invalid; allowed: -1 (all ranks) "
                             f"or a positive divisor of the world size {world}")
        if reduce_op not in REDUCE_OPS:
            raise ValueError(f"reduce_op: {reduce_op!r} is invalid; allowed: "
                             f"{', '.join(repr(o) for o in REDUCE_OPS)}")
        if reduce_dtype is not None and reduce_dtype not in REDUCE_DTYPES:
            raise ValueError(f"reduce_dtype: {reduce_dtype!r} is invalid; allowed: None, "
                             + ", ".join(str(d) for d in REDUCE_DTYPES))
        for name, v in (("pre_divide", pre), ("post_divide", post)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                  or not math.isfinite(v) or v <= 0):
                raise ValueError(f"{name}: {v!r} is invalid; allowed: None or a positive "
                                 "finite number")
        if not isinstance(bucket_size, int) or isinstance(bucket_size, bool) or \
                bucket_size < -1:
            raise ValueError(f"bucket_size: {bucket_size!r} is invalid; allowed: -1 (one "
                             "bucket), 0 (no fusion) or a positive size in KB")
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not params:
            raise ValueError("module: has no trainable parameters to flatten")
        for n, p in params:
            if p.device.type == "meta":
                raise ValueError(f"module: parameter {n!r} is on the meta device; "
                                 "materialise it (e.g. to_empty + init) first")
            if p.device.type != "cpu":
                raise NotImplementedError(f"parameter {n!r} is on {p.device}; the flat-"
                                          "parameter helper handles CPU parameters only")
            if hsdp_dtype(p.dtype) is None or not p.dtype.is_floating_point:
                raise NotImplementedError(f"parameter {n!r} has dtype {p.dtype}, which "
                                          "cannot be fused (floating-point dtypes only)")
        dtypes = {p.dtype for _, p in params}
        if len(dtypes) > 1:
            raise ValueError("module: trainable parameters mix dtypes "
                             f"{sorted(str(d) for d in dtypes)}; all must share one dtype")

    # -- layout ----------------------------------------------------------------
    def _split(self, params):
        if self.bucket_size == -1:
            return [params]
        if self.bucket_size == 0:
            return [[p] for p in params]
        limit = self.bucket_size * 1024
        out, cur, cur_bytes = [], [], 0
        for p in params:
            nbytes = p.numel() * p.element_size()
            if cur and cur_bytes + nbytes > limit:
                out.append(cur)
                cur, cur_bytes = [], 0
            cur.append(p)
            cur_bytes += align_up(nbytes)
        if cur:
            out.append(cur)
        return out

    def _make_bucket(self, params):
        es = params[0].element_size()
        offsets, off = [], 0
        for p in params:
            offsets.append(off)
            off = align_up(off + p.numel() * es)
        total = align_up(off, ALIGN * self.shard_size)  # every shard 512-byte aligned
        b = _Bucket()
        b.numel = total // es
        b.shard_numel = b.numel // self.shard_size
        b.full_buf = self._client.buffer(total, "flat-param")
        b.grad_buf = self._client.buffer(total, "flat-grad")
        b.full = torch_view(b.full_buf, 0, total, self.dtype)
        b.grad = torch_view(b.grad_buf, 0, total, self.dtype)
        lo = self.shard_rank * b.shard_numel
        b.full_chunk = b.full[lo:lo + b.shard_numel]
        b.shard_param_src = self._client.tensor((b.shard_numel,), self.dtype, "flat-shard")
        b.grad_shard = self._client.tensor((b.shard_numel,), self.dtype, "flat-grad-shard")
        b.params = params
        b.acc, b.accumulated = None, False  # reduce-scatter-only accumulation (HSDP)
        b.views = []
        for p, o in zip(params, offsets):
            view = b.full[o // es:o // es + p.numel()].view(p.shape)
            view.copy_(p.detach())
            gview = b.grad[o // es:o // es + p.numel()].view(p.shape)
            p.data = view
            p.grad = gview
            b.views.append(gview)
        b.shard_param_src.copy_(b.full_chunk)
        b.shard = torch.nn.Parameter(b.shard_param_src, requires_grad=True)
        return b

    # -- public API --------------------------------------------------------------
    def parameters(self):
        """The local shards (one flat Parameter per bucket) for the optimizer."""
        return [b.shard for b in self._buckets]

    @property
    def num_buckets(self):
        return len(self._buckets)

    def set_requires_grad_sync(self, flag):
        """False: reduce_grads() does nothing; gradients accumulate unsharded."""
        if not isinstance(flag, bool):
            raise ValueError(f"requires_grad_sync: {flag!r} is invalid; allowed: True, False")
        self._sync_grads = flag

    def set_requires_all_reduce(self, flag):
        """False: reduce_grads() only reduce-scatters (in the shard group); sync() adds the
        shard to an accumulator and clears the full gradients. True (default): the next
        reduction also all-reduces, once, the accumulated shard across the replicate group.
        Like FSDP2's FSDPModule.set_requires_all_reduce."""
        if not isinstance(flag, bool):
            raise ValueError(f"requires_all_reduce: {flag!r} is invalid; allowed: True, False")
        self._all_reduce = flag

    def unshard(self):
        """All-gathers every bucket's shard into its full buffer (the module's parameters)."""
        works = [self._client.all_gather(b.full, b.shard_param_src, group=self.shard_group,
                                         async_op=True) for b in self._buckets]
        for w in works:
            w.wait()

    def reduce_grads(self):
        """Issues the gradient reduction of every bucket (one submission each), async."""
        if not self._sync_grads:
            return
        if any(kind == "partial" for _, _, kind in self._pending):
            # The full gradients of that micro-batch are still in the buffers: a backward
            # since then has added to them, and reducing them again would count them twice.
            raise RuntimeError("reduce_grads: call sync() after each reduce_grads() with "
                               "requires_all_reduce False, before the next backward")
        for b in self._buckets:
            for p, gview in zip(b.params, b.views):
                if p.grad is None:
                    gview.zero_()
                elif p.grad.data_ptr() != gview.data_ptr():
                    gview.copy_(p.grad)  # someone replaced .grad (e.g. set_to_none)
                    p.grad = gview
            kw = dict(op="sum", pre_divide=self.pre_divide, reduce_dtype=self.reduce_dtype,
                      async_op=True)
            if not self._all_reduce or b.accumulated:
                # Reduce-scatter only; the post-divide goes with the one all-reduce at the
                # end (or here, without replicas), so the sum is divided exactly once.
                post = self.post_divide if self.replicas == 1 else 1.0
                w = self._client.reduce_scatter(b.grad_shard, b.grad, group=self.shard_group,
                                                post_divide=post, **kw)
                kind = "partial" if not self._all_reduce else "final"
            elif self.replicas == 1:
                w = self._client.reduce_scatter(b.grad_shard, b.grad, group=self.shard_group,
                                                post_divide=self.post_divide, **kw)
                kind = "done"
            else:
                w = self._client.reduce_scatter_all_reduce(
                    b.grad_shard, b.grad, self.shard_group, self.replicate_group,
                    post_divide=self.post_divide, **kw)
                kind = "done"
            self._pending.append((b, w, kind))

    def sync(self):
        """Waits for every outstanding reduction; shard gradients land on parameters()
        (after a reduction with requires_all_reduce False: accumulated, not yet there)."""
        pending, self._pending = self._pending, []
        final = []
        for b, w, kind in pending:
            w.wait()
            if kind == "partial":
                if b.acc is None:
                    b.acc = torch.zeros_like(b.grad_shard)
                b.acc.add_(b.grad_shard)
                b.accumulated = True
                b.grad.zero_()  # the next micro-batch's backward starts from zero
                continue
            if kind == "final":
                b.grad_shard.add_(b.acc)
                b.acc.zero_()
                b.accumulated = False
                if self.replicas > 1:
                    final.append((b, self._client.all_reduce(
                        b.grad_shard, group=self.replicate_group, op="sum",
                        post_divide=self.post_divide, reduce_dtype=self.reduce_dtype,
                        async_op=True)))
                    continue
            b.shard.grad = b.grad_shard
        for b, w in final:
            w.wait()
            b.shard.grad = b.grad_shard

    def zero_grad(self):
        for b in self._buckets:
            b.grad.zero_()
            for p, gview in zip(b.params, b.views):
                p.grad = gview
            b.shard.grad = None
            if b.acc is not None:
                b.acc.zero_()
            b.accumulated = False


class _Bucket:
    pass
