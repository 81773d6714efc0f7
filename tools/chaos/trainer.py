"""One rank of the chaos job: deterministic HSDP (FSDP2 on a replicate x shard
mesh, CPU) that checkpoints with DCP and resumes from its last checkpoint.

    trainer.py --steps N --ckpt-every K --ckpt-dir D --out D --mesh R,S
               [--backend hsdpd|gloo] [--store FILE] [--pg-timeout S]
               [--recovery restart|warm]
Environment: RANK, WORLD_SIZE (and for hsdpd HSDPD_SOCKET, LOCAL_RANK,
HSDP_JOB_ID).

Recovery: `restart` (torchrun's way) exits 1 on any failure and the
supervisor restarts every rank. `warm` (hsdpd): a rank whose collective
failed stays alive. It ends its process groups and its hsdpd session (so
every group's epoch ends for the other ranks too, and no operation of the
failed step is left queued in any group), then initialises them again in
this process over the same store, loads the last checkpoint and goes on;
the groups' next epoch starts once every rank, and a restarted one in place
of a killed one, created them again. The hsdpd client's own reconnect is off
(HSDP_RECONNECT=0, set by the supervisor): a call after the daemon went away
fails instead of running alone in the groups' next epoch. Each recovery is
a line in out/recover.log; attempts are paced (BACKOFF_S doubling); after
GIVE_UP_S without a completed step the rank exits 1 (the supervisor then
restarts the job).

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
Exit status: 0 at the last step; 1 on an error it does not recover from (the
supervisor restarts the job).
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


def parse_args(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-every", type=int, required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mesh", required=True)
    p.add_argument("--backend", default="hsdpd")
    p.add_argument("--store", required=True)
    p.add_argument("--pg-timeout", type=float, default=60)
    p.add_argument("--recovery", default="restart", choices=("restart", "warm"))
    return p.parse_args(argv)


# Warm recovery gives up (exits 1: the supervisor then restarts the whole
# job) after this long without a completed step; between attempts it waits
# BACKOFF_S, doubling up to BACKOFF_MAX_S (a daemon or the coordinator may be
# down for seconds, and an attempt against it fails at once).
GIVE_UP_S = 90.0
BACKOFF_S, BACKOFF_MAX_S = 0.2, 3.0


def main():
    a = parse_args()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the supervisor's stack dump
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.api import CheckpointException
    torch.set_num_threads(1)
    if a.backend == "hsdpd":
        import hsdp.torch  # noqa: F401 - registers the backend
    # The model's module: a rank that cannot import it fails here, at once,
    # not in every warm recovery attempt until GIVE_UP_S.
    import transformer  # noqa: F401
    # One store for the life of the process: a warm recovery initialises the
    # process group again over it (FileStore removes its file when the last
    # instance on it goes, which a recovery of every rank at once would do).
    store = dist.FileStore(a.store, world)
    if a.recovery == "restart":
        return attempt(a, rank, world, store, 0)
    n, backoff, progress_at = 0, BACKOFF_S, time.monotonic()
    while True:
        try:
            return attempt(a, rank, world, store, n)
        # A collective that failed (a member left, a daemon went, a link broke) or a
        # checkpoint load that failed because one did (DCP's CheckpointException is a
        # BaseException): every live rank ends its session (which ends every group's
        # epoch for the others), starts over from the last checkpoint in this process,
        # and meets the others, and a restarted rank, in the groups' next epoch.
        except (Exception, CheckpointException) as e:  # noqa: BLE001
            n += 1
            if getattr(e, "chaos_progressed", False):
                progress_at, backoff = time.monotonic(), BACKOFF_S
            why = " ".join(str(e).split())[:400] or type(e).__name__
            recovered(a.out, rank, n, f"{type(e).__name__}: {why}")
            teardown(dist)
            if time.monotonic() - progress_at > GIVE_UP_S:
                raise
            time.sleep(backoff)  # not a wait on a condition: a retry's pacing
            backoff = min(2 * backoff, BACKOFF_MAX_S)


def recovered(out_dir, rank, n, why):
    """One line per warm recovery in out/recover.log (the supervisor's record)."""
    with open(os.path.join(out_dir, "recover.log"), "a") as f:
        f.write(f"{time.time():.3f} rank {rank} attempt {n} {why}\n")
    print(f"warm recovery {n}: {why}", flush=True)


def teardown(dist):
    """Ends this rank's process groups and its hsdpd session (bounded)."""
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
        else:
            # init_process_group that failed (hsdpd refused the attach while the
            # coordinator was down) had counted the default group already, and only
            # destroying WORLD resets torch's count (torch 2.15). Group names come
            # from that count, so this rank's next groups would have other names
            # than its peers' and wait in the store for keys nobody sets.
            dist.distributed_c10d._world.group_count = 0
    except Exception as e:  # noqa: BLE001 - a group of a failed epoch may refuse; go on
        print(f"destroy_process_group: {e}", flush=True)
    try:
        import hsdp.torch.session as session
        session.close()
    except Exception as e:  # noqa: BLE001
        print(f"closing the hsdpd session: {e}", flush=True)
    import gc
    gc.collect()


def attempt(a, rank, world, store, n):
    """One run from the last checkpoint to the end (or to the first failure)."""
    replicate, shard = (int(x) for x in a.mesh.split(","))
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    import transformer as T
    dist.init_process_group(a.backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=a.pg_timeout))
    mesh = init_device_mesh("cpu", (replicate, shard), mesh_dim_names=("replicate", "shard"))
    model = T.shard_transformer(T.TinyTransformer(**DIMS, seed=1), mesh, fully_shard)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)

    # Rank 0 reads LATEST for everyone: a rank recovering in this process may
    # read it before rank 0 committed the checkpoint it is saving.
    held = [latest_step(a.ckpt_dir)] if rank == 0 else [None]
    dist.broadcast_object_list(held, src=0)
    start, path = held[0]
    if path is not None:
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd, "meta": {"step": torch.tensor(-1)}}
        dcp.load(state, checkpoint_id=path)
        got = int(state["meta"]["step"])
        if got != start:
            raise RuntimeError(f"checkpoint {path} holds step {got}, LATEST says {start}")
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    if rank == 0:
        log(a.out, f"resume {start}")

    for step in range(start, a.steps):
        try:
            tokens = T.batch(step, rank, PER_RANK, DIMS["vocab"], DIMS["seq"])
            T.lm_loss(model, tokens).backward()
            opt.step()
            opt.zero_grad()
            done = step + 1
            if rank == 0:
                log(a.out, f"step {done}")
            if done % a.ckpt_every == 0 and done < a.steps:
                checkpoint(a, rank, n, done, model, opt)
        except (Exception, CheckpointException) as e:  # noqa: BLE001
            e.chaos_progressed = step > start
            raise

    params = {}
    for name, prm in model.named_parameters():
        params[name] = prm.full_tensor().detach().numpy().copy()  # an all-gather on every rank
    if rank == 0:
        import numpy as np
        np.savez(os.path.join(a.out, "final.npz"), **params)
        h = hashlib.sha256()
        for name in sorted(params):
            h.update(name.encode())
            h.update(params[name].tobytes())
        with open(os.path.join(a.out, "final.sha256"), "w") as f:
            f.write(h.hexdigest() + "\n")
        log(a.out, f"done {a.steps}")
    dist.destroy_process_group()
    return 0


def checkpoint(a, rank, n, done, model, opt):
    """Saves step `done` with DCP and commits it (rank 0); a failed save is reported."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import get_state_dict
    # The save's directory names rank 0's process and attempt: a recovered
    # attempt never writes into the partial save of an earlier one.
    owner = [f"{os.getpid()}.{n}"] if rank == 0 else [None]
    dist.broadcast_object_list(owner, src=0)
    tmp = os.path.join(a.ckpt_dir, f"tmp-{done}-{owner[0]}")
    msd, osd = get_state_dict(model, opt)
    try:
        dcp.save({"model": msd, "optim": osd, "meta": {"step": torch.tensor(done)}},
                 checkpoint_id=tmp)
        ok = None
    # DCP raises the same on every rank; its CheckpointException (a full
    # disk on any rank) derives from BaseException, not Exception.
    # A collective that failed inside the save fails the barrier below too.
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


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - the supervisor restarts the job; the log says why
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
