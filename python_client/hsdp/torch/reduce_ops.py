"""torch.distributed reduce ops -> hsdpd reduce ops.

PREMUL_SUM carries its factor in the ReduceOp itself (a number or a
one-element tensor): FSDP2 builds `ReduceOp.PREMUL_SUM(1 / f)` per
reduce-scatter, torch's _make_nccl_premul_sum(f) does the same. The factor is
read from the op that comes with each collective (`op.factor`, or its pickled
state), never assumed; an op without one is refused.
"""
from torch._C._distributed_c10d import ReduceOp

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
    except (TypeError, ValueError, RuntimeError):
        if getattr(factor, "numel", lambda: 0)() != 1:
            raise ValueError(f"PREMUL_SUM factor must be a number or a one-element tensor, "
                             f"got {factor!r}") from None
        return float(factor.detach().reshape(()).cpu().item())


def premul_factor(op):
    """The factor a PREMUL_SUM ReduceOp carries, or None if it carries none."""
    factor = getattr(op, "factor", None)
    if factor is None:
        try:
            state = op.__getstate__()
            factor = state[1] if isinstance(state, tuple) and len(state) > 1 else None
        except Exception:  # noqa: BLE001 - a bare RedOpType has no state
            factor = None
    return None if factor is None else _factor_value(factor)


def to_hsdp(op, what):
    """(hsdpd op name, premul factor) for a ReduceOp / RedOpType."""
    kind = getattr(op, "op", op)
    name = _SIMPLE.get(kind)
    if name is not None:
        return name, 1.0
    if kind == ReduceOp.RedOpType.PREMUL_SUM:
        factor = premul_factor(op)
        if factor is None:
            raise ValueError(
                f"hsdpd backend {what}: this PREMUL_SUM op carries no factor: build it with "
                "ReduceOp.PREMUL_SUM(factor) or torch.distributed._make_nccl_premul_sum(factor)")
        return "premul_sum", factor
    raise NotImplementedError(
        f"hsdpd backend {what}: reduce op {kind} is not supported (supported: {SUPPORTED}); "
        "use a gloo process group for bitwise reductions")


def name_of(op):
    """hsdpd's name of a torch reduce op ("sum", "avg", "premul_sum", ...), or None for one
    hsdpd does not run (the collective itself then says why)."""
    try:
        return to_hsdp(op, "reduce")[0]
    except (ValueError, TypeError, NotImplementedError):
        return None
