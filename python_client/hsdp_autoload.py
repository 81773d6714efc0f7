"""torch's plugin hook for hsdp: the wheel's `torch.backends` entry point
(`hsdpd = hsdp_autoload:autoload`) and the step hsdprun's bootstrap
(hsdp/_boot/sitecustomize.py) runs once torch is imported.

torch calls every `torch.backends` entry point at the end of each `import
torch` in every environment the wheel is installed in, so this module is a
top-level module of its own that imports nothing: without
HSDP_DEFAULT_BACKEND (or with it "0") it returns at once, and hsdp is not
imported. With it, hsdp.torch.autoload makes hsdpd torch's default backend
(docs/torch-defaults.md).

When torch is being imported by hsdp itself (`import hsdp` or `import
hsdp.torch` as a script's first import: hsdp imports torch while it
initialises), hsdp.torch cannot be imported yet; the step is then left to
the end of hsdp's own initialisation (hsdp/__init__.py), which runs it.
"""
import os
import sys

ENV = "HSDP_DEFAULT_BACKEND"


def requested():
    """Whether HSDP_DEFAULT_BACKEND asks for anything (its value is checked later)."""
    return os.environ.get(ENV, "").strip() not in ("", "0")


def autoload():
    if not requested():
        return
    pkg = sys.modules.get("hsdp")
    if pkg is not None and not getattr(pkg, "_ready", False):
        pkg._autoload_pending = True  # hsdp/__init__.py finishes it
        return
    from hsdp.torch import autoload as _autoload
    _autoload._torch_autoload()
