"""hsdp.Client collectives across nodes, against numpy: a cluster of real daemons.

Each rank is its own process with its own session on its node's daemon
(HSDPD_SOCKET), global rank and world size. Inputs are a pure function of
(case, rank), so the parent computes every expected result independently with
numpy. 16-bit floats use multiples of 1/8 (exact in bf16/fp16, exact float32
sums), so their results must match bit for bit; float32 uses random normals
(tolerance: the hierarchical path sums in another order than numpy).
"""
import uuid

import numpy as np
import pytest
import torch

N = 4099       # odd: uneven per-node and per-rank splits
CHUNK = 1027   # reduce-scatter elements per rank

REDUCE_CASES = [  # (name, dtype, op, reduce_dtype, pre, post)
    ("f32-sum", "float32", "sum", None, 1.0, 1.0),
    ("f32-avg", "float32", "avg", None, 1.0, 1.0),
    ("f32-max", "float32", "max", None, 1.0, 1.0),
    ("f32-product", "float32", "product", None, 1.0, 1.0),
    ("f32-sum-prepost", "float32", "sum", None, 2.0, 2.0),
    ("f64-min", "float64", "min", None, 1.0, 1.0),
    ("bf16-sum-f32", "bfloat16", "sum", "float32", 1.0, 1.0),
    ("bf16-avg-f32", "bfloat16", "avg", "float32", 1.0, 1.0),
    ("f16-sum-f32", "float16", "sum", "float32", 1.0, 1.0),
    ("f16-max", "float16", "max", None, 1.0, 1.0),
    ("i32-sum", "int32", "sum", None, 1.0, 1.0),
    ("i64-min", "int64", "min", None, 1.0, 1.0),
    ("i64-product", "int64", "product", None, 1.0, 1.0),
    ("u8-max", "uint8", "max", None, 1.0, 1.0),
    ("u8-sum", "uint8", "sum", None, 1.0, 1.0),
]
RS_CASES = [c for c in REDUCE_CASES if c[0] in
            ("f32-sum", "f32-avg", "f32-sum-prepost", "bf16-avg-f32", "f16-sum-f32", "i32-sum",
             "i64-min", "u8-max")]
MOVE_DTYPES = ["float32", "bfloat16", "int64", "uint8", "float64"]


def _seed(name, rank):
    return (sum(map(ord, name)) * 7919 + rank * 104729) % (2**31)


def make_input(name, dtype, rank, n):
    """Rank `rank`'s input of case `name`: a float64 numpy array of values exact in dtype."""
    rs = np.random.RandomState(_seed(name, rank))
    if dtype in ("float32", "float64"):
        return rs.standard_normal(n).astype(dtype).astype(np.float64)
    if dtype in ("bfloat16", "float16"):
        return rs.randint(-64, 65, n) / 8.0
    if "product" in name:
        return rs.randint(-3, 4, n).astype(np.float64)
    if dtype == "uint8":
        return rs.randint(0, 60, n).astype(np.float64)
    return rs.randint(-1000, 1000, n).astype(np.float64)


def _tensor(values, dtype):
    return torch.from_numpy(np.asarray(values, dtype=np.float64)).to(getattr(torch, dtype))


def _reduce(name, dtype, op, reduce_dtype, pre, post, world, n):
    """The expected reduction over `world` ranks, rounded to dtype, as float64."""
    xs = [make_input(name, dtype, r, n) for r in range(world)]
    if dtype.startswith("int") or dtype == "uint8":
        acc = {"sum": np.sum, "min": np.min, "max": np.max, "product": np.prod}[op](
            np.stack(xs).astype(np.int64), axis=0)
        return acc.astype(dtype).astype(np.float64)
    compute = np.float64 if dtype == "float64" else np.float32
    ys = [(x / pre).astype(compute) for x in xs]
    acc = ys[0]
    for y in ys[1:]:
        acc = {"sum": np.add, "avg": np.add, "min": np.minimum, "max": np.maximum,
               "product": np.multiply}[op](acc, y).astype(compute)
    acc = acc / post
    if op == "avg":
        acc = acc / world
    return _tensor(acc, dtype).double().numpy()


def _out(t):
    return t.double().numpy().copy() if isinstance(t, torch.Tensor) else t.astype(np.float64)


def client_worker(rank, world, job, placement):
    import hsdp
    out = {}
    with hsdp.Client(job_id=job, rank=rank, world_size=world, connect_timeout=30) as c:
        out["socket"] = c.socket_path
        for name, dtype, op, rdt, pre, post in REDUCE_CASES:
            # Half the cases in hsdpd memory (zero-copy), half staged from ordinary memory.
            x = _tensor(make_input(name, dtype, rank, N), dtype)
            if len(name) % 2:
                shared = c.tensor((N,), x.dtype)
                shared.copy_(x)
                x = shared
            c.all_reduce(x, op=op, reduce_dtype=None if rdt is None else getattr(torch, rdt),
                         pre_divide=pre, post_divide=post)
            out[f"all_reduce/{name}"] = _out(x)
        for name, dtype, op, rdt, pre, post in RS_CASES:
            x = _tensor(make_input(name, dtype, rank, CHUNK * world), dtype)
            y = torch.zeros(CHUNK, dtype=x.dtype)
            c.reduce_scatter(y, x, op=op, pre_divide=pre, post_divide=post,
                             reduce_dtype=None if rdt is None else getattr(torch, rdt))
            out[f"reduce_scatter/{name}"] = _out(y)
        for dtype in MOVE_DTYPES:
            x = _tensor(make_input("gather" + dtype, dtype, rank, 333), dtype)
            y = c.tensor((333 * world,), x.dtype)
            c.all_gather(y, x)
            out[f"all_gather/{dtype}"] = _out(y)
            b = _tensor(make_input("bcast" + dtype, dtype, rank, 777), dtype)
            c.broadcast(b, root=world - 1)
            out[f"broadcast/{dtype}"] = _out(b)
        # all-to-all: equal blocks, then uneven splits.
        blocks = np.concatenate([np.full(5, 100 * rank + j) for j in range(world)])
        a2a = np.zeros(5 * world, dtype=np.int32)
        c.all_to_all(a2a, blocks.astype(np.int32))
        out["all_to_all/equal"] = _out(a2a)
        sends = [(rank + j) % 3 + 1 for j in range(world)]
        recvs = [(i + rank) % 3 + 1 for i in range(world)]
        xs = np.concatenate([1000.0 * rank + 10 * j + np.arange(k) for j, k in enumerate(sends)])
        ys = np.zeros(sum(recvs), dtype=np.float32)
        c.all_to_all(ys, xs.astype(np.float32), out_splits=recvs, in_splits=sends)
        out["all_to_all/uneven"] = _out(ys)
        # Point-to-point around a ring (every hop of the interleaved placements crosses or
        # stays on a node), two tags received in the other order.
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = np.zeros(9, dtype=np.float64)
        got2 = torch.zeros(4, dtype=torch.bfloat16)
        ws = [c.send(np.arange(9, dtype=np.float64) + rank, nxt, tag=5, async_op=True),
              c.send(torch.full((4,), rank + 0.5, dtype=torch.bfloat16), nxt, tag=6,
                     async_op=True)]
        wr = [c.recv(got2, prv, tag=6, async_op=True), c.recv(got, prv, tag=5, async_op=True)]
        for w in ws + wr:
            w.wait(timeout=60)
        out["p2p/f64"], out["p2p/bf16"] = _out(got), _out(got2)
        # Subgroups: one spanning nodes, one inside rank 1's node.
        span = [1, world - 1]
        local = [r for r in range(world) if placement[r] == placement[1]]
        for key, ranks in (("span", span), ("local", local)):
            if rank in ranks:
                g = c.new_group(ranks)
                v = np.full(3, float(rank + 1), dtype=np.float32)
                c.all_reduce(v, group=g)
                out[f"group/{key}"] = (g.rank, g.size, list(g.ranks), _out(v))
        # The HSDP composite (one submission): shard group = pairs of consecutive ranks,
        # replicate group = ranks with the same shard index.
        if world % 2 == 0:
            shard = c.new_group([rank - rank % 2, rank - rank % 2 + 1])
            replicate = c.new_group(list(range(rank % 2, world, 2)))
            for name, dtype, op, rdt in (("hsdp-f32", "float32", "sum", None),
                                         ("hsdp-bf16", "bfloat16", "avg", "float32")):
                x = _tensor(make_input(name, dtype, rank, 2 * CHUNK), dtype)
                y = c.tensor((CHUNK,), x.dtype)
                w = c.reduce_scatter_all_reduce(
                    y, x, shard, replicate, op=op, async_op=True,
                    reduce_dtype=None if rdt is None else getattr(torch, rdt))
                w.wait(timeout=60)
                out[f"composite/{name}"] = _out(y)
        c.barrier()
    return out


def _check(got, want, dtype, what):
    if dtype == "float32":
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("nodes,placement", [
    (2, [0, 1, 1, 0]),  # 2 nodes x 2 ranks, not contiguous per node
    (3, [2, 0, 1]),     # 3 nodes x 1 rank, rank order differs from node order
], ids=["2x2-0110", "3x1-201"])
def test_client_collectives_across_nodes(request, cluster_run, nodes, placement):
    cluster = request.getfixturevalue(f"cluster{nodes}")
    world = len(placement)
    job = f"client-{uuid.uuid4().hex[:10]}"
    res = cluster_run(cluster, client_worker, placement, job, placement, backend=None)
    for r in range(world):
        assert res[r]["socket"] == cluster.sockets[placement[r]]
        for name, dtype, op, rdt, pre, post in REDUCE_CASES:
            want = _reduce(name, dtype, op, rdt, pre, post, world, N)
            _check(res[r][f"all_reduce/{name}"], want, dtype, f"rank {r} all_reduce {name}")
        for name, dtype, op, rdt, pre, post in RS_CASES:
            want = _reduce(name, dtype, op, rdt, pre, post, world, CHUNK * world)
            _check(res[r][f"reduce_scatter/{name}"], want[r * CHUNK:(r + 1) * CHUNK], dtype,
                   f"rank {r} reduce_scatter {name}")
        for dtype in MOVE_DTYPES:
            gathered = np.concatenate([make_input("gather" + dtype, dtype, i, 333)
                                       for i in range(world)])
            np.testing.assert_array_equal(res[r][f"all_gather/{dtype}"], gathered)
            np.testing.assert_array_equal(res[r][f"broadcast/{dtype}"],
                                          make_input("bcast" + dtype, dtype, world - 1, 777))
        np.testing.assert_array_equal(
            res[r]["all_to_all/equal"],
            np.concatenate([np.full(5, 100 * i + r) for i in range(world)]))
        np.testing.assert_array_equal(
            res[r]["all_to_all/uneven"],
            np.concatenate([1000.0 * i + 10 * r + np.arange((i + r) % 3 + 1)
                            for i in range(world)]))
        prv = (r - 1) % world
        np.testing.assert_array_equal(res[r]["p2p/f64"], np.arange(9) + prv)
        np.testing.assert_array_equal(res[r]["p2p/bf16"], np.full(4, prv + 0.5))
        span = [1, world - 1]
        local = [i for i in range(world) if placement[i] == placement[1]]
        for key, ranks in (("span", span), ("local", local)):
            if r in ranks:
                g_rank, g_size, g_ranks, v = res[r][f"group/{key}"]
                assert (g_rank, g_size, g_ranks) == (ranks.index(r), len(ranks), ranks)
                np.testing.assert_array_equal(v, np.full(3, float(sum(i + 1 for i in ranks))))
            else:
                assert f"group/{key}" not in res[r]
        if world % 2 == 0:
            for name, dtype, op, rdt in (("hsdp-f32", "float32", "sum", None),
                                         ("hsdp-bf16", "bfloat16", "avg", "float32")):
                want = _reduce(name, dtype, op, rdt, 1.0, 1.0, world, 2 * CHUNK)
                idx = r % 2  # this rank's index in its shard group
                _check(res[r][f"composite/{name}"], want[idx * CHUNK:(idx + 1) * CHUNK],
                       dtype, f"rank {r} composite {name}")


def test_attach_conflicts_across_nodes_are_clear_errors(cluster2):
    """The world size and each rank's node are agreed cluster-wide at Attach."""
    import hsdp
    job = f"attach-{uuid.uuid4().hex[:10]}"
    s0, s1 = cluster2.sockets
    with hsdp.Client(socket_path=s0, job_id=job, rank=0, world_size=2) as a:
        with pytest.raises(hsdp.InvalidArgument, match="has world size 2 on another node"):
            hsdp.Client(socket_path=s1, job_id=job, rank=1, world_size=3)
        with pytest.raises(hsdp.AlreadyExists, match="rank 0 of job .* already attached on node 0"):
            hsdp.Client(socket_path=s1, job_id=job, rank=0, world_size=2)
        # Neither refusal left anything behind: the right trainer attaches and runs.
        with hsdp.Client(socket_path=s1, job_id=job, rank=1, world_size=2) as b:
            x, y = np.full(3, 1.5, np.float32), np.full(3, 2.0, np.float32)
            wa = a.all_reduce(x, async_op=True)
            wb = b.all_reduce(y, async_op=True)
            wa.wait(timeout=60)
            wb.wait(timeout=60)
            np.testing.assert_array_equal(x, [3.5] * 3)
            np.testing.assert_array_equal(y, [3.5] * 3)
