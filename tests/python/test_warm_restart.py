"""Warm restart of a trainer ($HSDP_WARM_RESTART=1): rank 1 of a two-rank torch job over
hsdpd dies in the middle of training; a new rank-1 process starts from its
last checkpoint. The survivor keeps its process group: its failed step's
error tells the backend the group's epoch ended, its retry of the step joins
the next epoch, which starts when the restarted rank creates the group anew.
The final parameters equal an uninterrupted run's.
"""
import multiprocessing as mp
import os
import pickle

STEPS, CRASH_AFTER, LR = 10, 4, 0.01


def expected():
    w = [0.0] * 4
    for s in range(1, STEPS + 1):
        w = [v - LR * 3 * s for v in w]  # (1 + 2) * s summed over the two ranks
    return w


def _train(rank, port, ckpt, phase, queue):
    try:
        import torch
        import torch.distributed as dist
        import hsdp.torch  # noqa: F401 - registers the backend
        torch.set_num_threads(1)
        os.environ["HSDP_JOB_ID"] = "warm-restart"
        os.environ["HSDP_WARM_RESTART"] = "1"
        store = dist.TCPStore("127.0.0.1", port, 2, is_master=False)
        dist.init_process_group("hsdpd", store=store, rank=rank, world_size=2)
        w, start = torch.zeros(4), 1
        path = os.path.join(ckpt, f"rank{rank}.pt")
        if phase == "restarted":
            with open(path, "rb") as f:
                state = pickle.load(f)
            w, start = torch.tensor(state["w"]), state["step"] + 1
        failures = []
        s = start
        while s <= STEPS:
            if rank == 1 and phase == "first" and s == CRASH_AFTER + 1:
                os._exit(17)  # the crash: no cleanup, no detach
            g = torch.full((4,), float((rank + 1) * s))
            try:
                dist.all_reduce(g)
            except RuntimeError as e:
                failures.append(str(e))
                if len(failures) > 3:
                    raise
                continue  # the same step again
            w -= LR * g
            with open(path, "wb") as f:
                pickle.dump({"w": w.tolist(), "step": s}, f)
            s += 1
        dist.destroy_process_group()
        queue.put((rank, phase, w.tolist(), failures))
    except BaseException:  # noqa: B902
        import traceback
        queue.put((rank, phase, None, traceback.format_exc()))


def test_a_restarted_rank_rejoins_and_training_matches_an_uninterrupted_run(hsdpd, tmp_path):
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    env_socket = os.environ["HSDPD_SOCKET"]
    assert env_socket == hsdpd.socket
    procs = [ctx.Process(target=_train, args=(r, store.port, str(tmp_path), "first", queue))
             for r in range(2)]
    for p in procs:
        p.start()
    procs[1].join(120)
    assert procs[1].exitcode == 17, "rank 1 should have crashed on purpose"
    restarted = ctx.Process(target=_train, args=(1, store.port, str(tmp_path), "restarted", queue))
    restarted.start()
    results = {}
    for _ in range(2):
        rank, phase, w, info = queue.get(timeout=180)
        assert w is not None, info
        results[(rank, phase)] = (w, info)
    procs[0].join(30)
    restarted.join(30)
    want = expected()
    w0, survivor_failures = results[(0, "first")]
    w1, restarted_failures = results[(1, "restarted")]
    for got in (w0, w1):
        assert all(abs(a - b) < 1e-4 for a, b in zip(got, want)), (got, want)
    # The survivor saw its step fail once (the member left), then went on.
    assert len(survivor_failures) == 1, survivor_failures
    assert "left the job" in survivor_failures[0], survivor_failures[0]
    assert restarted_failures == []
