"""hsdp: the Python client of hsdpd, the per-node communication daemon.

- hsdp.Client: a session; shared tensors/arrays (zero-copy), groups, collectives.
- hsdp.errors: HsdpError and its subclasses (one per status code).
- hsdp.torch: the torch.distributed backend "hsdpd" (import it to register).
- hsdp.flat_param: FSDP/HSDP-style flat parameters without torch's FSDP.
"""
from hsdp import _hsdp
from hsdp._hsdp import Buffer, Group  # noqa: F401
from hsdp.client import Client, Work, default_socket_path  # noqa: F401
from hsdp.errors import *  # noqa: F401,F403
from hsdp.errors import __all__ as _error_names

__version__ = _hsdp.__version__  # one definition: project(VERSION) in CMakeLists.txt


def default_pre_divide_factor(world_size):
    """The power-of-two pre-divide factor for a reduction over world_size ranks."""
    return _hsdp.default_pre_divide_factor(world_size)


__all__ = ["Buffer", "Client", "Group", "Work", "default_pre_divide_factor",
           "default_socket_path"] + list(_error_names)

# Initialised: torch's plugin hook (hsdp_autoload.py) may have run while this
# package imported torch, and left making hsdpd torch's default backend to now.
_ready = True
if globals().pop("_autoload_pending", False):
    from hsdp.torch import autoload as _autoload

    _autoload._torch_autoload()
