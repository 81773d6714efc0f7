"""A stock Lightning Fabric training script, FSDP2 through Fabric's ModelParallelStrategy
(Fabric's FSDPStrategy, FSDP1, refuses CPU: "FSDP is only available on GPU"): a small MLP
sharded with fully_shard over the strategy's data-parallel mesh, a few AdamW steps on fixed
data. The backend is Lightning's choice (torch's default map for the device) unless
FABRIC_PG_BACKEND names one: that is the one-line option
ModelParallelStrategy(..., process_group_backend="hsdpd") (FSDPStrategy has the same
argument). Writes rank<r>.json to $OUT_DIR like accelerate_train.py, with, over hsdpd,
hsdp's comm_buffer_stats of the model (which path FSDP2's collectives took)."""
import hashlib
import json
import os
import sys

import torch
import torch.distributed as dist
from lightning.fabric import Fabric
from lightning.fabric.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

backend = os.environ.get("FABRIC_PG_BACKEND") or None
if backend == "hsdpd":
    import hsdp.torch  # noqa: F401  (registers the backend; hsdprun does it by itself)


def parallelize(model, device_mesh):
    mesh = device_mesh["data_parallel"]
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


# Fabric's "auto" sizes are data-parallel = nodes, tensor-parallel = processes per node: on
# one node that leaves a data-parallel mesh of one rank, over which FSDP2 never communicates.
# Every process is a data-parallel rank here.
strategy = ModelParallelStrategy(parallelize, data_parallel_size=int(os.environ["WORLD_SIZE"]),
                                 tensor_parallel_size=1, process_group_backend=backend)
fabric = Fabric(accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                strategy=strategy)
fabric.launch()
fabric.seed_everything(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                            torch.nn.GELU(), torch.nn.Linear(64, 1))
model = fabric.setup_module(model)
optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-2))

g = torch.Generator().manual_seed(100 + fabric.global_rank)
losses = []
for step in range(int(os.environ.get("STEPS", "4"))):
    x = torch.randn(16, 64, generator=g)
    y = x[:, :1] * 0.5 - x[:, 1:2]
    loss = torch.nn.functional.mse_loss(model(x), y)
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(float(loss.detach()).hex())

from torch.distributed.checkpoint.state_dict import StateDictOptions, \
    get_model_state_dict  # noqa: E402
state = get_model_state_dict(model._forward_module,
                             options=StateDictOptions(full_state_dict=True, cpu_offload=True))
digest = hashlib.sha256()
for k in sorted(state):
    digest.update(k.encode())
    digest.update(state[k].detach().to(torch.float32).contiguous().numpy().tobytes())
out = {"losses": losses, "params_sha256": digest.hexdigest(),
       "group": dist.group.WORLD.name(), "reported_backend": dist.get_backend(),
       "strategy": type(fabric.strategy).__name__,
       "wrapped": type(model._forward_module).__name__,
       "data_parallel_size": strategy.device_mesh["data_parallel"].size()}
if "hsdp.torch.fsdp2" in sys.modules:  # loaded by the hsdpd backend only
    out["comm"] = sys.modules["hsdp.torch.fsdp2"].comm_buffer_stats(model._forward_module)
with open(os.path.join(os.environ["OUT_DIR"], f"rank{fabric.global_rank}.json"), "w") as f:
    json.dump(out, f)
