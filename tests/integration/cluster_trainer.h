// Helpers for tests whose trainers are forked processes attached to the
// daemons of a test cluster: one trainer's client and buffers, each
// collective run and checked against the independent reference of
// collective_check.h (failures are written to the trainer's output, never
// thrown), and file-based go-signals and steps between processes.
#ifndef HSDP_TESTS_INTEGRATION_CLUSTER_TRAINER_H_
#define HSDP_TESTS_INTEGRATION_CLUSTER_TRAINER_H_

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_util.h"
#include "collective_check.h"
#include "hsdp/client.h"
#include "test_util.h"

namespace hsdp::testing {

using bench::LoadAs;
using bench::StoreAs;

inline constexpr size_t kBufBytes = 1 << 20;
inline constexpr int kFormMs = 10000;
inline constexpr int kChildMs = 25000;

// One trainer inside its child process.
struct Trainer {
  std::unique_ptr<Client> client;
  Buffer send, recv;
  FILE* out = nullptr;
  int rank = 0;
  int world = 0;
  int failures = 0;
  std::string sync_dir;  // where Sync() leaves its marks

  void Fail(const std::string& what) {
    if (++failures <= 20) std::fprintf(out, "rank %d FAIL: %s\n", rank, what.c_str());
  }
  void* At(const Buffer& b, uint64_t offset = 0) const {
    return static_cast<char*>(b.data) + offset;
  }
};

// `reconnect`: ClientOptions::reconnect (off: a trainer whose daemon goes
// away fails at once instead of waiting for it to come back).
inline bool Attach(Trainer* T, const std::string& socket, const std::string& job, int rank,
                   int world, bool reconnect = true) {
  ClientOptions o;
  o.reconnect = reconnect;
  o.socket_path = socket;
  o.job_id = job;
  o.rank = rank;
  o.world_size = world;
  T->rank = rank;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    T->Fail("connect: " + c.status().ToString());
    return false;
  }
  T->client = std::move(*c);
  auto s = T->client->AllocateBuffer(kBufBytes, "send");
  auto r = T->client->AllocateBuffer(kBufBytes, "recv");
  if (!s.ok() || !r.ok()) {
    T->Fail("allocate");
    return false;
  }
  T->send = *s;
  T->recv = *r;
  return true;
}

inline bool MakeGroup(Trainer* T, const std::vector<int>& ranks, Group* g) {
  absl::StatusOr<Group> r = T->client->NewGroup(ranks);
  if (!r.ok()) {
    T->Fail("new group: " + r.status().ToString());
    return false;
  }
  *g = *r;
  return true;
}

inline bool Await(Trainer* T, absl::StatusOr<Work> w, const std::string& name) {
  if (!w.ok()) {
    T->Fail(name + ": submit: " + w.status().ToString());
    return false;
  }
  absl::Status s = w->Wait(absl::Seconds(20));
  if (!s.ok()) {
    T->Fail(name + ": " + s.ToString());
    return false;
  }
  return true;
}

template <typename Want>
inline void Check(Trainer* T, const std::string& name, DataType t, const ReduceOptions& o,
           const void* out, uint64_t count, Want want) {
  for (uint64_t i = 0; i < count; ++i) {
    const double w = want(i);
    const double g = LoadAs(t, out, i);
    if (!(std::fabs(g - w) <= Tolerance(t, o, w))) {
      T->Fail(name + ": [" + std::to_string(i) + "] got " + std::to_string(g) + ", want " +
              std::to_string(w));
      return;
    }
  }
}

inline void Fill(Trainer* T, DataType t, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) StoreAs(t, T->At(T->send), i, Input(t, T->rank, i));
}

inline void AllReduceCase(Trainer* T, const Group& g, DataType t, const ReduceOptions& o,
                          uint64_t n) {
  const std::string name = "all_reduce " + std::string(DataTypeName(t)) + " " +
                           std::string(ReduceOpName(o.op)) + " n=" + std::to_string(n);
  Fill(T, t, n);
  if (!Await(T, T->client->AllReduce(g, {T->send.id, 0}, {T->recv.id, 0}, n, t, o), name)) return;
  Check(T, name, t, o, T->At(T->recv), n, [&](uint64_t i) { return Reference(t, o, g.ranks, i); });
}

inline void ReduceScatterCase(Trainer* T, const Group& g, DataType t, const ReduceOptions& o,
                       uint64_t n) {
  const std::string name =
      "reduce_scatter " + std::string(DataTypeName(t)) + " n=" + std::to_string(n);
  Fill(T, t, n * g.size);
  if (!Await(T, T->client->ReduceScatter(g, {T->send.id, 0}, {T->recv.id, 0}, n, t, o), name)) {
    return;
  }
  Check(T, name, t, o, T->At(T->recv), n,
        [&](uint64_t i) { return Reference(t, o, g.ranks, g.rank * n + i); });
}

inline void AllGatherCase(Trainer* T, const Group& g, DataType t, uint64_t n) {
  const std::string name = "all_gather " + std::string(DataTypeName(t)) + " n=" + std::to_string(n);
  Fill(T, t, n);
  if (!Await(T, T->client->AllGather(g, {T->send.id, 0}, {T->recv.id, 0}, n, t), name)) return;
  Check(T, name, t, {}, T->At(T->recv), n * g.size,
        [&](uint64_t i) { return Input(t, g.ranks[i / n], i % n); });
}

inline void BroadcastCase(Trainer* T, const Group& g, DataType t, int root, uint64_t n) {
  const std::string name = "broadcast root " + std::to_string(root);
  Fill(T, t, n);
  if (!Await(T, T->client->Broadcast(g, {T->send.id, 0}, {T->recv.id, 0}, n, t, root), name)) {
    return;
  }
  Check(T, name, t, {}, T->At(T->recv), n, [&](uint64_t i) { return Input(t, g.ranks[root], i); });
}

inline void AllToAllCase(Trainer* T, const Group& g, DataType t, uint64_t n) {
  const std::string name = "all_to_all n=" + std::to_string(n);
  Fill(T, t, n * g.size);
  if (!Await(T, T->client->AllToAll(g, {T->send.id, 0}, {T->recv.id, 0}, n, t), name)) return;
  // Block j of the output is block `g.rank` of rank j's input.
  Check(T, name, t, {}, T->At(T->recv), n * g.size,
        [&](uint64_t i) { return Input(t, g.ranks[i / n], g.rank * n + i % n); });
}

// Reduce-scatter in `shard`, all-reduce across `replicate`: each rank gets
// the sum over the whole mesh (`mesh` ranks) of its shard position's block.
inline void CompositeCase(Trainer* T, const Group& shard, const Group& replicate,
                   const std::vector<int>& mesh, DataType t, const ReduceOptions& o, uint64_t n,
                   const std::string& label) {
  const std::string name = "composite " + label + " " + std::string(ReduceOpName(o.op));
  Fill(T, t, n * shard.size);
  if (!Await(T, T->client->ReduceScatterAllReduce(shard, replicate, {T->send.id, 0},
                                                  {T->recv.id, 0}, n, t, o),
             name)) {
    return;
  }
  Check(T, name, t, o, T->At(T->recv), n,
        [&](uint64_t i) { return Reference(t, o, mesh, shard.rank * n + i); });
}

// Every collective on `all` (at least 3 ranks), each dtype class and reduce
// option, a barrier (no dtype, as every client sends it), each checked.
inline void EveryCollectiveCase(Trainer* T, const Group& all) {
  for (uint64_t n : {uint64_t{1}, uint64_t{1000}, uint64_t{70000}}) {
    AllReduceCase(T, all, DataType::kFloat32, {}, n);
  }
  AllReduceCase(T, all, DataType::kFloat32,
                ReduceOptions{ReduceOp::kAvg, 1.0, 2.0, 1.0, DataType::kBFloat16}, 4096);
  AllReduceCase(T, all, DataType::kInt32, ReduceOptions{ReduceOp::kMax}, 777);
  AllReduceCase(T, all, DataType::kFloat64, ReduceOptions{ReduceOp::kPremulSum, 0.25}, 300);
  ReduceScatterCase(T, all, DataType::kFloat32, {}, 1500);
  ReduceScatterCase(T, all, DataType::kBFloat16, ReduceOptions{ReduceOp::kAvg}, 256);
  AllGatherCase(T, all, DataType::kFloat32, 2000);
  AllGatherCase(T, all, DataType::kUInt8, 333);
  BroadcastCase(T, all, DataType::kFloat32, /*root=*/2, 5000);
  AllToAllCase(T, all, DataType::kFloat32, 640);
  Await(T, T->client->Barrier(all), "barrier");
}

// Gradient accumulation over `micro` micro-batches in an HSDP mesh: each
// micro-batch is only reduce-scattered in `shard` (its inputs start at
// element m * stride, so every micro-batch differs) and added to a local
// float32 accumulator; the accumulated shard is all-reduced in `replicate`
// once at the end. Each rank gets, for its shard position, the sum over the
// micro-batches of the sum over the whole mesh.
inline void AccumulationCase(Trainer* T, const Group& shard, const Group& replicate,
                             const std::vector<int>& mesh, int micro, uint64_t n,
                             const std::string& label) {
  const DataType t = DataType::kFloat32;
  const std::string name = "accumulation " + label;
  const uint64_t stride = n * shard.size;
  std::vector<double> acc(n, 0.0);
  for (int m = 0; m < micro; ++m) {
    for (uint64_t i = 0; i < stride; ++i) {
      StoreAs(t, T->At(T->send), i, Input(t, T->rank, m * stride + i));
    }
    if (!Await(T, T->client->ReduceScatter(shard, {T->send.id, 0}, {T->recv.id, 0}, n, t),
               name + " reduce-scatter " + std::to_string(m))) {
      return;
    }
    for (uint64_t i = 0; i < n; ++i) acc[i] += LoadAs(t, T->At(T->recv), i);
  }
  for (uint64_t i = 0; i < n; ++i) StoreAs(t, T->At(T->send), i, acc[i]);
  if (!Await(T, T->client->AllReduce(replicate, {T->send.id, 0}, {T->recv.id, 0}, n, t),
             name + " all-reduce")) {
    return;
  }
  Check(T, name, t, {}, T->At(T->recv), n, [&](uint64_t i) {
    double want = 0;
    for (int m = 0; m < micro; ++m) {
      want += Reference(t, ReduceOptions{}, mesh, m * stride + shard.rank * n + i);
    }
    return want;
  });
}

// Rank `src` sends to `dst` (group ranks of `g`) with `tag`; called by both.
inline void SendRecvCase(Trainer* T, const Group& g, int src, int dst, int tag, uint64_t n) {
  const DataType t = DataType::kFloat32;
  const std::string name = "send/recv " + std::to_string(g.ranks[src]) + "->" +
                           std::to_string(g.ranks[dst]) + " tag " + std::to_string(tag);
  if (g.rank == src) {
    Fill(T, t, n);
    Await(T, T->client->Send(g, {T->send.id, 0}, n, t, dst, tag), name);
  } else if (g.rank == dst) {
    if (!Await(T, T->client->Recv(g, {T->recv.id, 0}, n, t, src, tag), name)) return;
    Check(T, name, t, {}, T->At(T->recv), n,
          [&](uint64_t i) { return Input(t, g.ranks[src], i); });
  }
}

// Waits up to `ms` for `path` to exist (a go-signal from the parent).
inline bool WaitFile(const std::string& path, int ms) {
  return Eventually([&] { return Exists(path); }, ms);
}

// Every rank of the job reaches step `name` before any goes on (marks in
// files), so the steps of a test do not overlap between nodes.
inline void Sync(Trainer* T, const std::string& name) {
  WriteFile(T->sync_dir + "/" + name + "." + std::to_string(T->rank), "");
  for (int r = 0; r < T->world; ++r) {
    if (!WaitFile(T->sync_dir + "/" + name + "." + std::to_string(r), kChildMs)) {
      T->Fail("sync " + name + ": rank " + std::to_string(r) + " never came");
    }
  }
}

inline int Report(Trainer* T) {
  std::fprintf(T->out, "rank %d done, %d failures\n", T->rank, T->failures);
  return T->failures == 0 ? 0 : 1;
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_CLUSTER_TRAINER_H_
