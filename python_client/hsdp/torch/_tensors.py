"""Small checks and conversions shared by the torch backend's modules."""
import torch

from hsdp.dtypes import hsdp_dtype


def _as_list(x):
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _opt(opts, name, default):
    return getattr(opts, name, default) if opts is not None else default


def _check(t, what):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"hsdpd backend {what}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise RuntimeError(
            f"hsdpd backend {what}: tensor is on {t.device}; this collective takes CPU tensors "
            "only (CUDA tensors: all_reduce, all_gather_into_tensor, reduce_scatter_tensor, "
            "broadcast; docs/gpu.md)")
    if t.layout != torch.strided:
        raise RuntimeError(f"hsdpd backend {what}: sparse tensors are supported by allreduce "
                           "(ReduceOp.SUM) only")


def _nbytes(t):
    return t.numel() * t.element_size()


def _wire(t):
    """(hsdpd dtype, count) moving t unchanged: its dtype if known, else raw bytes."""
    name = hsdp_dtype(t.dtype)
    return (name, t.numel()) if name is not None else ("uint8", _nbytes(t))


def _reducible(t, what):
    name = hsdp_dtype(t.dtype)
    if name is None:
        raise TypeError(
            f"hsdpd backend {what}: cannot reduce dtype {t.dtype}; supported: float32, "
            "float16, bfloat16, float64, int32, int64, uint8")
    return name
