"""FSDP2 training runs for the test_fsdp2_* tests: sharded (in mp_runner workers)
and the single-process reference over the global batch.

A run is a dict of options (see `config`); `sharded_runs(rank, world, cfgs, tmp)`
trains each of them in turn in one set of processes (starting processes with
torch is the slow part on this machine) and returns, per run, the rank's local
losses (one per micro-batch) and, on rank 0, the final full parameters.
`reference(cfg, world)` trains the same model on one process over the
concatenation of all ranks' batches. The model is tools/demo/transformer.py
(embedding, blocks, each block its own fully_shard unit).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "tools", "demo"))
import transformer as T  # noqa: E402

DIMS = dict(vocab=64, dim=32, heads=4, blocks=3, seq=16)
PER_RANK = 2  # sequences per rank per micro-batch
LR = 0.05


def config(name, **kw):
    """A run: mesh (shape), reshard (True/False/int), bf16, micro (micro-batches per step),
    accum ("sync": set_requires_gradient_sync, "all_reduce": set_requires_all_reduce),
    prefetch, offload, hooks (None/"buffers"/"composite"), force_sum, dcp, steps."""
    cfg = dict(name=name, mesh=(2,), reshard=True, bf16=False, micro=1, accum=None,
               prefetch=False, offload=False, hooks=None, force_sum=False, dcp=False, steps=3)
    unknown = set(kw) - set(cfg)
    if unknown:
        raise ValueError(f"unknown options {unknown}")
    cfg.update(kw)
    return cfg


def _data(step, micro, rank, cfg):
    return T.batch(step * 8 + micro, rank, PER_RANK, DIMS["vocab"], DIMS["seq"])


def _model():
    return T.TinyTransformer(**DIMS, seed=1)


def _optimizer(params):
    import torch
    return torch.optim.SGD(params, lr=LR, momentum=0.9)


def reference(cfg, world):
    """Per-step global losses (one per micro-batch) and final parameters, one process."""
    import torch
    model = _model()
    opt = _optimizer(model.parameters())
    losses = []
    for step in range(cfg["steps"] + (2 if cfg["dcp"] else 0)):
        for m in range(cfg["micro"]):
            tokens = torch.cat([_data(step, m, r, cfg) for r in range(world)])
            loss = T.lm_loss(model, tokens)
            (loss / cfg["micro"]).backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()
    return {"losses": losses,
            "params": {n: p.detach().numpy().copy() for n, p in model.named_parameters()}}


def _shard(cfg, mesh, rank):
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    kw = {"reshard_after_forward": cfg["reshard"]}
    if cfg["bf16"]:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
    if cfg["offload"]:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    model = T.shard_transformer(_model(), mesh, fully_shard, **kw)
    if cfg["prefetch"]:
        blocks = list(model.blocks)
        for i, blk in enumerate(blocks):
            if i + 1 < len(blocks):
                blk.set_modules_to_forward_prefetch([blocks[i + 1]])
            if i > 0:
                blk.set_modules_to_backward_prefetch([blocks[i - 1]])
    if cfg["force_sum"]:
        model.set_force_sum_reduction_for_comms(True)
    info = {}
    if cfg["hooks"]:
        import hsdp.torch.fsdp2 as f2
        info["hooked_modules"] = f2.use_hsdp_comm_buffers(
            model, composite=cfg["hooks"] == "composite")
    return model, info


def _train_steps(model, opt, cfg, rank, steps, losses):
    for step in steps:
        for m in range(cfg["micro"]):
            last = m == cfg["micro"] - 1
            if cfg["accum"] == "sync":
                model.set_requires_gradient_sync(last)
            elif cfg["accum"] == "all_reduce":
                model.set_requires_all_reduce(last)
            loss = T.lm_loss(model, _data(step, m, rank, cfg))
            (loss / cfg["micro"]).backward()
            losses.append(loss.item())
        opt.step()
        opt.zero_grad()


def _full_params(model):
    out = {}
    for n, p in model.named_parameters():
        full = p.full_tensor()  # an all-gather on every rank
        out[n] = full.detach().float().numpy().copy()
    return out


def _dcp_roundtrip(model, opt, cfg, mesh, rank, path):
    """Saves model + optimizer with DCP, builds a fresh sharded model, loads them back."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)
    model2, _ = _shard(cfg, mesh, rank)
    opt2 = _optimizer(model2.parameters())
    msd2, osd2 = get_state_dict(model2, opt2)
    state = {"model": msd2, "optim": osd2}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model2, opt2, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    return model2, opt2


def _ops(group):
    """Operations the hsdpd group completed (None for Gloo). The completer counts an
    operation before its Work completes, so every op waited for is counted."""
    stats = getattr(group, "hsdp_stats", None)
    return None if stats is None else stats()["ops"]


def sharded_run(rank, world, cfg, tmp):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    names = ("replicate", "shard") if len(cfg["mesh"]) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", tuple(cfg["mesh"]), mesh_dim_names=names)
    model, info = _shard(cfg, mesh, rank)
    opt = _optimizer(model.parameters())
    losses = []
    replicate = mesh.get_group("replicate") if len(cfg["mesh"]) == 2 else None
    ops_before = _ops(replicate)
    _train_steps(model, opt, cfg, rank, range(cfg["steps"]), losses)
    if replicate is not None and ops_before is not None:
        info["replicate_ops"] = _ops(replicate) - ops_before  # in training only
    if cfg["dcp"]:
        model, opt = _dcp_roundtrip(model, opt, cfg, mesh, rank,
                                    os.path.join(tmp, f"ckpt-{cfg['name']}"))
        _train_steps(model, opt, cfg, rank, range(cfg["steps"], cfg["steps"] + 2), losses)
    params = _full_params(model)
    info["backend"] = dist.get_backend()
    if cfg["hooks"]:
        import hsdp.torch.fsdp2 as f2
        info.update(f2.comm_buffer_stats(model))
    return {"losses": losses, "params": params if rank == 0 else None, "info": info}


def sharded_runs(rank, world, cfgs, tmp):
    return [sharded_run(rank, world, cfg, tmp) for cfg in cfgs]


def global_losses(per_rank):
    """Mean over ranks of each micro-batch's local loss (equal local batch sizes)."""
    return np.mean(np.array([r["losses"] for r in per_rank]), axis=0)


def assert_matches(ours, ref, rtol, atol, what):
    """ours: one run's per-rank results; ref: a reference() or another run's rank results."""
    ref_losses = ref["losses"] if isinstance(ref, dict) else global_losses(ref)
    ref_params = ref["params"] if isinstance(ref, dict) else ref[0]["params"]
    np.testing.assert_allclose(global_losses(ours), ref_losses, rtol=rtol, atol=atol,
                               err_msg=f"{what}: losses")
    assert ours[0]["params"].keys() == ref_params.keys()
    for n, p in ours[0]["params"].items():
        np.testing.assert_allclose(p, ref_params[n], rtol=rtol, atol=atol,
                                   err_msg=f"{what}: parameter {n}")
