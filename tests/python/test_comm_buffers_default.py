"""FSDP2's communication buffers in hsdpd memory with no hsdp call
(hsdp.torch.fsdp2_auto, docs/torch-defaults.md).

Stock FSDP2 training (the small transformer of fsdp2_train.py, each block its
own fully_shard unit, SGD with momentum, 3 steps, no hsdp call after
init_process_group) over "hsdpd":
- by default every all-gather and reduce-scatter runs in place in hsdpd
  memory (comm_buffer_stats: path "hsdpd", every comm installed by default,
  no staged call, no fallback);
- with HSDP_COMM_BUFFERS=0 nothing is hooked and torch's comms stage
  (path "staged"); the two give bitwise the same losses and parameters (the
  daemon does the same arithmetic on the same bytes, only their place differs);
- over Gloo no hook is ever registered (no hsdpd group in the process), and
  Gloo's losses and parameters are bitwise hsdpd's (FSDP2 reduces fp32 with AVG
  on both; over two ranks a + b is the same either way and the halving exact);
  both match one process over the global batch to rtol 1e-5 (another summation
  order);
- comms the user chose are left alone: use_hsdp_comm_buffers (hsdp's own
  adapters) and torch's set_allocate_memory_from_process_group_for_comm(True),
  which takes its buffers from the backend's allocate_tensor (hsdpd memory);
- every reduce-scatter overlaps the rest of backward (hsdp.torch.fsdp2_overlap)
  where nothing reads its output in FSDP2's hook; with two micro-batches
  accumulating into the gradients only the first one's do, and the results are
  bitwise those of HSDP_FSDP2_OVERLAP=0 (every reduce-scatter waited in its hook).
"""
import pytest

import fsdp2_train as F
import mp_runner
from hsdp.torch import _compat

FSDP2_OK, FSDP2_WHY = _compat.fsdp2_status()
pytestmark = pytest.mark.skipif(not FSDP2_OK, reason=f"FSDP2 unavailable: {FSDP2_WHY}")

FP32 = dict(rtol=1e-5, atol=1e-6)


ACCUM = F.config("stock", micro=2)  # the second micro-batch adds into existing gradients


def _run(rank, world, user, tmp):
    """One stock FSDP2 run; `user`: None, "hsdp_buffers", "torch_pg_alloc" or "accum"
    (no user call, two micro-batches a step)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hsdp.torch import fsdp2_auto
    from hsdp.torch.fsdp2 import comm_buffer_stats
    cfg = ACCUM if user == "accum" else F.config("stock")
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("shard",))
    model, _ = F._shard(cfg, mesh, rank)
    if user == "hsdp_buffers":
        from hsdp.torch.fsdp2 import use_hsdp_comm_buffers
        use_hsdp_comm_buffers(model)
    elif user == "torch_pg_alloc":  # torch's per-module switch, on every FSDP2 module
        from torch.distributed.fsdp import FSDPModule
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_allocate_memory_from_process_group_for_comm(True)
    opt = F._optimizer(model.parameters())
    losses = []
    F._train_steps(model, opt, cfg, rank, range(cfg["steps"]), losses)
    stats = comm_buffer_stats(model)
    group = mesh.get_group()
    holder = getattr(group, "_hsdp_name_holder", None)
    stats["holder_allocations"] = getattr(holder, "allocations", None)
    stats["armed"] = fsdp2_auto.armed()
    stats["backend"] = dist.get_backend()
    params = F._full_params(model)
    return {"losses": losses, "params": params if rank == 0 else None, "info": stats}


def _runs(rank, world, users, tmp):
    return [_run(rank, world, u, tmp) for u in users]


def _launch(tmp_path, backend, users, env=None, world=2):
    """One set of processes runs the `users` variants in turn (starting processes with
    torch is the slow part): {user: per-rank results}."""
    envs = [dict(env or {}) for _ in range(world)]
    res = mp_runner.launch(_runs, world, (users, str(tmp_path)), backend, str(tmp_path), 300,
                           env=envs)
    return {u: [res[r][i] for r in range(world)] for i, u in enumerate(users)}


@pytest.fixture(scope="module")
def runs(hsdpd, tmp_path_factory):
    t = tmp_path_factory.mktemp("comm-buffers")
    default = _launch(t, "hsdpd", [None, "hsdp_buffers", "torch_pg_alloc", "accum"])
    waited = _launch(t, "hsdpd", [None, "accum"], env={"HSDP_FSDP2_OVERLAP": "0"})
    return {
        "auto": default[None],
        "hsdp_buffers": default["hsdp_buffers"],
        "torch_pg_alloc": default["torch_pg_alloc"],
        "accum": default["accum"],
        "overlap_off": waited[None],
        "accum_overlap_off": waited["accum"],
        "opt_out": _launch(t, "hsdpd", [None], env={"HSDP_COMM_BUFFERS": "0"})[None],
        "gloo": _launch(t, "gloo", [None])[None],
    }


def test_stock_fsdp2_uses_hsdpd_buffers_by_default(runs):
    units = 4  # 3 blocks + the root, one all-gather and one reduce-scatter comm each
    for r in runs["auto"]:
        info = r["info"]
        assert info["armed"], info
        assert info["path"] == "hsdpd", info
        assert info["auto"] == 2 * units and info["default_comms"] == 0, info
        assert info["calls"] > 0 and info["allocations"] > 0, info
        assert info["staged_calls"] == 0 and info["fallbacks"] == 0, info
        # Every reduce-scatter (AVG, fresh gradients, no accumulation) overlapped the
        # rest of backward: one per unit per step.
        assert info["overlapped"] == units * 3, info


def test_opt_out_stages_and_gives_the_same_bits(runs):
    for r in runs["opt_out"]:
        info = r["info"]
        assert not info["armed"], info
        assert info["path"] == "staged" and info["auto"] == 0, info
        assert info["holder_allocations"] == 0, info
    F.assert_matches(runs["auto"], runs["opt_out"], what="zero-copy vs staged",
                     rtol=0, atol=0)


def test_gloo_is_untouched_and_matches(runs):
    for r in runs["gloo"]:
        assert r["info"]["backend"] == "gloo" and not r["info"]["armed"], r["info"]
        assert r["info"]["path"] == "staged", r["info"]
    F.assert_matches(runs["auto"], runs["gloo"], what="hsdpd vs gloo", rtol=0, atol=0)
    F.assert_matches(runs["auto"], F.reference(F.config("stock"), 2),
                     what="hsdpd vs one process", **FP32)


def test_user_choices_are_left_alone(runs):
    for r in runs["hsdp_buffers"]:
        info = r["info"]
        assert info["path"] == "hsdpd" and info["auto"] == 0, info
        assert info["staged_calls"] == 0, info
        assert info["overlapped"] == 4 * 3, info  # hsdp's adapters overlap too
    for r in runs["torch_pg_alloc"]:
        info = r["info"]
        # torch's own comms, their buffers from ProcessGroupHsdp's allocate_tensor.
        assert info["path"] == "hsdpd" and info["auto"] == 0, info
        assert info["pg_alloc_comms"] == 8 and info["holder_allocations"] > 0, info
    for name in ("hsdp_buffers", "torch_pg_alloc"):
        F.assert_matches(runs[name], runs["auto"], what=name, rtol=0, atol=0)


def test_reduce_scatters_overlap_backward_only_where_safe(runs):
    units, steps = 4, 3
    for r in runs["accum"]:
        info = r["info"]
        assert info["path"] == "hsdpd" and info["calls"] > 0, info
        # Per step the first micro-batch's reduce-scatters overlap; the second one's
        # are waited in the hook, which adds their outputs into the gradients.
        assert info["overlapped"] == units * steps, info
    for name in ("overlap_off", "accum_overlap_off"):
        for r in runs[name]:
            assert r["info"]["path"] == "hsdpd" and r["info"]["overlapped"] == 0, r["info"]
    F.assert_matches(runs["auto"], runs["overlap_off"], what="overlapped vs waited",
                     rtol=0, atol=0)
    F.assert_matches(runs["accum"], runs["accum_overlap_off"],
                     what="accumulating, overlapped vs waited", rtol=0, atol=0)
    F.assert_matches(runs["accum"], F.reference(ACCUM, 2), what="accumulating vs one process",
                     **FP32)
