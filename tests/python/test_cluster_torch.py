"""The torch backend "hsdpd" across nodes: a cluster of real daemons on loopback.

Every trainer is its own process attached to its node's daemon (HSDPD_SOCKET)
with its global rank and the world size; torch's store is shared (file://).
Placements are lists: rank r runs on node placement[r]. [0, 1, 1, 0] puts
ranks {0, 3} on node 0 and {1, 2} on node 1, so the world group and most
subgroups span both nodes and are not contiguous per node.
"""
import time

import numpy as np
import pytest
import torch

CONTIGUOUS = [0, 0, 1, 1]
INTERLEAVED = [0, 1, 1, 0]


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 4))


def _socket():
    """The daemon this process is attached to ("" for Gloo)."""
    import torch.distributed as dist
    if dist.get_backend() != "hsdpd":
        return ""
    import hsdp.torch
    return hsdp.torch.client().socket_path


def ddp_worker(rank, world, steps):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = _net()
    ddp = DDP(model, bucket_cap_mb=0.001)  # several buckets: several all-reduces per step
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    for step in range(steps):
        opt.zero_grad()
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        if step % 3 == 2:  # gradient accumulation: no_sync, then a synchronised step
            with ddp.no_sync():
                torch.nn.functional.mse_loss(ddp(x), y).backward()
            x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    return {"params": [p.detach().numpy().copy() for p in model.parameters()],
            "socket": _socket(), "backend": dist.get_backend(), "world": dist.get_world_size()}


@pytest.mark.parametrize("placement", [CONTIGUOUS, INTERLEAVED], ids=["0011", "0110"])
def test_ddp_two_nodes_matches_gloo(cluster2, cluster_run, placement):
    steps = 6
    ours = cluster_run(cluster2, ddp_worker, placement, steps)
    ref = cluster_run(cluster2, ddp_worker, placement, steps, backend="gloo")
    for r, node in enumerate(placement):
        assert ours[r]["backend"] == "hsdpd" and ref[r]["backend"] == "gloo"
        assert ours[r]["world"] == 4
        assert ours[r]["socket"] == cluster2.sockets[node]  # attached to its own node
        for got, want in zip(ours[r]["params"], ref[r]["params"]):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
        for got, want in zip(ours[r]["params"], ours[0]["params"]):
            np.testing.assert_array_equal(got, want)  # replicas stay identical
    # Training moved the parameters (a test that compared untouched weights would pass).
    assert not np.allclose(ours[0]["params"][0], _net()[0].weight.detach().numpy())


# -- the flat-parameter HSDP helper ----------------------------------------------------------

def _batches(steps, micro, world):
    gen = torch.Generator().manual_seed(7)
    return [[(torch.randn(4 * world, 12, generator=gen), torch.randn(4 * world, 3, generator=gen))
             for _ in range(micro)] for _ in range(steps)]


def _flat_model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(),
                               torch.nn.Linear(24, 3))


def flat_reference(steps, micro, world):
    """One process, the whole batch: what every rank's parameters must equal ("avg")."""
    model = _flat_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in _batches(steps, micro, world):
        opt.zero_grad()
        for x, y in step:
            loss = torch.nn.functional.mse_loss(model(x), y, reduction="sum") / 4
            (loss / world).backward()  # each rank's loss is over its 4 rows; avg over ranks
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def flat_worker(rank, world, steps, micro, mode, bucket_size):
    import hsdp.torch
    from hsdp.flat_param import FlatParameters
    model = _flat_model()
    fp = FlatParameters(model, hsdp.torch.client(), shard_size=2, bucket_size=bucket_size)
    opt = torch.optim.SGD(fp.parameters(), lr=0.1)
    for step in _batches(steps, micro, world):
        fp.zero_grad()
        fp.unshard()
        for m, (x, y) in enumerate(step):
            last = m == micro - 1
            if mode == "no_sync":
                fp.set_requires_grad_sync(last)
            else:  # reduce-scatter every micro-batch, all-reduce once at the end
                fp.set_requires_all_reduce(last)
            xs, ys = x[4 * rank:4 * rank + 4], y[4 * rank:4 * rank + 4]
            torch.nn.functional.mse_loss(model(xs), ys, reduction="sum").div(4).backward()
            fp.reduce_grads()
            if mode == "reduce_scatter_only":
                fp.sync()  # before the next backward: it clears the full gradients
                if not last:
                    assert all(p.grad is None for p in fp.parameters())
        fp.sync()
        opt.step()
    fp.unshard()
    return {"params": [p.detach().numpy().copy() for p in model.parameters()],
            "shard": fp.shard_group.ranks, "replicate": fp.replicate_group.ranks,
            "buckets": fp.num_buckets, "socket": _socket()}


@pytest.mark.parametrize("placement,mode,bucket_size", [
    (CONTIGUOUS, "no_sync", -1),              # shard group in a node, replicate across nodes
    (CONTIGUOUS, "reduce_scatter_only", 0),   # the accumulation variant, one bucket per param
    ([0, 1, 0, 1], "reduce_scatter_only", -1),  # transpose: shard across, replicate inside
], ids=["shard-in-node", "shard-in-node-accumulate", "shard-across-accumulate"])
def test_flat_parameters_hsdp_across_nodes(cluster2, cluster_run, placement, mode,
                                           bucket_size):
    world, steps, micro = 4, 3, 2
    res = cluster_run(cluster2, flat_worker, placement, steps, micro, mode, bucket_size)
    want = flat_reference(steps, micro, world)
    for r, node in enumerate(placement):
        assert res[r]["socket"] == cluster2.sockets[node]
        assert res[r]["shard"] == ([0, 1] if r < 2 else [2, 3])
        assert res[r]["replicate"] == [r % 2, r % 2 + 2]
        for got, ref in zip(res[r]["params"], want):
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    shard_nodes = {placement[r] for r in res[0]["shard"]}
    replicate_nodes = {placement[r] for r in res[0]["replicate"]}
    if placement == CONTIGUOUS:
        assert len(shard_nodes) == 1 and len(replicate_nodes) == 2
    else:
        assert len(shard_nodes) == 2 and len(replicate_nodes) == 1
    if bucket_size == 0:
        assert res[0]["buckets"] == 4


# -- the torch collectives ---------------------------------------------------------------------

def collectives_worker(rank, world):
    """Every torch collective once over the world group; values exact in every dtype used."""
    import torch.distributed as dist
    out = {}
    x = torch.arange(10, dtype=torch.float32) + rank
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    out["avg"] = x.tolist()
    h = (torch.arange(6, dtype=torch.float32) * (rank + 1)).to(torch.bfloat16)
    dist.all_reduce(h)
    out["bf16_sum"] = h.float().tolist()
    i = torch.tensor([rank + 2, -rank], dtype=torch.int64)
    dist.all_reduce(i, op=dist.ReduceOp.PRODUCT)
    out["i64_product"] = i.tolist()
    coalesced = [torch.full((3,), float(rank)), torch.full((5,), 2.0 * rank)]
    dist.all_reduce_coalesced(coalesced)
    out["coalesced"] = [t.tolist() for t in coalesced]
    big = torch.empty(world * 3, dtype=torch.float64)
    dist.all_gather_into_tensor(big, torch.full((3,), rank + 0.5, dtype=torch.float64))
    out["gather_into"] = big.tolist()
    rs = torch.zeros(2, dtype=torch.int32)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * world, dtype=torch.int32) * (rank + 1))
    out["reduce_scatter"] = rs.tolist()
    red = torch.full((4,), float(rank))
    dist.reduce(red, dst=3, op=dist.ReduceOp.MAX)
    out["reduce"] = red.tolist() if rank == 3 else None
    gl = [torch.zeros(2) for _ in range(world)] if rank == 1 else None
    dist.gather(torch.full((2,), float(rank)), gather_list=gl, dst=1)
    out["gather"] = [t.tolist() for t in gl] if rank == 1 else None
    sc = torch.zeros(3)
    dist.scatter(sc, [torch.full((3,), 10.0 * r) for r in range(world)] if rank == 2 else None,
                 src=2)
    out["scatter"] = sc.tolist()
    a2a = torch.empty(world, dtype=torch.int64)
    dist.all_to_all_single(a2a, torch.arange(world, dtype=torch.int64) + 10 * rank)
    out["all_to_all"] = a2a.tolist()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "node": _socket()})
    out["objects"] = objs
    dist.barrier()
    return out


def test_torch_collectives_across_nodes(cluster2, cluster_run):
    world = 4
    res = cluster_run(cluster2, collectives_worker, INTERLEAVED)
    for r in range(world):
        got = res[r]
        assert got["avg"] == [k + 1.5 for k in range(10)]  # mean of k + {0, 1, 2, 3}
        assert got["bf16_sum"] == [k * 10.0 for k in range(6)]
        assert got["i64_product"] == [2 * 3 * 4 * 5, 0]
        assert got["coalesced"] == [[6.0] * 3, [12.0] * 5]
        assert got["gather_into"] == [q + 0.5 for q in range(world) for _ in range(3)]
        assert got["reduce_scatter"] == [10 * (2 * r), 10 * (2 * r + 1)]
        assert got["scatter"] == [10.0 * r] * 3
        assert got["all_to_all"] == [10 * q + r for q in range(world)]
        assert [o["rank"] for o in got["objects"]] == list(range(world))
        assert [o["node"] for o in got["objects"]] == [cluster2.sockets[n] for n in INTERLEAVED]
    assert res[3]["reduce"] == [3.0] * 4
    assert res[1]["gather"] == [[float(q)] * 2 for q in range(world)]


# -- subgroups and point-to-point ---------------------------------------------------------------

def subgroup_worker(rank, world):
    import torch.distributed as dist
    out = {}
    # Every rank creates every group in the same order (torch's rule); sorted global ranks.
    specs = {"local0": [0, 3], "pair": [1, 3], "three": [0, 1, 2], "odd": [3, 2, 1]}
    groups = {name: dist.new_group(ranks, backend="hsdpd") for name, ranks in specs.items()}
    for name, ranks in specs.items():
        if rank not in ranks:
            continue
        g = groups[name]
        members = sorted(ranks)
        x = torch.tensor([float(rank + 1), 10.0 * rank], dtype=torch.float32)
        dist.all_reduce(x, group=g)
        gathered = [torch.zeros(3, dtype=torch.int64) for _ in members]
        dist.all_gather(gathered, torch.tensor([rank, rank * rank, -rank]), group=g)
        b = torch.full((4,), float(rank), dtype=torch.float64)
        dist.broadcast(b, src=members[-1], group=g)
        h = torch.full((5,), rank + 0.5, dtype=torch.float32).to(torch.bfloat16)
        dist.all_reduce(h, op=dist.ReduceOp.MAX, group=g)
        out[name] = {"group_rank": dist.get_rank(g), "size": dist.get_world_size(g),
                     "hsdp_ranks": list(g.hsdp_group.ranks), "sum": x.tolist(),
                     "gather": [t.tolist() for t in gathered], "bcast": b.tolist(),
                     "max": h.float().tolist()}
    dist.barrier()
    return out


def test_subgroups_across_nodes(cluster2, cluster_run):
    res = cluster_run(cluster2, subgroup_worker, INTERLEAVED)
    specs = {"local0": [0, 3], "pair": [1, 3], "three": [0, 1, 2], "odd": [3, 2, 1]}
    for name, ranks in specs.items():
        members = sorted(ranks)
        for r in members:
            got = res[r][name]
            assert got["group_rank"] == members.index(r) and got["size"] == len(members)
            assert got["hsdp_ranks"] == members  # the daemon group holds the global ranks
            assert got["sum"] == [sum(m + 1 for m in members), sum(10.0 * m for m in members)]
            assert got["gather"] == [[m, m * m, -m] for m in members]
            assert got["bcast"] == [float(members[-1])] * 4
            assert got["max"] == [max(members) + 0.5] * 5
        for r in set(range(4)) - set(members):
            assert name not in res[r]


def p2p_worker(rank, world):
    import torch.distributed as dist
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    out = {}
    # A ring over the interleaved placement: 0->1 and 2->3 cross nodes, 1->2 and 3->0 do not.
    recv = torch.zeros(6, dtype=torch.float32)
    s = dist.isend(torch.arange(6, dtype=torch.float32) + 100 * rank, nxt, tag=3)
    r = dist.irecv(recv, src=prv, tag=3)
    s.wait()
    r.wait()
    out["ring"] = recv.tolist()
    # Two tags between the same pair, received in the other order.
    if rank in (0, 1):
        peer = 1 - rank
        if rank == 0:
            dist.send(torch.tensor([1, 2, 3], dtype=torch.int64), peer, tag=1)
            dist.send(torch.tensor([4, 5, 6], dtype=torch.int64), peer, tag=2)
        else:
            a, b = torch.zeros(3, dtype=torch.int64), torch.zeros(3, dtype=torch.int64)
            wb = dist.irecv(b, src=peer, tag=2)
            wa = dist.irecv(a, src=peer, tag=1)
            wa.wait()
            wb.wait()
            out["tags"] = [a.tolist(), b.tolist()]
    # batch_isend_irecv: both neighbours at once, half precision.
    left, right = torch.zeros(4, dtype=torch.float16), torch.zeros(4, dtype=torch.float16)
    ops = [dist.P2POp(dist.isend, torch.full((4,), rank + 0.25, dtype=torch.float16), nxt),
           dist.P2POp(dist.isend, torch.full((4,), -rank - 0.5, dtype=torch.float16), prv),
           dist.P2POp(dist.irecv, left, prv), dist.P2POp(dist.irecv, right, nxt)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    out["batch"] = [left.tolist(), right.tolist()]
    # A receive from any source cannot be paired across nodes: a clear error, not a hang.
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.irecv(torch.zeros(1)).wait()
            out["any_source"] = ("no error", 0.0)
        except Exception as e:  # noqa: BLE001 - the message is what the test checks
            out["any_source"] = (str(e), time.monotonic() - t0)
    dist.barrier()
    return out


def test_send_recv_across_nodes(cluster2, cluster_run):
    res = cluster_run(cluster2, p2p_worker, INTERLEAVED, pg_timeout=60)
    for r in range(4):
        prv, nxt = (r - 1) % 4, (r + 1) % 4
        assert res[r]["ring"] == [100.0 * prv + i for i in range(6)]
        assert res[r]["batch"] == [[prv + 0.25] * 4, [-nxt - 0.5] * 4]
    assert res[1]["tags"] == [[1, 2, 3], [4, 5, 6]]
    msg, took = res[0]["any_source"]
    assert "any source" in msg and took < 30, msg


# -- failures -------------------------------------------------------------------------------------

VICTIM = 2  # on node 1 in the interleaved placement


def killed_trainer_worker(rank, world, sockets):
    import os
    import signal
    import torch.distributed as dist
    from cluster_util import queued_ops
    from waiting import wait_until
    dist.barrier()  # every rank attached and the world group formed on both nodes
    if rank == VICTIM:
        # The others' all_reduce has reached both daemons (the victim's node
        # holds its other rank's arrival; the other node its ranks' op).
        wait_until(lambda: all((queued_ops(s) or 0) >= 1 for s in sockets), 60,
                   "the others' all_reduce never reached both daemons")
        os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1000))
        return {"error": None, "seconds": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001 - the message is what the test checks
        return {"error": str(e), "seconds": time.monotonic() - t0}


def test_killed_trainer_fails_the_others_naming_the_rank(cluster2, cluster_run):
    # The process-group timeout (60 s) and the daemons' collective timeout (60 s) are far
    # above what the test allows, so only the failure path can end these waits in time.
    survivors = [r for r in range(4) if r != VICTIM]
    res = cluster_run(cluster2, killed_trainer_worker, INTERLEAVED, cluster2.sockets,
                      expect=survivors,
                      pg_timeout=60, timeout=120)
    for r in survivors:
        err = res[r]["error"]
        assert err is not None, f"rank {r}: the all-reduce succeeded without rank {VICTIM}"
        assert f"rank {VICTIM} left the job" in err, f"rank {r}: {err}"
        assert res[r]["seconds"] < 20, f"rank {r} took {res[r]['seconds']:.1f} s: {err}"
    assert cluster2.alive()  # the daemons survive a trainer's death
