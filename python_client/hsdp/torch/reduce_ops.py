"""torch.distributed reduce ops -> hsdpd reduce ops.

PREMUL_SUM carries its factor in a C++ supplement that torch does not expose
to Python. hsdp.torch therefore wraps torch.distributed._make_nccl_premul_sum
and remembers the factor of the most recently created PREMUL_SUM op; an op
carrying PREMUL_SUM uses that factor (FSDP creates the op immediately before
issuing the collective). A PREMUL_SUM op created before hsdp.torch was
imported is rejected with a clear error.
"""
import threading

import torch.distributed as dist
from torch._C._distributed_c10d import ReduceOp

_lock = threading.Lock()
_last_premul_factor = None

_SIMPLE = {
    ReduceOp.RedOpType.SUM: "sum",
    ReduceOp.RedOpType.AVG: "avg",
    ReduceOp.RedOpType.PRODUCT: "product",
    ReduceOp.RedOpType.MIN: "min",
    ReduceOp.RedOpType.MAX: "max",
}
SUPPORTED = "SUM, AVG, PREMUL_SUM, MIN, MAX, PRODUCT"


def _factor_value(factor):
    try:
        return float(factor)
    except (TypeError, ValueError):
        return float(factor.item())  # a 1-element tensor


def install_premul_tracker():
    """Wraps _make_nccl_premul_sum (idempotent)."""
    import torch.distributed.distributed_c10d as c10d_mod
    for mod in (dist, c10d_mod):
        orig = getattr(mod, "_make_nccl_premul_sum", None)
        if orig is None or getattr(orig, "_hsdp_tracked", False):
            continue

        def tracked(factor, _orig=orig):
            global _last_premul_factor
            op = _orig(factor)
            with _lock:
                _last_premul_factor = _factor_value(factor)
            return op

        tracked._hsdp_tracked = True
        setattr(mod, "_make_nccl_premul_sum", tracked)


def to_hsdp(op, what):
    """(hsdpd op name, premul factor) for a ReduceOp / RedOpType."""
    kind = getattr(op, "op", op)
    name = _SIMPLE.get(kind)
    if name is not None:
        return name, 1.0
    if kind == ReduceOp.RedOpType.PREMUL_SUM:
        with _lock:
            factor = _last_premul_factor
        if factor is None:
            raise ValueError(
                f"hsdpd backend {what}: PREMUL_SUM factor unknown: create the op with "
                "torch.distributed._make_nccl_premul_sum after importing hsdp.torch")
        return "premul_sum", factor
    raise NotImplementedError(
        f"hsdpd backend {what}: reduce op {kind} is not supported (supported: {SUPPORTED}); "
        "use a gloo process group for bitwise reductions")
