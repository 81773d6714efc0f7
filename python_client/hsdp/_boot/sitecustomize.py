"""hsdprun's bootstrap (docs/torch-defaults.md): hsdprun puts this directory
first on the workers' PYTHONPATH, so Python's site module imports this file
at start-up in every worker (and in every Python process they start).

It does two things, in this order:
1. With HSDP_DEFAULT_BACKEND set (1, or a device list), it arranges for
   hsdp.torch.autoload.enable_from_env() to run right after torch's own
   import finishes (a one-shot import hook on the module "torch"), so hsdpd is
   torch's default backend before any user code can ask torch for one. A
   process that never imports torch pays nothing, and nothing is imported here.
2. It runs the next sitecustomize on the path, if there is one (the one this
   file shadows), so a site's own customisation keeps working.
Without HSDP_DEFAULT_BACKEND it only does 2.
"""
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ENV = "HSDP_DEFAULT_BACKEND"


def _enable():
    import hsdp_autoload  # next to the package hsdp (build/python, site-packages)
    hsdp_autoload.autoload()


class _AfterTorchImport:
    """A meta-path finder that only watches for "torch": it lets the other finders find
    it and makes its loader call _enable() once torch's module has executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        _remove_finder()
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _enable()
        loader.exec_module = exec_module
        return spec


_FINDER = _AfterTorchImport()


def _remove_finder():
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:
        pass


def _install():
    value = os.environ.get(_ENV, "").strip()
    if not value or value == "0":
        return
    if "torch" in sys.modules:  # imported by something earlier in start-up
        _enable()
    else:
        sys.meta_path.insert(0, _FINDER)


def _chain():
    """Executes the sitecustomize this one shadows (the next on sys.path), if any."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or \
            os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_hsdp_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


_install()
_chain()
