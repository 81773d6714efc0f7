// Multi-process collectives through a real hsdpd: N = 2, 3, 4 forked client
// processes run every collective (in-place and out-of-place, several dtypes
// and reduce ops incl. avg / premul_sum / divide factors / bf16 reduce
// dtype) checked against an independent reference; the HSDP composite on a
// 2x2 mesh; mismatched arguments; a member that never submits; a client
// killed mid-operation.
#include <signal.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "bench_util.h"
#include "collective_check.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "test_util.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using bench::LoadAs;
using bench::StoreAs;
using testing::Child;
using testing::DaemonProcess;
using testing::Input;
using testing::NowMs;
using testing::Reference;
using testing::TempDir;
using testing::Tolerance;

constexpr size_t kBufBytes = 1 << 20;

// One rank's state inside a child process.
struct Rank {
  std::unique_ptr<Client> client;
  Buffer send, recv;
  FILE* out = nullptr;
  int rank = 0;
  int failures = 0;

  void Fail(const std::string& what) {
    if (++failures <= 20) std::fprintf(out, "rank %d FAIL: %s\n", rank, what.c_str());
  }
};

bool AttachRank(Rank* R, const std::string& socket, const std::string& job, int rank, int world) {
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = job;
  o.rank = rank;
  o.world_size = world;
  R->rank = rank;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    R->Fail("connect: " + c.status().ToString());
    return false;
  }
  R->client = std::move(*c);
  auto s = R->client->AllocateBuffer(kBufBytes, "send");
  auto r = R->client->AllocateBuffer(kBufBytes, "recv");
  if (!s.ok() || !r.ok()) {
    R->Fail("allocate");
    return false;
  }
  R->send = *s;
  R->recv = *r;
  return true;
}

void* Ptr(const Rank& R, BufferRef ref) {
  const Buffer& b = ref.buffer_id == R.send.id ? R.send : R.recv;
  return static_cast<char*>(b.data) + ref.offset_bytes;
}

std::string Name(const char* coll, DataType t, const ReduceOptions& o, bool in_place,
                 uint64_t count) {
  return std::string(coll) + " " + std::string(DataTypeName(t)) + " " +
         std::string(ReduceOpName(o.op)) + (in_place ? " in-place" : "") + " count " +
         std::to_string(count) + " pre " + std::to_string(o.pre_divide) + " post " +
         std::to_string(o.post_divide) +
         (o.reduce_dtype != DataType::kInvalid ? " wire " + std::string(DataTypeName(o.reduce_dtype)) : "");
}

bool Await(Rank* R, absl::StatusOr<Work> w, const std::string& name) {
  if (!w.ok()) {
    R->Fail(name + ": submit: " + w.status().ToString());
    return false;
  }
  absl::Status s = w->Wait(absl::Seconds(60));
  if (!s.ok()) {
    R->Fail(name + ": " + s.ToString());
    return false;
  }
  return true;
}

// Compares `count` outputs at `out` with `want(i)`.
template <typename Want>
void Check(Rank* R, const std::string& name, DataType t, const ReduceOptions& o, const void* out,
           uint64_t count, Want want) {
  for (uint64_t i = 0; i < count; ++i) {
    const double w = want(i);
    const double g = LoadAs(t, out, i);
    if (!(std::fabs(g - w) <= Tolerance(t, o, w))) {
      R->Fail(name + ": [" + std::to_string(i) + "] got " + std::to_string(g) + ", want " +
              std::to_string(w));
      return;
    }
  }
}

void AllReduceCase(Rank* R, const Group& g, DataType t, const ReduceOptions& o, bool in_place,
                   uint64_t count) {
  const std::string name = Name("all_reduce", t, o, in_place, count);
  BufferRef send{R->send.id, 0}, recv{in_place ? R->send.id : R->recv.id, 0};
  for (uint64_t i = 0; i < count; ++i) StoreAs(t, Ptr(*R, send), i, Input(t, R->rank, i));
  if (!Await(R, R->client->AllReduce(g, send, recv, count, t, o), name)) return;
  Check(R, name, t, o, Ptr(*R, recv), count,
        [&](uint64_t i) { return Reference(t, o, g.ranks, i); });
}

void ReduceScatterCase(Rank* R, const Group& g, DataType t, const ReduceOptions& o, bool in_place,
                       uint64_t count) {
  const std::string name = Name("reduce_scatter", t, o, in_place, count);
  const size_t es = DataTypeSize(t);
  BufferRef send{R->send.id, 0};
  BufferRef recv = in_place ? BufferRef{R->send.id, g.rank * count * es} : BufferRef{R->recv.id, 0};
  for (uint64_t i = 0; i < count * g.size; ++i) StoreAs(t, Ptr(*R, send), i, Input(t, R->rank, i));
  if (!Await(R, R->client->ReduceScatter(g, send, recv, count, t, o), name)) return;
  Check(R, name, t, o, Ptr(*R, recv), count,
        [&](uint64_t i) { return Reference(t, o, g.ranks, g.rank * count + i); });
}

void AllGatherCase(Rank* R, const Group& g, DataType t, bool in_place, uint64_t count) {
  const std::string name = Name("all_gather", t, {}, in_place, count);
  const size_t es = DataTypeSize(t);
  BufferRef recv{R->recv.id, 0};
  BufferRef send = in_place ? BufferRef{R->recv.id, g.rank * count * es} : BufferRef{R->send.id, 0};
  for (uint64_t i = 0; i < count; ++i) StoreAs(t, Ptr(*R, send), i, Input(t, R->rank, i));
  if (!Await(R, R->client->AllGather(g, send, recv, count, t), name)) return;
  Check(R, name, t, {}, Ptr(*R, recv), count * g.size,
        [&](uint64_t i) { return Input(t, g.ranks[i / count], i % count); });
}

void BroadcastCase(Rank* R, const Group& g, DataType t, bool in_place, uint64_t count, int root) {
  const std::string name = Name("broadcast", t, {}, in_place, count) + " root " + std::to_string(root);
  BufferRef send{R->send.id, 0}, recv{in_place ? R->send.id : R->recv.id, 0};
  for (uint64_t i = 0; i < count; ++i) StoreAs(t, Ptr(*R, send), i, Input(t, R->rank, i));
  if (!Await(R, R->client->Broadcast(g, send, recv, count, t, root), name)) return;
  Check(R, name, t, {}, Ptr(*R, recv), count,
        [&](uint64_t i) { return Input(t, g.ranks[root], i); });
}

ReduceOptions Opt(ReduceOp op, double pre = 1, double post = 1, double premul = 1,
                  DataType wire = DataType::kInvalid) {
  ReduceOptions o;
  o.op = op;
  o.pre_divide = pre;
  o.post_divide = post;
  o.premul_factor = premul;
  o.reduce_dtype = wire;
  return o;
}

// Every rank runs exactly the same sequence.
int RunSuite(const std::string& socket, const std::string& job, int rank, int world, FILE* out) {
  Rank R;
  R.out = out;
  if (!AttachRank(&R, socket, job, rank, world)) return 1;
  std::vector<int> all(world);
  std::iota(all.begin(), all.end(), 0);
  auto g = R.client->NewGroup(all);
  if (!g.ok()) {
    R.Fail("NewGroup: " + g.status().ToString());
    return 1;
  }
  const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                            DataType::kUInt8};
  int ops = 0;
  for (DataType t : types) {
    std::vector<ReduceOp> rops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                  ReduceOp::kProduct};
    if (IsFloatingPoint(t)) rops.push_back(ReduceOp::kPremulSum);
    for (ReduceOp op : rops) {
      for (bool ip : {false, true}) {
        AllReduceCase(&R, *g, t, Opt(op, 1, 1, 0.25), ip, 37);
        ReduceScatterCase(&R, *g, t, Opt(op, 1, 1, 0.25), ip, 19);
        ops += 2;
      }
    }
    for (bool ip : {false, true}) {
      AllGatherCase(&R, *g, t, ip, 23);
      BroadcastCase(&R, *g, t, ip, 29, (ops++) % world);
    }
  }
  // Divide factors and a bf16 reduce dtype.
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat64}) {
    for (bool ip : {false, true}) {
      AllReduceCase(&R, *g, t, Opt(ReduceOp::kSum, 2, 4), ip, 41);
      AllReduceCase(&R, *g, t, Opt(ReduceOp::kPremulSum, 2, 1, 0.5), ip, 41);
      AllReduceCase(&R, *g, t, Opt(ReduceOp::kAvg, 1, 3, 1, DataType::kBFloat16), ip, 41);
      ReduceScatterCase(&R, *g, t, Opt(ReduceOp::kAvg, 2, 3, 1, DataType::kBFloat16), ip, 17);
    }
  }
  // Large enough for the engine's queue and thread pool.
  AllReduceCase(&R, *g, DataType::kFloat32, Opt(ReduceOp::kSum), false, 40001);
  ReduceScatterCase(&R, *g, DataType::kBFloat16, Opt(ReduceOp::kAvg), true, 30001);
  AllGatherCase(&R, *g, DataType::kFloat32, true, 20001);
  for (int root = 0; root < world; ++root) BroadcastCase(&R, *g, DataType::kInt32, false, 9, root);
  if (!Await(&R, R.client->Barrier(*g), "barrier")) return 1;
  std::fprintf(out, "rank %d done, failures %d\n", rank, R.failures);
  return R.failures == 0 ? 0 : 2;
}

// Forks `world` ranks running `body` and expects each to exit 0.
void RunRanks(int world, const std::function<int(int rank, FILE* out)>& body, int timeout_ms) {
  std::vector<std::unique_ptr<Child>> kids;
  for (int r = 0; r < world; ++r) {
    kids.push_back(std::make_unique<Child>([&body, r](FILE* out) { return body(r, out); }));
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(kids[r]->Finish(timeout_ms), 0) << "rank " << r << ":\n" << kids[r]->output();
  }
}

class CollectivesTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesTest, EveryCollectiveMatchesTheReference) {
  const int world = GetParam();
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  RunRanks(world, [&](int r, FILE* out) { return RunSuite(d.socket(), "suite", r, world, out); },
           120000);
  EXPECT_EQ(d.Stop(), 0);
}

INSTANTIATE_TEST_SUITE_P(Processes, CollectivesTest, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "n" + std::to_string(info.param); });

TEST(MultiProcessTest, ReduceScatterAllReduceOn2x2Mesh) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  RunRanks(4, [&](int rank, FILE* out) -> int {
    Rank R;
    R.out = out;
    if (!AttachRank(&R, d.socket(), "mesh", rank, 4)) return 1;
    const int replica = rank / 2, shard_rank = rank % 2;
    auto shard = R.client->NewGroup({replica * 2, replica * 2 + 1});      // {0,1} / {2,3}
    auto replicate = R.client->NewGroup({shard_rank, shard_rank + 2});    // {0,2} / {1,3}
    if (!shard.ok() || !replicate.ok()) {
      R.Fail("NewGroup");
      return 1;
    }
    const int all[] = {0, 1, 2, 3};
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat64}) {
      for (const ReduceOptions& o :
           {Opt(ReduceOp::kSum), Opt(ReduceOp::kAvg), Opt(ReduceOp::kAvg, 2, 3),
            Opt(ReduceOp::kPremulSum, 1, 2, 0.5), Opt(ReduceOp::kMax),
            Opt(ReduceOp::kSum, 1, 1, 1, DataType::kBFloat16)}) {
        for (bool ip : {false, true}) {
          for (uint64_t count : {uint64_t{13}, uint64_t{20001}}) {
            const size_t es = DataTypeSize(t);
            const std::string name = Name("rs+ar", t, o, ip, count);
            BufferRef send{R.send.id, 0};
            BufferRef recv = ip ? BufferRef{R.send.id, shard->rank * count * es}
                                : BufferRef{R.recv.id, 0};
            for (uint64_t i = 0; i < count * 2; ++i) StoreAs(t, Ptr(R, send), i, Input(t, rank, i));
            if (!Await(&R, R.client->ReduceScatterAllReduce(*shard, *replicate, send, recv, count, t, o),
                       name)) {
              continue;
            }
            Check(&R, name, t, o, Ptr(R, recv), count,
                  [&](uint64_t i) { return Reference(t, o, all, shard->rank * count + i); });
          }
        }
      }
    }
    // The replicate and shard groups still work on their own afterwards.
    AllReduceCase(&R, *replicate, DataType::kFloat32, Opt(ReduceOp::kSum), false, 11);
    AllGatherCase(&R, *shard, DataType::kFloat32, false, 11);
    std::fprintf(out, "rank %d done, failures %d\n", rank, R.failures);
    return R.failures == 0 ? 0 : 2;
  }, 120000);
  EXPECT_EQ(d.Stop(), 0);
}

TEST(MultiProcessTest, MismatchedArgumentsFailEveryRankNamingRanksAndField) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  std::vector<std::unique_ptr<Child>> kids;
  for (int rank = 0; rank < 2; ++rank) {
    kids.push_back(std::make_unique<Child>([&, rank](FILE* out) -> int {
      Rank R;
      R.out = out;
      if (!AttachRank(&R, d.socket(), "mismatch", rank, 2)) return 1;
      auto g = R.client->NewGroup({0, 1});
      if (!g.ok()) return 1;
      BufferRef s{R.send.id, 0}, r{R.recv.id, 0};
      auto report = [&](const char* name, absl::StatusOr<Work> w) {
        absl::Status st = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
        std::fprintf(out, "case %s: %s\n", name, st.ToString().c_str());
      };
      report("count", R.client->AllReduce(*g, s, r, 8 + rank, DataType::kFloat32));
      report("dtype", R.client->AllGather(*g, s, r, 8,
                                          rank == 0 ? DataType::kFloat32 : DataType::kInt32));
      report("reduce_op", R.client->ReduceScatter(*g, s, r, 8, DataType::kFloat32,
                                                  Opt(rank == 0 ? ReduceOp::kSum : ReduceOp::kMax)));
      report("root", R.client->Broadcast(*g, s, r, 8, DataType::kFloat32, rank));
      report("collective", rank == 0 ? R.client->AllReduce(*g, s, r, 8, DataType::kFloat32)
                                     : R.client->AllGather(*g, s, r, 8, DataType::kFloat32));
      // Matching arguments work again afterwards.
      AllReduceCase(&R, *g, DataType::kFloat32, Opt(ReduceOp::kSum), false, 8);
      std::fprintf(out, "after: failures %d\n", R.failures);
      return 0;
    }));
  }
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(kids[rank]->Finish(60000), 0) << kids[rank]->output();
    const std::string& o = kids[rank]->output();
    for (const char* field : {"count", "dtype", "reduce_op", "root", "collective"}) {
      const size_t at = o.find(std::string("case ") + field + ":");
      ASSERT_NE(at, std::string::npos) << o;
      const std::string line = o.substr(at, o.find('\n', at) - at);
      EXPECT_THAT(line, AllOf(HasSubstr("INVALID_ARGUMENT"), HasSubstr("disagree"),
                              HasSubstr(std::string(field) + ": rank 0 has"), HasSubstr("rank 1 has")))
          << "rank " << rank;
    }
    EXPECT_THAT(o, HasSubstr("after: failures 0"));
  }
  EXPECT_EQ(d.Stop(), 0);
}

TEST(MultiProcessTest, MemberThatNeverSubmitsTimesOutNamingIt) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  collective_ms: 300\n")) << d.Log();
  std::vector<std::unique_ptr<Child>> kids;
  for (int rank = 0; rank < 3; ++rank) {
    kids.push_back(std::make_unique<Child>([&, rank](FILE* out) -> int {
      Rank R;
      R.out = out;
      if (!AttachRank(&R, d.socket(), "straggler", rank, 3)) return 1;
      auto g = R.client->NewGroup({0, 1, 2});
      if (!g.ok()) return 1;
      if (rank == 2) {
        std::fprintf(out, "joined\n");
        ::sleep(4);  // never submits
        return 0;
      }
      const int64_t t0 = NowMs();
      auto w = R.client->AllReduce(*g, {R.send.id, 0}, {R.recv.id, 0}, 16, DataType::kFloat32);
      absl::Status s = w.ok() ? w->Wait(absl::Seconds(20)) : w.status();
      std::fprintf(out, "result after %lld ms: %s\n", static_cast<long long>(NowMs() - t0),
                   s.ToString().c_str());
      return 0;
    }));
  }
  for (int rank = 0; rank < 2; ++rank) {
    const int64_t t0 = NowMs();
    ASSERT_EQ(kids[rank]->Finish(20000), 0) << kids[rank]->output();
    EXPECT_LT(NowMs() - t0, 3500) << "the timeout must fire well before the straggler exits";
    EXPECT_THAT(kids[rank]->output(),
                AllOf(HasSubstr("DEADLINE_EXCEEDED"), HasSubstr("rank(s) [2]"),
                      HasSubstr("arrived: [0, 1]"), HasSubstr("300 ms")));
  }
  EXPECT_EQ(kids[2]->Finish(20000), 0);
  EXPECT_EQ(d.Stop(), 0);
}

TEST(MultiProcessTest, ClientKilledMidOperationFailsPeersAndDaemonServesANewJob) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  std::vector<std::unique_ptr<Child>> kids;
  for (int rank = 0; rank < 3; ++rank) {
    kids.push_back(std::make_unique<Child>([&, rank](FILE* out) -> int {
      Rank R;
      R.out = out;
      if (!AttachRank(&R, d.socket(), "victim", rank, 3)) return 1;
      auto g = R.client->NewGroup({0, 1, 2});
      if (!g.ok()) return 1;
      // Large all-reduces back to back until something fails.
      const uint64_t count = kBufBytes / 4;
      for (int i = 0;; ++i) {
        auto w = R.client->AllReduce(*g, {R.send.id, 0}, {R.recv.id, 0}, count, DataType::kFloat32);
        absl::Status s = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
        if (i == 3) std::fprintf(out, "running\n");
        if (!s.ok()) {
          std::fprintf(out, "error after %d ops: %s\n", i, s.ToString().c_str());
          return 0;
        }
      }
    }));
  }
  for (auto& k : kids) ASSERT_TRUE(k->WaitFor("running", 30000)) << k->output();
  kids[1]->Kill(SIGKILL);
  EXPECT_EQ(kids[1]->Finish(5000), 128 + SIGKILL);
  for (int rank : {0, 2}) {
    ASSERT_EQ(kids[rank]->Finish(15000), 0) << kids[rank]->output();
    EXPECT_THAT(kids[rank]->output(), AllOf(HasSubstr("error after"), HasSubstr("rank 1")))
        << kids[rank]->output();
  }
  ASSERT_TRUE(d.Alive()) << d.Log();
  // A new job on the same daemon works.
  RunRanks(2, [&](int r, FILE* out) -> int {
    Rank R;
    R.out = out;
    if (!AttachRank(&R, d.socket(), "afterwards", r, 2)) return 1;
    auto g = R.client->NewGroup({0, 1});
    if (!g.ok()) return 1;
    AllReduceCase(&R, *g, DataType::kFloat32, Opt(ReduceOp::kSum), false, 1000);
    AllGatherCase(&R, *g, DataType::kBFloat16, true, 100);
    return R.failures == 0 ? 0 : 2;
  }, 60000);
  // The killed job's rank can re-attach too.
  RunRanks(1, [&](int, FILE* out) -> int {
    Rank R;
    R.out = out;
    return AttachRank(&R, d.socket(), "victim", 1, 3) ? 0 : 1;
  }, 30000);
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace hsdp
