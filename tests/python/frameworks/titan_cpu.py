"""torchtitan on a machine without an accelerator (what the CPU tests and benchmarks need).

torchtitan 0.3.0 has no CPU mode: torchtitan.tools.utils takes torch's accelerator type, else
"cuda", and its memory monitor calls CUDA-style functions (get_device_name,
get_device_properties, memory_stats, ...) that torch.cpu lacks. `force_cpu()`, called before
torchtitan is imported, makes torch's detection answer "cpu" and hands torchtitan torch.cpu
with those few calls answered with neutral values (no memory figures). It changes nothing of
torchtitan's or hsdpd's code and nothing about the backend choice; on GPU nodes it is not used.
"""
import os
import types

import torch
import torch._utils


class _CpuProperties:
    name = "cpu"
    total_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _cpu_module():
    m = types.ModuleType("torchtitan_cpu_device")
    for name in dir(torch.cpu):
        if not name.startswith("__"):
            setattr(m, name, getattr(torch.cpu, name))
    m.get_device_name = lambda *a, **k: "cpu"
    m.current_device = lambda: 0  # torch.cpu answers "cpu"; barrier(device_ids=) wants ints
    m.get_device_properties = lambda *a, **k: _CpuProperties()
    m.memory_stats = lambda *a, **k: {}
    m.reset_peak_memory_stats = lambda *a, **k: None
    m.empty_cache = lambda *a, **k: None
    m.memory = types.SimpleNamespace(_record_memory_history=lambda *a, **k: None,
                                     _snapshot=lambda *a, **k: {})
    return m


def force_cpu():
    module = _cpu_module()
    original = torch._utils._get_device_module
    torch._utils._get_available_device_type = lambda: "cpu"
    torch._utils._get_device_module = lambda t="cpu": module if t == "cpu" else original(t)
