"""The torch 2.x surface of the "hsdpd" backend: group names, DeviceMesh,
DTensor, functional collectives, PREMUL_SUM / AVG, and failures reached through
C++ callers (functional collectives, DTensor) that must raise, never return
the output buffer's old contents.

Expected values are computed here from each rank's known inputs (no Gloo run
needed); every worker runs over hsdpd.
"""
import pytest


def _funcol_values(rank, world, group):
    """Each functional collective against its expected value; returns the failures."""
    import torch
    import torch.distributed._functional_collectives as funcol
    bad = []

    def check(name, got, want):
        got = got.wait() if hasattr(got, "wait") and not isinstance(got, torch.Tensor) else got
        got = [g + 0 for g in got] if isinstance(got, (list, tuple)) else got + 0
        want_l = want if isinstance(want, (list, tuple)) else [want]
        got_l = got if isinstance(got, (list, tuple)) else [got]
        for g, w in zip(got_l, want_l):
            if g.shape != w.shape or not torch.allclose(g, w):
                bad.append(f"{name}: got {g.tolist()} want {w.tolist()}")

    x = torch.arange(2 * world, dtype=torch.float32) + 10 * rank
    total = sum(torch.arange(2 * world, dtype=torch.float32) + 10 * r for r in range(world))
    check("all_reduce", funcol.all_reduce(x, "sum", group), total)
    check("all_reduce avg", funcol.all_reduce(x, "avg", group), total / world)
    gathered = torch.cat([torch.arange(2 * world, dtype=torch.float32) + 10 * r
                          for r in range(world)])
    check("all_gather_tensor", funcol.all_gather_tensor(x, 0, group), gathered)
    check("reduce_scatter_tensor", funcol.reduce_scatter_tensor(x, "sum", 0, group),
          total[2 * rank:2 * rank + 2])
    # all_to_all_single: block j of rank r goes to rank j.
    want_a2a = torch.cat([(torch.arange(2 * world, dtype=torch.float32) + 10 * r)
                          [2 * rank:2 * rank + 2] for r in range(world)])
    check("all_to_all_single", funcol.all_to_all_single(x, None, None, group), want_a2a)
    y = torch.full((3,), float(rank + 1))
    ysum = torch.full((3,), float(world * (world + 1) / 2))
    check("all_reduce_coalesced", funcol.all_reduce_coalesced([x, y], "sum", group),
          [total, ysum])
    check("all_gather_into_tensor_coalesced",
          funcol.all_gather_into_tensor_coalesced([x, y], group),
          [gathered, torch.cat([torch.full((3,), float(r + 1)) for r in range(world)])])
    z = torch.arange(world * 3, dtype=torch.float32) * (rank + 1)
    zsum = torch.arange(world * 3, dtype=torch.float32) * (world * (world + 1) / 2)
    check("reduce_scatter_tensor_coalesced",
          funcol.reduce_scatter_tensor_coalesced([x, z], "sum", [0, 0], group),
          [total[2 * rank:2 * rank + 2], zsum[3 * rank:3 * rank + 3]])
    return bad


def mesh_funcol_dtensor_worker(rank, world):
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    out = {}
    pg = dist.distributed_c10d._get_default_group()
    out["group_name_ok"] = pg.group_name == dist.distributed_c10d._world.pg_names[pg]
    out["funcol_default"] = _funcol_values(rank, world, pg)

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    out["mesh_backend"] = dist.get_backend(mesh.get_group())
    out["funcol_mesh"] = _funcol_values(rank, world, mesh)
    glob = torch.arange(4 * world * 3, dtype=torch.float32).reshape(4 * world, 3)
    d = distribute_tensor(glob, mesh, [Shard(0)])
    out["shard_ok"] = torch.equal(d.to_local(), glob[4 * rank:4 * rank + 4])
    out["full_ok"] = torch.equal(d.full_tensor(), glob)
    out["replicate_ok"] = torch.equal(d.redistribute(mesh, [Replicate()]).to_local(), glob)
    # A partial sum over the mesh: every rank contributes; the sum is reduced by hsdpd.
    out["sum_ok"] = abs(float(d.sum().full_tensor()) - float(glob.sum())) < 1e-3

    # clip_grad_norm_ over sharded parameters (the norm needs an all-reduce of the shards).
    w = torch.nn.Parameter(distribute_tensor(torch.ones(2 * world, 4), mesh, [Shard(0)]))
    w.grad = distribute_tensor(torch.full((2 * world, 4), 3.0), mesh, [Shard(0)])
    norm = torch.nn.utils.clip_grad_norm_([w], max_norm=1.0)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    out["clip_norm"] = float(norm)
    out["clipped_grad"] = float(w.grad.full_tensor().abs().max())

    # The explicit backend form and a 2-D mesh (replicate x shard) when 4 ranks.
    if world == 4:
        mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"),
                                 backend_override={0: "hsdpd", 1: "hsdpd"})
        out["mesh2_backends"] = [dist.get_backend(mesh2.get_group(n))
                                 for n in ("replicate", "shard")]
        out["mesh2_ranks"] = [dist.get_process_group_ranks(mesh2.get_group(n))
                              for n in ("replicate", "shard")]
        d2 = distribute_tensor(glob, mesh2, [Replicate(), Shard(0)])
        out["mesh2_full_ok"] = torch.equal(d2.full_tensor(), glob)
        out["funcol_mesh2"] = _funcol_values(mesh2.get_local_rank("shard"), 2,
                                             mesh2.get_group("shard"))
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_device_mesh_dtensor_and_functional_collectives(run, world):
    for rank, r in enumerate(run(mesh_funcol_dtensor_worker, world)):
        assert r["group_name_ok"], r
        assert r["funcol_default"] == [] and r["funcol_mesh"] == [], r
        assert r["mesh_backend"] == "hsdpd"
        assert r["shard_ok"] and r["full_ok"] and r["replicate_ok"] and r["sum_ok"], r
        # |grad| = 3 everywhere over 2*world*4 elements.
        want = 3.0 * (2 * world * 4) ** 0.5
        assert r["clip_norm"] == pytest.approx(want, rel=1e-5)
        assert r["clipped_grad"] == pytest.approx(3.0 / want, rel=1e-4)
        if world == 4:
            assert r["mesh2_backends"] == ["hsdpd", "hsdpd"]
            assert rank in r["mesh2_ranks"][0] and rank in r["mesh2_ranks"][1]
            assert sorted(r["mesh2_ranks"][0] + r["mesh2_ranks"][1]) != []
            assert r["mesh2_full_ok"] and r["funcol_mesh2"] == [], r


def reduce_ops_worker(rank, world):
    import torch
    import torch.distributed as dist
    from torch.distributed import ReduceOp
    out = {}
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, op=ReduceOp.PREMUL_SUM(0.25))
    out["premul_allreduce"] = t.tolist()
    # FSDP2's form: a fresh op per call, a tensor factor; two factors back to back.
    x = torch.arange(2 * world, dtype=torch.float32) * (rank + 1)
    o1, o2 = torch.empty(2), torch.empty(2)
    w1 = dist.reduce_scatter_tensor(o1, x, op=ReduceOp.PREMUL_SUM(1.0 / 3), async_op=True)
    w2 = dist.reduce_scatter_tensor(o2, x, op=ReduceOp.PREMUL_SUM(torch.tensor(2.0)),
                                    async_op=True)
    w1.wait()
    w2.wait()
    out["premul_rs"] = (o1.tolist(), o2.tolist())
    a = torch.full((3,), float(rank + 1))
    dist.all_reduce(a, op=ReduceOp.AVG)
    out["avg"] = a.tolist()
    return out


def test_premul_sum_reads_the_factor_of_each_op(run):
    world = 2
    s = world * (world + 1) / 2  # sum over ranks of (rank + 1)
    for rank, r in enumerate(run(reduce_ops_worker, world)):
        assert r["premul_allreduce"] == pytest.approx([0.25 * s] * 4)
        base = [2 * rank, 2 * rank + 1]
        assert r["premul_rs"][0] == pytest.approx([v * s / 3 for v in base])
        assert r["premul_rs"][1] == pytest.approx([v * s * 2 for v in base])
        assert r["avg"] == pytest.approx([s / world] * 3)


def failure_worker(rank, world):
    """Mismatched operations (rank 0 and rank 1 disagree on the size) that the daemon
    refuses, reached through C++ callers that only wait() on the Work."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    pg = dist.distributed_c10d._get_default_group()
    n = 4 if rank == 0 else 8
    results = {}

    def attempt(name, fn):
        try:
            got = fn()
            results[name] = f"no error; returned {got.tolist()}"
        except Exception as e:  # noqa: BLE001
            results[name] = f"raised {type(e).__name__}: {e}"
        dist.barrier()  # both ranks are past the failed op before the next one

    attempt("funcol.all_reduce", lambda: funcol.all_reduce(torch.ones(n), "sum", pg) + 0)
    attempt("funcol.all_gather_tensor",
            lambda: funcol.all_gather_tensor(torch.ones(n), 0, pg) + 0)
    attempt("funcol.reduce_scatter_tensor",
            lambda: funcol.reduce_scatter_tensor(torch.ones(2 * n), "sum", 0, pg) + 0)
    attempt("funcol.all_to_all_single",
            lambda: funcol.all_to_all_single(torch.ones(2 * n), None, None, pg) + 0)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    # Shards of different sizes that DTensor is told are even: the all-gather behind
    # full_tensor() is refused by the daemon.
    local = torch.full((n,), float(rank + 1))
    d = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
    attempt("DTensor.full_tensor", lambda: d.full_tensor())
    # The group still works afterwards.
    t = torch.ones(2)
    dist.all_reduce(t)
    results["after"] = t.tolist()
    return results


def test_failures_through_funcol_and_dtensor_raise(run):
    for r in run(failure_worker, 2):
        assert r.pop("after") == [2.0, 2.0]
        for name, outcome in r.items():
            assert outcome.startswith("raised"), f"{name}: {outcome}"
            assert "hsdpd" in outcome, f"{name}: {outcome}"


def groups_worker(rank, world):
    """split_group, new_subgroups, a subgroup's own timeout, destroying a subgroup."""
    import datetime
    import torch
    import torch.distributed as dist
    out = {}
    # split_group: {0, 2} and {1, 3} (every rank calls it with the whole split).
    sub = dist.split_group(split_ranks=[[0, 2], [1, 3]])
    t = torch.full((2,), float(rank))
    dist.all_reduce(t, group=sub)
    out["split"] = (dist.get_backend(sub), dist.get_process_group_ranks(sub), t.tolist(),
                    sub.group_name != dist.distributed_c10d._get_default_group().group_name)
    # new_subgroups: consecutive pairs.
    cur, _ = dist.new_subgroups(group_size=2)
    u = torch.full((2,), float(rank + 1))
    dist.all_reduce(u, group=cur)
    out["subgroups"] = (dist.get_process_group_ranks(cur), u.tolist())
    # A subgroup with its own (short) timeout: rank 0 waits alone on a barrier.
    short = dist.new_group([0, 3], timeout=datetime.timedelta(seconds=1))
    if rank == 0:
        try:
            dist.barrier(group=short)
            out["timeout"] = "no error"
        except RuntimeError as e:
            out["timeout"] = str(e)
    # set_timeout changes the bound of the group's later operations.
    dist.distributed_c10d._get_default_group().set_timeout(datetime.timedelta(seconds=120))
    dist.barrier()  # every rank is past the failed barrier before the groups go
    dist.destroy_process_group(sub)
    dist.destroy_process_group(cur)
    v = torch.ones(1)
    dist.all_reduce(v)  # the default group still works
    out["after"] = v.tolist()
    return out


def test_split_group_new_subgroups_timeouts_destroy(run):
    world = 4
    for rank, r in enumerate(run(groups_worker, world)):
        backend, ranks, vals, own_name = r["split"]
        assert backend == "hsdpd" and own_name
        assert ranks == ([0, 2] if rank % 2 == 0 else [1, 3])
        assert vals == [float(sum(ranks))] * 2
        sranks, svals = r["subgroups"]
        assert sranks == [rank - rank % 2, rank - rank % 2 + 1]
        assert svals == [float(sranks[0] + 1 + sranks[1] + 1)] * 2
        if rank == 0:
            assert "Timed out waiting 1000ms" in r["timeout"], r["timeout"]
        assert r["after"] == [4.0]


def killed_peer_worker(rank, world):
    """Rank 1 dies between two steps; rank 0's DTensor full_tensor() and functional
    all-reduce must raise (naming the lost rank), not return stale data."""
    import os
    import time
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    d = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
    dist.barrier()
    if rank == 1:
        os._exit(0)  # no goodbye: the daemon sees the session drop
    out = {}
    for name, fn in (("DTensor.full_tensor", lambda: d.full_tensor()),
                     ("funcol.all_reduce",
                      lambda: funcol.all_reduce(torch.ones(4), "sum", mesh) + 0)):
        start = time.monotonic()
        try:
            got = fn()
            out[name] = (f"no error; returned {got.tolist()}", time.monotonic() - start)
        except Exception as e:  # noqa: BLE001
            out[name] = (f"raised {type(e).__name__}: {e}", time.monotonic() - start)
    return out


def test_a_killed_peer_fails_dtensor_and_funcol(hsdpd, tmp_path):
    import mp_runner
    res = mp_runner.launch(killed_peer_worker, 2, (), "hsdpd", str(tmp_path), 180,
                          expect=[0], pg_timeout=60)
    for name, (outcome, seconds) in res[0].items():
        assert outcome.startswith("raised"), f"{name}: {outcome}"
        assert "rank 1" in outcome, f"{name}: {outcome}"
        assert seconds < 60, f"{name}: took {seconds:.1f} s (the group's timeout)"


def no_holder_worker(rank, world):
    """A torch build whose c10d.Backend has no Python constructor (torch 2.11,
    seen on the GPU machine: "_NameHolder: No constructor defined!"): the
    group runs without the holder and its collectives are unchanged."""
    import torch
    import torch.distributed as dist
    from hsdp.torch import name_holder

    class NoConstructor:
        def __init__(self, *args):
            raise TypeError("_NameHolder: No constructor defined!")

    real = name_holder._NameHolder
    name_holder._NameHolder = NoConstructor
    try:
        group = dist.new_group(list(range(world)), backend="hsdpd")
    finally:
        name_holder._NameHolder = real
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x, group=group)
    return {"sum": x.tolist(), "holder": getattr(group, "_hsdp_name_holder", "missing")}


def test_a_torch_without_a_backend_constructor_runs_without_the_holder(run):
    world = 2
    for r in run(no_holder_worker, world):
        assert r["sum"] == [3.0] * 4
        assert r["holder"] is None
