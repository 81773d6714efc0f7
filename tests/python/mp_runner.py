"""Runs a function in N spawned processes with torch.distributed initialised.

Each worker: init_process_group(backend, file:// store), result = fn(rank,
world_size, *args), destroy. Results (picklable) come back in rank order; a
worker exception fails the caller with that worker's traceback.

For clusters, `env` gives each rank its own environment (HSDPD_SOCKET picks
the node's daemon), `backend=None` skips torch.distributed (hsdp.Client
workers), and `expect` lists the ranks that must report (a rank that kills
itself on purpose does not).

Workers are forked from a forkserver that imported torch once (each spawned
worker used to import it again: about 3 s of CPU per rank per launch here).
The server started with the environment of its first use, so each worker
takes the caller's environment as it is at launch (os.environ, then `env`).
"""
import datetime
import multiprocessing as mp
import os
import queue as queue_mod
import time
import traceback
import uuid


def _worker(fn, rank, world_size, args, backend, store_path, queue, env, pg_timeout):
    try:
        os.environ.clear()
        os.environ.update(env)
        import torch
        torch.set_num_threads(1)
        if backend is None:
            queue.put((rank, True, fn(rank, world_size, *args)))
            return
        import torch.distributed as dist
        if backend == "hsdpd":
            import hsdp.torch  # noqa: F401 - registers the backend
        kwargs = {} if pg_timeout is None else {
            "timeout": datetime.timedelta(seconds=pg_timeout)}
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                                world_size=world_size, **kwargs)
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        queue.put((rank, True, result))
    except BaseException:  # noqa: B902
        queue.put((rank, False, traceback.format_exc()))


_PRELOAD = ["torch", "torch.distributed"]
_context = None


def _ctx():
    global _context
    if _context is None:
        _context = mp.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def launch(fn, world_size, args, backend, tmpdir, timeout, env=None, expect=None,
           pg_timeout=None):
    """Results of the `expect` ranks (default: all) in rank order (None for the others)."""
    ctx = _ctx()
    queue = ctx.Queue()
    store = os.path.join(tmpdir, f"store-{uuid.uuid4().hex[:8]}")
    expect = list(range(world_size)) if expect is None else sorted(expect)
    procs = [ctx.Process(target=_worker, args=(fn, r, world_size, args, backend, store, queue,
                                               {**os.environ, **(env[r] if env else {})},
                                               pg_timeout))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results, errors = {}, []
    deadline = time.monotonic() + timeout
    try:
        for _ in expect:
            try:
                rank, ok, value = queue.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue_mod.Empty:
                missing = [r for r in expect if r not in results]
                errors.append(f"rank(s) {missing} did not finish within {timeout} s")
                break
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
    return [results.get(r) for r in range(world_size)]
