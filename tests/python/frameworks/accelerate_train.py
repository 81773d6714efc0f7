"""A stock Hugging Face Accelerate training script with its FSDP2 plugin (no backend named
anywhere): a small MLP, a few AdamW steps on fixed data. Run under torchrun (Gloo, Accelerate's
CPU choice) or `python -m hsdp.run` with HSDP_REPLACE_GLOO=1 (hsdpd). Writes rank<r>.json to
$OUT_DIR: per-step losses (float.hex, bitwise), a digest of the final parameters, the world
group's backend and Accelerate's distributed type."""
import hashlib
import json
import os

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.utils import FullyShardedDataParallelPlugin

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                            torch.nn.GELU(), torch.nn.Linear(64, 1))
accelerator = Accelerator(cpu=True,
                          fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, optimizer = accelerator.prepare(model, optimizer)

g = torch.Generator().manual_seed(100 + accelerator.process_index)
losses = []
for step in range(int(os.environ.get("STEPS", "4"))):
    x = torch.randn(16, 64, generator=g)
    y = x[:, :1] * 0.5 - x[:, 1:2]
    loss = torch.nn.functional.mse_loss(model(x), y)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(float(loss.detach()).hex())

state = accelerator.get_state_dict(model)
digest = hashlib.sha256()
for k in sorted(state):
    digest.update(k.encode())
    digest.update(state[k].detach().to(torch.float32).contiguous().numpy().tobytes())
out = {"losses": losses, "params_sha256": digest.hexdigest(),
       "group": dist.group.WORLD.name(), "reported_backend": dist.get_backend(),
       "distributed_type": str(accelerator.distributed_type)}
with open(os.path.join(os.environ["OUT_DIR"], f"rank{accelerator.process_index}.json"), "w") as f:
    json.dump(out, f)
accelerator.end_training()
