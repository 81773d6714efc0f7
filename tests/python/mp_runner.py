"""Runs a function in N spawned processes with torch.distributed initialised.

Each worker: init_process_group(backend, file:// store), result = fn(rank,
world_size, *args), destroy. Results (picklable) come back in rank order; a
worker exception fails the caller with that worker's traceback.
"""
import multiprocessing as mp
import os
import traceback
import uuid


def _worker(fn, rank, world_size, args, backend, store_path, queue):
    try:
        import torch
        import torch.distributed as dist
        torch.set_num_threads(1)
        if backend == "hsdpd":
            import hsdp.torch  # noqa: F401 - registers the backend
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                                world_size=world_size)
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        queue.put((rank, True, result))
    except BaseException:  # noqa: B902
        queue.put((rank, False, traceback.format_exc()))


def launch(fn, world_size, args, backend, tmpdir, timeout):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = os.path.join(tmpdir, f"store-{uuid.uuid4().hex[:8]}")
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, args, backend, store, queue))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results, errors = {}, []
    try:
        for _ in range(world_size):
            rank, ok, value = queue.get(timeout=timeout)
            if ok:
                results[rank] = value
            else:
                errors.append(f"rank {rank}:\n{value}")
                break
    finally:
        for p in procs:
            p.join(5 if not errors else 1)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("worker failed:\n" + "\n".join(errors))
    return [results[r] for r in range(world_size)]
