"""Mapping between torch / numpy dtypes and hsdpd wire dtypes.

hsdpd reduces float32, float16, bfloat16, float64, int32, int64 and uint8.
Data-movement collectives (all-gather, broadcast) carry any dtype as bytes.
torch is optional: everything here works with numpy alone.
"""
import numpy as np

try:  # torch is optional for the core client
    import torch
except ImportError:  # pragma: no cover - exercised only without torch
    torch = None

# hsdpd dtype names (canonical) that the daemon can reduce.
REDUCIBLE = ("float32", "float16", "bfloat16", "float64", "int32", "int64", "uint8")

_NUMPY_TO_HSDP = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float16): "float16",
    np.dtype(np.float64): "float64",
    np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64",
    np.dtype(np.uint8): "uint8",
}

_TORCH_TO_HSDP = {}
if torch is not None:
    _TORCH_TO_HSDP = {
        torch.float32: "float32",
        torch.float16: "float16",
        torch.bfloat16: "bfloat16",
        torch.float64: "float64",
        torch.int32: "int32",
        torch.int64: "int64",
        torch.uint8: "uint8",
    }
    _HSDP_TO_TORCH = {v: k for k, v in _TORCH_TO_HSDP.items()}


def hsdp_dtype(dtype):
    """The hsdpd name of a torch or numpy dtype (or an hsdpd name).

    Returns None when hsdpd cannot reduce that dtype (it may still be moved as
    bytes by all-gather and broadcast).
    """
    if isinstance(dtype, str):
        from hsdp import _hsdp
        try:
            return _hsdp.canonical_dtype(dtype)
        except ValueError:
            return None
    if torch is not None and isinstance(dtype, torch.dtype):
        return _TORCH_TO_HSDP.get(dtype)
    try:
        return _NUMPY_TO_HSDP.get(np.dtype(dtype))
    except TypeError:
        return None


def torch_dtype(name):
    """The torch dtype for an hsdpd dtype name."""
    if torch is None:
        raise ImportError("torch is not installed")
    from hsdp import _hsdp
    return _HSDP_TO_TORCH[_hsdp.canonical_dtype(name)]


def itemsize(dtype):
    """Bytes per element of a torch or numpy dtype."""
    if torch is not None and isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size()
    return np.dtype(dtype).itemsize


def require_reducible(dtype, what):
    """The hsdpd name of `dtype`, or a ValueError naming `what` and the choices."""
    name = hsdp_dtype(dtype)
    if name is None:
        raise ValueError(
            f"{what}: dtype {dtype} cannot be reduced by hsdpd; supported: "
            f"{', '.join(REDUCIBLE)} (cast first, e.g. bool -> uint8)")
    return name
