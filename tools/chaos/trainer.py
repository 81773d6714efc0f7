"""One rank of the chaos job: deterministic HSDP (FSDP2 on a replicate x shard
mesh, CPU) that checkpoints with DCP and resumes from its last checkpoint.

    trainer.py --steps N --ckpt-every K --ckpt-dir D --out D --mesh R,S
               [--backend hsdpd|gloo] [--store FILE] [--pg-timeout S]
Environment: RANK, WORLD_SIZE (and for hsdpd HSDPD_SOCKET, LOCAL_RANK).

Deterministic: fixed model seed, data a function of (step, rank), one thread,
reductions in a fixed order, so a run that resumes from a checkpoint
recomputes exactly the steps after it and ends with the same bits as a run
never interrupted.

Checkpoints: every K steps, DCP saves model and optimizer state to
ckpt-dir/tmp-<step>-<pid of rank 0>; after every rank saved (a barrier),
rank 0 renames it to step-<step> and then replaces ckpt-dir/LATEST (write a
temporary file, fsync, rename): a checkpoint is either complete and named
by LATEST, or ignored. Then it removes all but the newest two committed
checkpoints and every other tmp-* directory (a long run must not fill the
disk). A failed save (a full disk) is reported and training goes on from
memory (the previous checkpoint stays the one to resume from).
The step a checkpoint holds is in LATEST and in the checkpoint's own
metadata (`step`), and a resumed run checks they agree: a checkpoint is
never applied twice or to the wrong step.

Output (out-dir): progress.log gets "<unix time> step <n> rank0" when step n
completes (rank 0, appended, flushed), "resume <n>" when a run starts from
step n, "checkpoint <n>" / "checkpoint-failed <n> <why>"; at the end rank 0
writes final.npz (every full parameter) and final.sha256.
Exit status: 0 at the last step; 1 on any error (the supervisor restarts
the job).
"""
import argparse
import datetime
import faulthandler
import hashlib
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "demo"))

DIMS = dict(vocab=64, dim=32, heads=4, blocks=3, seq=16)
PER_RANK = 2
LR = 0.05


def log(out_dir, line):
    with open(os.path.join(out_dir, "progress.log"), "a") as f:
        f.write(f"{time.time():.3f} {line}\n")
        f.flush()


def latest_step(ckpt_dir):
    try:
        with open(os.path.join(ckpt_dir, "LATEST")) as f:
            name = f.read().strip()
    except FileNotFoundError:
        return 0, None
    step = int(name.split("-", 1)[1])
    return step, os.path.join(ckpt_dir, name)


# Committed checkpoints kept: the one LATEST names and the one before it.
KEEP = 2


def prune(ckpt_dir, keep_tmp):
    """Removes committed checkpoints beyond the newest KEEP and every tmp-*
    directory but `keep_tmp` (saves that failed or whose job died): a long
    run must not fill the disk with checkpoints nobody resumes from."""
    import shutil
    steps = []
    for name in os.listdir(ckpt_dir):
        path = os.path.join(ckpt_dir, name)
        if name.startswith("step-") and name[5:].isdigit():
            steps.append((int(name[5:]), path))
        elif name.startswith("tmp-") and path != keep_tmp:
            shutil.rmtree(path, ignore_errors=True)
    for _, path in sorted(steps)[:-KEEP]:
        shutil.rmtree(path, ignore_errors=True)


def commit(ckpt_dir, tmp, step):
    final = os.path.join(ckpt_dir, f"step-{step}")
    if os.path.exists(final):  # a run before this one got this far: same bits
        import shutil
        shutil.rmtree(final)
    os.rename(tmp, final)
    latest_tmp = os.path.join(ckpt_dir, f".LATEST.{os.getpid()}")
    with open(latest_tmp, "w") as f:
        f.write(f"step-{step}\n")
        f.flush()
        os.fsync(f.fileno())
    os.rename(latest_tmp, os.path.join(ckpt_dir, "LATEST"))
    prune(ckpt_dir, keep_tmp=None)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-every", type=int, required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mesh", required=True)
    p.add_argument("--backend", default="hsdpd")
    p.add_argument("--store", required=True)
    p.add_argument("--pg-timeout", type=float, default=60)
    a = p.parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the supervisor's stack dump
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    replicate, shard = (int(x) for x in a.mesh.split(","))

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import transformer as T
    torch.set_num_threads(1)
    if a.backend == "hsdpd":
        import hsdp.torch  # noqa: F401 - registers the backend
    dist.init_process_group(a.backend, init_method=f"file://{a.store}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=a.pg_timeout))
    mesh = init_device_mesh("cpu", (replicate, shard), mesh_dim_names=("replicate", "shard"))
    model = T.shard_transformer(T.TinyTransformer(**DIMS, seed=1), mesh, fully_shard)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)

    start, path = latest_step(a.ckpt_dir)
    if path is not None:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "meta": {"step": torch.tensor(-1)}}
        dcp.load(state, checkpoint_id=path)
        held = int(state["meta"]["step"])
        if held != start:
            raise RuntimeError(f"checkpoint {path} holds step {held}, LATEST says {start}")
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    if rank == 0:
        log(a.out, f"resume {start}")

    for step in range(start, a.steps):
        tokens = T.batch(step, rank, PER_RANK, DIMS["vocab"], DIMS["seq"])
        T.lm_loss(model, tokens).backward()
        opt.step()
        opt.zero_grad()
        done = step + 1
        if rank == 0:
            log(a.out, f"step {done}")
        if done % a.ckpt_every == 0 and done < a.steps:
            owner = [os.getpid()] if rank == 0 else [0]
            dist.broadcast_object_list(owner, src=0)
            tmp = os.path.join(a.ckpt_dir, f"tmp-{done}-{owner[0]}")
            msd, osd = get_state_dict(model, opt)
            try:
                dcp.save({"model": msd, "optim": osd, "meta": {"step": torch.tensor(done)}},
                         checkpoint_id=tmp)
                ok = None
            # DCP raises the same on every rank; its CheckpointException (a full
            # disk on any rank) derives from BaseException, not Exception.
            except (Exception, CheckpointException) as e:  # noqa: BLE001
                ok = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
            dist.barrier()
            if rank == 0:
                if ok is None:
                    try:
                        commit(a.ckpt_dir, tmp, done)
                        log(a.out, f"checkpoint {done}")
                    except OSError as e:
                        log(a.out, f"checkpoint-failed {done} commit: {e}")
                        prune(a.ckpt_dir, keep_tmp=None)
                else:
                    log(a.out, f"checkpoint-failed {done} {ok}")
                    prune(a.ckpt_dir, keep_tmp=None)  # the failed save's partial files too
            dist.barrier()

    params = {}
    for n, prm in model.named_parameters():
        params[n] = prm.full_tensor().detach().numpy().copy()  # an all-gather on every rank
    if rank == 0:
        import numpy as np
        np.savez(os.path.join(a.out, "final.npz"), **params)
        h = hashlib.sha256()
        for n in sorted(params):
            h.update(n.encode())
            h.update(params[n].tobytes())
        with open(os.path.join(a.out, "final.sha256"), "w") as f:
            f.write(h.hexdigest() + "\n")
        log(a.out, f"done {a.steps}")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - the supervisor restarts the job; the log says why
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
