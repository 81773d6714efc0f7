// The small-operation arena (proto/hsdp/shm/arena.h, client/src/arena.h)
// through real daemons and forked ranks: its results are the daemon path's
// bit for bit; a group's operations keep their order across the two paths;
// a member killed while the others wait in the arena fails them at once; an
// operation past its deadline breaks the arena for every member, and after
// RejoinGroup the group runs through the daemon; a member that scribbles
// over the arena hurts only its own group's operations.
#include <signal.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <numeric>
#include <string>
#include <vector>

#include "bench_util.h"
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
using testing::NowMs;
using testing::TempDir;

constexpr size_t kBufBytes = 1 << 20;

struct Rank {
  std::unique_ptr<Client> client;
  Buffer send, recv, extra;
  Group group;
};

absl::Status Attach(Rank* R, const std::string& socket, const std::string& job, int rank,
                    int world) {
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = job;
  o.rank = rank;
  o.world_size = world;
  auto c = Client::Connect(o);
  if (!c.ok()) return c.status();
  R->client = std::move(*c);
  for (Buffer* b : {&R->send, &R->recv, &R->extra}) {
    auto buf = R->client->AllocateBuffer(kBufBytes);
    if (!buf.ok()) return buf.status();
    *b = *buf;
  }
  std::vector<int> all(world);
  std::iota(all.begin(), all.end(), 0);
  auto g = R->client->NewGroup(all);
  if (!g.ok()) return g.status();
  R->group = *g;
  return absl::OkStatus();
}

// Values with many significant bits, so that the order of a reduction shows
// in the last bit; finite in every dtype.
double Value(DataType t, int rank, uint64_t i) {
  const uint64_t h = (rank * 0x9E3779B97F4A7C15ull) ^ (i * 0xBF58476D1CE4E5B9ull);
  const uint64_t m = (h ^ (h >> 29)) * 0x94D049BB133111EBull;
  const int v = int((m >> 40) % 2001) - 1000;
  if (t == DataType::kUInt8) return (m >> 32) % 256;
  if (!IsFloatingPoint(t)) return v;
  return v / 97.0;
}

struct Case {
  Collective c;
  DataType t;
  ReduceOptions o;
  uint64_t count;
  int root = 0;
  std::string Name() const {
    return std::string(CollectiveName(c)) + " " + std::string(DataTypeName(t)) + " " +
           std::string(ReduceOpName(o.op)) + " count " + std::to_string(count) + " pre " +
           std::to_string(o.pre_divide) + " post " + std::to_string(o.post_divide) +
           (o.reduce_dtype != DataType::kInvalid
                ? " wire " + std::string(DataTypeName(o.reduce_dtype))
                : "") +
           " root " + std::to_string(root);
  }
};

std::vector<Case> Cases(int world) {
  std::vector<Case> out;
  const DataType types[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                            DataType::kUInt8};
  for (DataType t : types) {
    std::vector<ReduceOp> ops = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                 ReduceOp::kProduct};
    if (IsFloatingPoint(t)) ops.push_back(ReduceOp::kPremulSum);
    for (ReduceOp op : ops) {
      ReduceOptions o;
      o.op = op;
      o.premul_factor = op == ReduceOp::kPremulSum ? 0.3 : 1.0;
      out.push_back({Collective::kAllReduce, t, o, 37});
      out.push_back({Collective::kReduceScatter, t, o, 19});
    }
    out.push_back({Collective::kAllGather, t, {}, 23});
    for (int root = 0; root < world; ++root) out.push_back({Collective::kBroadcast, t, {}, 29, root});
  }
  for (DataType t : {DataType::kFloat32, DataType::kBFloat16, DataType::kFloat64}) {
    ReduceOptions o;
    o.op = ReduceOp::kAvg;
    o.pre_divide = 2;
    o.post_divide = 3;
    o.reduce_dtype = DataType::kBFloat16;
    out.push_back({Collective::kAllReduce, t, o, 41});
    out.push_back({Collective::kReduceScatter, t, o, 17});
    o.op = ReduceOp::kSum;
    o.reduce_dtype = DataType::kInvalid;
    out.push_back({Collective::kAllReduce, t, o, 41});
  }
  // The largest the arena takes with the default data_plane.small_op_bytes
  // (64 KiB of input per member).
  out.push_back({Collective::kAllReduce, DataType::kFloat32, {}, 16384});
  out.push_back({Collective::kReduceScatter, DataType::kFloat32, {}, 16384 / uint64_t(world)});
  out.push_back({Collective::kBarrier, DataType::kInvalid, {}, 0});
  return out;
}

absl::StatusOr<Work> Submit(Rank* R, const Case& k) {
  const uint64_t in = k.c == Collective::kReduceScatter ? k.count * R->group.size : k.count;
  for (uint64_t i = 0; i < in; ++i) StoreAs(k.t, R->send.data, i, Value(k.t, R->group.rank, i));
  std::memset(R->recv.data, 0xA5, kBufBytes);
  const BufferRef s{R->send.id, 0}, r{R->recv.id, 0};
  switch (k.c) {
    case Collective::kAllReduce: return R->client->AllReduce(R->group, s, r, k.count, k.t, k.o);
    case Collective::kReduceScatter:
      return R->client->ReduceScatter(R->group, s, r, k.count, k.t, k.o);
    case Collective::kAllGather: return R->client->AllGather(R->group, s, r, k.count, k.t);
    case Collective::kBroadcast:
      return R->client->Broadcast(R->group, s, r, k.count, k.t, k.root);
    default: return R->client->Barrier(R->group);
  }
}

uint64_t OutBytes(const Case& k, int world) {
  const uint64_t b = k.count * DataTypeSize(k.t);
  return k.c == Collective::kAllGather ? b * world : b;
}

// The same operations on a daemon that gives the group an arena (A) and on
// one that cannot (B: no arena memory): the outputs must be identical bytes,
// A's ran in the arena (op_id 0: the daemon never saw them) and B's did not.
TEST(ArenaTest, ResultsAreTheDaemonPathsBitForBit) {
  TempDir da, db;
  DaemonProcess a(da), b(db);
  ASSERT_TRUE(a.Start()) << a.Log();
  ASSERT_TRUE(b.Start("data_plane:\n  small_op_arena_mib: 0\n")) << b.Log();
  const int world = 3;
  std::vector<std::unique_ptr<Child>> kids;
  for (int rank = 0; rank < world; ++rank) {
    kids.push_back(std::make_unique<Child>([&, rank](FILE* out) -> int {
      Rank A, B;
      for (auto [R, sock] : {std::pair{&A, a.socket()}, std::pair{&B, b.socket()}}) {
        if (absl::Status s = Attach(R, sock, "bitwise", rank, world); !s.ok()) {
          std::fprintf(out, "attach: %s\n", s.ToString().c_str());
          return 1;
        }
      }
      int failures = 0, cases = 0;
      for (const Case& k : Cases(world)) {
        absl::StatusOr<Work> wa = Submit(&A, k);
        absl::StatusOr<Work> wb = Submit(&B, k);
        absl::Status sa = wa.ok() ? wa->Wait(absl::Seconds(60)) : wa.status();
        absl::Status sb = wb.ok() ? wb->Wait(absl::Seconds(60)) : wb.status();
        ++cases;
        if (!sa.ok() || !sb.ok()) {
          std::fprintf(out, "FAIL %s: %s / %s\n", k.Name().c_str(), sa.ToString().c_str(),
                       sb.ToString().c_str());
          ++failures;
          continue;
        }
        if (wa->op_id() != 0 || wb->op_id() == 0) {
          std::fprintf(out, "FAIL %s: op ids %llu (arena daemon) and %llu (no arena)\n",
                       k.Name().c_str(), (unsigned long long)wa->op_id(),
                       (unsigned long long)wb->op_id());
          ++failures;
        }
        const uint64_t n = OutBytes(k, world);
        if (std::memcmp(A.recv.data, B.recv.data, n) != 0) {
          uint64_t i = 0;
          while (i < n && static_cast<char*>(A.recv.data)[i] == static_cast<char*>(B.recv.data)[i]) ++i;
          std::fprintf(out, "FAIL %s: outputs differ from byte %llu\n", k.Name().c_str(),
                       (unsigned long long)i);
          ++failures;
        }
      }
      std::fprintf(out, "rank %d: %d cases, %d failures\n", rank, cases, failures);
      return failures == 0 ? 0 : 2;
    }));
  }
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(kids[r]->Finish(120000), 0) << "rank " << r << ":\n" << kids[r]->output();
    EXPECT_THAT(kids[r]->output(), HasSubstr(" 0 failures")) << kids[r]->output();
  }
}

// A group's operations run in submission order whichever path each takes:
// an arena all-reduce's output feeds a daemon all-reduce submitted right
// after it (no Wait between), and that one's output feeds the next arena
// operation.
TEST(ArenaTest, OrderIsKeptAcrossTheArenaAndTheDaemon) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  std::vector<std::unique_ptr<Child>> kids;
  for (int rank = 0; rank < 2; ++rank) {
    kids.push_back(std::make_unique<Child>([&, rank](FILE* out) -> int {
      Rank R;
      if (absl::Status s = Attach(&R, d.socket(), "order", rank, 2); !s.ok()) return 1;
      const uint64_t small = 16, large = kBufBytes / 4;  // 64 B: arena; 1 MiB: daemon
      auto* send = static_cast<float*>(R.send.data);
      auto* recv = static_cast<float*>(R.recv.data);
      auto* extra = static_cast<float*>(R.extra.data);
      for (uint64_t i = 0; i < small; ++i) send[i] = float(rank + 1);  // sum 3
      for (uint64_t i = 0; i < large; ++i) recv[i] = 1.0f;
      const BufferRef s{R.send.id, 0}, r{R.recv.id, 0}, x{R.extra.id, 0};
      auto w1 = R.client->AllReduce(R.group, s, r, small, DataType::kFloat32);   // r[:16] = 3
      auto w2 = R.client->AllReduce(R.group, r, r, large, DataType::kFloat32);   // r[:16] = 6
      auto w3 = R.client->AllReduce(R.group, r, r, large, DataType::kFloat32);   // r[:16] = 12
      auto w4 = R.client->AllReduce(R.group, r, x, small, DataType::kFloat32);   // x[:16] = 24
      for (auto* w : {&w1, &w2, &w3, &w4}) {
        absl::Status st = w->ok() ? (*w)->Wait(absl::Seconds(60)) : w->status();
        if (!st.ok()) {
          std::fprintf(out, "FAIL: %s\n", st.ToString().c_str());
          return 2;
        }
      }
      std::fprintf(out, "op ids %llu %llu %llu %llu\n", (unsigned long long)w1->op_id(),
                   (unsigned long long)w2->op_id(), (unsigned long long)w3->op_id(),
                   (unsigned long long)w4->op_id());
      if (w1->op_id() != 0 || w2->op_id() == 0 || w3->op_id() == 0 || w4->op_id() != 0) {
        std::fprintf(out, "FAIL: not the expected paths\n");
        return 2;
      }
      for (uint64_t i = 0; i < small; ++i) {
        if (recv[i] != 12.0f || extra[i] != 24.0f) {
          std::fprintf(out, "FAIL: [%llu] recv %g (want 12), extra %g (want 24)\n",
                       (unsigned long long)i, recv[i], extra[i]);
          return 2;
        }
      }
      if (recv[small] != 4.0f || recv[large - 1] != 4.0f) {
        std::fprintf(out, "FAIL: recv[16] %g recv[last] %g (want 4)\n", recv[small], recv[large - 1]);
        return 2;
      }
      std::fprintf(out, "ordered\n");
      return 0;
    }));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(kids[r]->Finish(60000), 0) << kids[r]->output();
    EXPECT_THAT(kids[r]->output(), HasSubstr("ordered")) << kids[r]->output();
  }
}

// A member killed while another waits for it in the arena: the daemon sees
// its session end, fails the group's epoch and marks the arena broken; the
// waiter fails with ABORTED long before the collective timeout (60 s).
TEST(ArenaTest, AMemberKilledWhileAnotherWaitsFailsItAtOnce) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  auto rank_body = [&](int rank) {
    return [&, rank](FILE* out) -> int {
      Rank R;
      if (absl::Status s = Attach(&R, d.socket(), "victim", rank, 2); !s.ok()) return 1;
      auto w = R.client->AllReduce(R.group, {R.send.id, 0}, {R.recv.id, 0}, 8, DataType::kFloat32);
      if (!w.ok() || !w->Wait(absl::Seconds(30)).ok() || w->op_id() != 0) return 2;
      std::fprintf(out, "first done\n");
      if (rank == 1) {
        for (;;) ::pause();  // killed here
      }
      const int64_t start = NowMs();
      w = R.client->AllReduce(R.group, {R.send.id, 0}, {R.recv.id, 0}, 8, DataType::kFloat32);
      if (w.ok()) std::fprintf(out, "second submitted\n");  // its arrival is in the arena
      absl::Status s = w.ok() ? w->Wait(absl::Seconds(50)) : w.status();
      std::fprintf(out, "second after %lld ms: %s\n", (long long)(NowMs() - start),
                   s.ToString().c_str());
      return s.ok() ? 3 : 0;
    };
  };
  Child r0(rank_body(0)), r1(rank_body(1));
  ASSERT_TRUE(r0.WaitFor("first done", 30000)) << r0.output();
  ASSERT_TRUE(r1.WaitFor("first done", 30000)) << r1.output();
  // Rank 0's second operation is in the arena, waiting for rank 1.
  ASSERT_TRUE(r0.WaitFor("second submitted", 30000)) << r0.output();
  r1.Kill(SIGKILL);
  EXPECT_EQ(r1.Finish(5000), 128 + SIGKILL);
  ASSERT_EQ(r0.Finish(20000), 0) << r0.output();
  EXPECT_THAT(r0.output(), AllOf(HasSubstr("ABORTED"), HasSubstr("second after"))) << r0.output();
  ASSERT_TRUE(d.Alive()) << d.Log();
}

// An arena operation past its deadline (one member late) breaks the arena:
// both members' operations fail with DEADLINE_EXCEEDED naming the late rank;
// after RejoinGroup the group runs through the daemon and works.
TEST(ArenaTest, ADeadlineBreaksTheArenaAndRejoiningUsesTheDaemon) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  collective_ms: 1000\n")) << d.Log();
  std::vector<std::unique_ptr<Child>> kids;
  for (int rank = 0; rank < 2; ++rank) {
    kids.push_back(std::make_unique<Child>([&, rank](FILE* out) -> int {
      Rank R;
      if (absl::Status s = Attach(&R, d.socket(), "late", rank, 2); !s.ok()) return 1;
      if (rank == 1) ::usleep(3000 * 1000);  // rank 0 fails at 1 s
      auto w = R.client->AllReduce(R.group, {R.send.id, 0}, {R.recv.id, 0}, 8, DataType::kFloat32);
      absl::Status s = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
      std::fprintf(out, "late op: %s\n", s.ToString().c_str());
      if (s.ok()) return 2;
      // Both rejoin once both late operations have failed.
      const std::string failed = dir.File("late-failed" + std::to_string(rank));
      testing::WriteFile(failed, "");
      const std::string other = dir.File("late-failed" + std::to_string(1 - rank));
      if (!testing::Eventually([&] { return testing::Exists(other); }, 20000)) return 5;
      auto g = R.client->RejoinGroup(R.group);
      if (!g.ok()) {
        std::fprintf(out, "rejoin: %s\n", g.status().ToString().c_str());
        return 3;
      }
      R.group = *g;
      auto* send = static_cast<float*>(R.send.data);
      auto* recv = static_cast<float*>(R.recv.data);
      for (int i = 0; i < 8; ++i) send[i] = float(rank + 1);
      w = R.client->AllReduce(R.group, {R.send.id, 0}, {R.recv.id, 0}, 8, DataType::kFloat32);
      s = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
      if (!s.ok() || recv[0] != 3.0f || recv[7] != 3.0f || w->op_id() == 0) {
        std::fprintf(out, "after rejoin: %s, %g, op id %llu\n", s.ToString().c_str(), recv[0],
                     w.ok() ? (unsigned long long)w->op_id() : 0ull);
        return 4;
      }
      std::fprintf(out, "after rejoin: ok through the daemon\n");
      return 0;
    }));
  }
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(kids[r]->Finish(30000), 0) << kids[r]->output();
    EXPECT_THAT(kids[r]->output(),
                AllOf(HasSubstr("late op: DEADLINE_EXCEEDED"), HasSubstr("rank(s) [1]"),
                      HasSubstr("after rejoin: ok")))
        << kids[r]->output();
  }
}

// The arena's mapping in this process (its memfd is named "hsdp-arena").
std::pair<char*, size_t> FindArenaMapping() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("memfd:hsdp-arena") == std::string::npos) continue;
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && hi > lo) {
      return {reinterpret_cast<char*>(lo), hi - lo};
    }
  }
  return {nullptr, 0};
}

// A hostile member overwrites the whole arena (all 0xFF bytes, then random
// bytes): its group's next operations fail at both members — no crash, no
// hang — while the daemon and another job's group go on.
TEST(ArenaTest, AMemberScribblingOverTheArenaHurtsOnlyItsOwnGroup) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  collective_ms: 2000\n")) << d.Log();
  for (const bool random : {false, true}) {
    const std::string job = random ? "scribbled-random" : "scribbled-ff";
    std::vector<std::unique_ptr<Child>> kids;
    for (int rank = 0; rank < 2; ++rank) {
      kids.push_back(std::make_unique<Child>([&, rank](FILE* out) -> int {
        Rank R;
        if (absl::Status s = Attach(&R, d.socket(), job, rank, 2); !s.ok()) return 1;
        auto w = R.client->AllReduce(R.group, {R.send.id, 0}, {R.recv.id, 0}, 8,
                                     DataType::kFloat32);
        if (!w.ok() || !w->Wait(absl::Seconds(30)).ok() || w->op_id() != 0) return 2;
        // Rank 0 is done with the arena before rank 1 scribbles (a file, not
        // an operation: rank 0 may still be reading the last one's slot).
        const std::string past = dir.File(job + ".rank0-past"), done = dir.File(job + ".scribbled");
        auto wait_file = [](const std::string& path) {
          return testing::Eventually([&] { return ::access(path.c_str(), F_OK) == 0; }, 20000, 1);
        };
        if (rank == 0) {
          testing::WriteFile(past, "");
          if (!wait_file(done)) return 3;
        }
        if (rank == 1) {
          if (!wait_file(past)) return 3;
          auto [base, bytes] = FindArenaMapping();
          if (base == nullptr) {
            std::fprintf(out, "no arena mapping found\n");
            return 4;
          }
          if (random) {
            std::mt19937_64 gen(42);
            for (size_t i = 0; i < bytes; ++i) base[i] = static_cast<char>(gen());
          } else {
            std::memset(base, 0xFF, bytes);
          }
          testing::WriteFile(done, "");
        }
        w = R.client->Barrier(R.group);
        absl::Status barrier = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
        w = R.client->AllReduce(R.group, {R.send.id, 0}, {R.recv.id, 0}, 8, DataType::kFloat32);
        absl::Status s = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
        std::fprintf(out, "after: barrier %s; all_reduce %s\n", barrier.ToString().c_str(),
                     s.ToString().c_str());
        return 0;
      }));
    }
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(kids[r]->Finish(30000), 0) << kids[r]->output();
      EXPECT_THAT(kids[r]->output(), HasSubstr("after: ")) << kids[r]->output();
      EXPECT_THAT(kids[r]->output(), ::testing::Not(HasSubstr("all_reduce OK")))
          << kids[r]->output();
    }
  }
  ASSERT_TRUE(d.Alive()) << d.Log();
  // Another job on the same daemon is untouched.
  std::vector<std::unique_ptr<Child>> kids;
  for (int rank = 0; rank < 2; ++rank) {
    kids.push_back(std::make_unique<Child>([&, rank](FILE* out) -> int {
      Rank R;
      if (absl::Status s = Attach(&R, d.socket(), "bystander", rank, 2); !s.ok()) return 1;
      auto* send = static_cast<float*>(R.send.data);
      auto* recv = static_cast<float*>(R.recv.data);
      for (int i = 0; i < 8; ++i) send[i] = float(rank + 1);
      auto w = R.client->AllReduce(R.group, {R.send.id, 0}, {R.recv.id, 0}, 8, DataType::kFloat32);
      absl::Status s = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
      std::fprintf(out, "bystander: %s %g\n", s.ToString().c_str(), recv[0]);
      return s.ok() && recv[0] == 3.0f && recv[7] == 3.0f ? 0 : 2;
    }));
  }
  for (int r = 0; r < 2; ++r) EXPECT_EQ(kids[r]->Finish(30000), 0) << kids[r]->output();
}

}  // namespace
}  // namespace hsdp
