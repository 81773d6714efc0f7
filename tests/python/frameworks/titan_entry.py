"""torchtitan's own entry point (torchtitan.train) on a machine without an accelerator: the
only addition is titan_cpu.force_cpu() (torchtitan has no CPU mode). The backend is whatever
torch's default map says: Gloo under torchrun, hsdpd under `python -m hsdp.run`. Writes the
map's cpu entry as torchtitan will see it to $FW_MAP_OUT when set."""
import os
import runpy
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import titan_cpu  # noqa: E402

titan_cpu.force_cpu()
if os.environ.get("FW_MAP_OUT") and os.environ.get("RANK") == "0":
    from torch.distributed import Backend
    with open(os.environ["FW_MAP_OUT"], "w") as f:
        f.write(Backend.default_device_backend_map.get("cpu", ""))
sys.argv[0] = "torchtitan.train"
runpy.run_module("torchtitan.train", run_name="__main__", alter_sys=True)
