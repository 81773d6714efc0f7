// Untrusted input through the shared-memory ring, written by a raw client:
// bad ids, ranges, enums; writes after detach; random bytes. Each bad
// descriptor fails alone (INVALID_ARGUMENT) or ends only that session; the
// daemon and other sessions keep working.
#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "raw_session.h"
#include "test_util.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::Child;
using testing::CountSessions;
using testing::DaemonProcess;
using testing::Eventually;
using testing::RawSession;
using testing::RunCommand;
using testing::TempDir;

shm::OpDescriptor AllReduce(uint64_t op_id, uint64_t seq, uint32_t group, uint64_t buf,
                            uint64_t count) {
  shm::OpDescriptor d{};
  d.op_id = op_id;
  d.seq = seq;
  d.collective = static_cast<uint8_t>(Collective::kAllReduce);
  d.dtype = static_cast<uint8_t>(DataType::kFloat32);
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  d.count = count;
  d.send = {buf, 0};
  d.recv = {buf, 2048};
  d.premul_factor = d.pre_divide = d.post_divide = 1.0;
  d.group_id = group;
  d.epoch = 1;
  return d;
}

TEST(RingTest, BadDescriptorsFailAloneNamingTheField) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  shutdown_grace_ms: 200\n")) << d.Log();
  RawSession raw;
  ASSERT_TRUE(raw.Open(d.socket(), "raw", 0, 1).ok());
  auto gid = raw.NewGroup({0});
  ASSERT_TRUE(gid.ok()) << gid.status();
  char* data = nullptr;
  auto buf = raw.RegisterBuffer(4096, &data);
  ASSERT_TRUE(buf.ok()) << buf.status();

  struct Case {
    const char* field;
    std::function<void(shm::OpDescriptor*)> mutate;
  };
  const std::vector<Case> cases = {
      {"send.buffer_id", [&](auto* x) { x->send.buffer_id = *buf + 1000; }},
      {"recv.buffer_id", [&](auto* x) { x->recv.buffer_id = 0; }},
      {"send.offset_bytes", [&](auto* x) { x->send.offset_bytes = 4093; }},
      {"recv.offset_bytes", [&](auto* x) { x->recv.offset_bytes = ~uint64_t{0} - 2; }},
      {"recv.offset_bytes", [&](auto* x) { x->count = 513; }},
      {"count", [&](auto* x) { x->count = (uint64_t{1} << 40) + 1; }},
      {"reserved1", [&](auto* x) { x->reserved1[3] = 1; }},
      {"flags", [&](auto* x) { x->flags = 0x80; }},
      {"count", [&](auto* x) { x->count = ~uint64_t{0} / 4; }},
      {"dtype", [&](auto* x) { x->dtype = 77; }},
      {"reduce_op", [&](auto* x) { x->reduce_op = 99; }},
      {"reduce_dtype", [&](auto* x) { x->reduce_dtype = uint8_t(DataType::kInt64); }},
      {"pre_divide", [&](auto* x) { x->pre_divide = 0; }},
      {"collective", [&](auto* x) { x->collective = 42; }},
      {"root", [&](auto* x) {
         x->collective = uint8_t(Collective::kBroadcast);
         x->root = 5;
       }},
      {"recv.offset_bytes", [&](auto* x) { x->recv.offset_bytes = 4; }},  // partial overlap
      {"group_id", [&](auto* x) { x->group_id = *gid + 100; }},
      {"group2_id", [&](auto* x) {
         x->collective = uint8_t(Collective::kReduceScatterAllReduce);
         x->group2_id = *gid + 100;
       }},
  };
  uint64_t op_id = 0, seq = 0;
  for (const Case& c : cases) {
    shm::OpDescriptor desc = AllReduce(++op_id, ++seq, *gid, *buf, 16);
    c.mutate(&desc);
    raw.Push(desc);
    auto s = raw.Completion(op_id, 5000);
    ASSERT_TRUE(s.has_value()) << c.field << ": no completion";
    EXPECT_EQ(s->code(), absl::StatusCode::kInvalidArgument) << *s;
    EXPECT_THAT(std::string(s->message()), HasSubstr(c.field)) << *s;
  }
  // A sequence number far ahead, and a duplicate of one that already ran.
  raw.Push(AllReduce(++op_id, seq + (uint64_t{1} << 40), *gid, *buf, 16));
  auto far = raw.Completion(op_id, 5000);
  ASSERT_TRUE(far.has_value());
  EXPECT_EQ(far->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(far->message()), HasSubstr("seq"));
  // The session still works: a valid all-reduce (world of one copies send to recv).
  // Sequence numbers of ops that failed at the group were consumed; the
  // ones rejected before reaching it (unknown group) were not.
  for (int i = 0; i < 512; ++i) reinterpret_cast<float*>(data)[i] = float(i) + 0.5f;
  uint64_t next_seq = 1;
  for (; next_seq <= seq + 1; ++next_seq) {
    raw.Push(AllReduce(++op_id, next_seq, *gid, *buf, 16));
    auto s = raw.Completion(op_id, 5000);
    ASSERT_TRUE(s.has_value());
    if (s->ok()) break;
  }
  ASSERT_LE(next_seq, seq + 1) << "no valid op succeeded";
  for (int i = 0; i < 16; ++i) EXPECT_EQ(reinterpret_cast<float*>(data + 2048)[i], float(i) + 0.5f);
  // The same seq again is refused.
  raw.Push(AllReduce(++op_id, next_seq, *gid, *buf, 16));
  auto again = raw.Completion(op_id, 5000);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(raw.closed());
  EXPECT_EQ(CountSessions(d.socket(), "raw"), 1);
  EXPECT_EQ(RunCommand(testing::Hsdpctl(d.socket(), "health")).exit_code, 0);
  EXPECT_EQ(d.Stop(), 0);
}

TEST(RingTest, WritesAfterDetachAreIgnored) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  shutdown_grace_ms: 200\n")) << d.Log();
  RawSession raw;
  ASSERT_TRUE(raw.Open(d.socket(), "raw", 0, 1).ok());
  auto gid = raw.NewGroup({0});
  char* data = nullptr;
  auto buf = raw.RegisterBuffer(4096, &data);
  ASSERT_TRUE(gid.ok() && buf.ok());
  raw.Push(AllReduce(1, 1, *gid, *buf, 8));
  ASSERT_TRUE(raw.Completion(1, 5000).value_or(absl::UnknownError("none")).ok());
  ASSERT_TRUE(raw.Detach().ok());
  EXPECT_TRUE(raw.closed()) << "the daemon marks the channel closed";
  for (uint64_t op = 2; op < 50; ++op) raw.Push(AllReduce(op, op, *gid, *buf, 8));
  raw.header()->head.store(123456789);  // even a corrupt ring after detach
  raw.Bell();
  EXPECT_FALSE(raw.Completion(2, 300).has_value());
  EXPECT_EQ(CountSessions(d.socket()), 0);
  // The daemon still serves a normal client.
  ClientOptions o;
  o.socket_path = d.socket();
  o.job_id = "after";
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto g = (*c)->NewGroup({0});
  ASSERT_TRUE(g.ok());
  auto w = (*c)->Barrier(*g);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->Wait(absl::Seconds(10)).ok());
  // A real client's submissions after Detach fail on its side.
  ASSERT_TRUE((*c)->Detach().ok());
  auto late = (*c)->Barrier(*g);
  EXPECT_FALSE(late.ok() && late->Wait(absl::Seconds(5)).ok());
  c->reset();
  EXPECT_EQ(d.Stop(), 0);
}

// A normal 2-rank job runs verified all-reduces until <dir>/stop exists,
// then one more; prints how many succeeded.
int NormalJob(const std::string& socket, const std::string& stop_file, int rank, FILE* out) {
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = "bystander";
  o.rank = rank;
  o.world_size = 2;
  auto c = Client::Connect(o);
  if (!c.ok()) return 1;
  auto g = (*c)->NewGroup({0, 1});
  auto b = (*c)->AllocateBuffer(64 << 10);
  if (!g.ok() || !b.ok()) return 1;
  auto* f = static_cast<float*>(b->data);
  std::fprintf(out, "ready\n");
  int done = 0;
  for (bool last = false;;) {
    last = testing::Exists(stop_file);
    // A flag both ranks agree on comes from the collective itself: the
    // stop decision is the max over ranks.
    for (int i = 0; i < 1024; ++i) f[i] = float(rank + 1) * float(i % 13 + done % 5);
    f[1024] = last ? 1.0f : 0.0f;
    auto w = (*c)->AllReduce(*g, {b->id, 0}, {b->id, 8192}, 1025, DataType::kFloat32,
                             {ReduceOp::kMax});
    absl::Status s = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
    if (!s.ok()) {
      std::fprintf(out, "error: %s\n", s.ToString().c_str());
      return 2;
    }
    const float* r = f + 2048;
    for (int i = 0; i < 1024; ++i) {
      if (r[i] != 2.0f * float(i % 13 + done % 5)) {
        std::fprintf(out, "wrong value at %d\n", i);
        return 3;
      }
    }
    ++done;
    if (r[1024] != 0.0f) break;
  }
  std::fprintf(out, "ops %d\n", done);
  return 0;
}

TEST(RingTest, RandomBytesInTheRingNeverHurtTheDaemonOrOtherSessions) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  shutdown_grace_ms: 200\n")) << d.Log();
  const std::string stop = dir.File("stop");
  // Fork the bystanders before this process touches gRPC.
  Child r0([&](FILE* out) { return NormalJob(d.socket(), stop, 0, out); });
  Child r1([&](FILE* out) { return NormalJob(d.socket(), stop, 1, out); });
  ASSERT_TRUE(r0.WaitFor("ready", 20000)) << r0.output();
  ASSERT_TRUE(r1.WaitFor("ready", 20000)) << r1.output();

  std::mt19937_64 rng(20240611);
  RawSession fuzz;
  ASSERT_TRUE(fuzz.Open(d.socket(), "fuzz", 0, 2).ok());
  auto gid = fuzz.NewGroup({0, 1});
  char* data = nullptr;
  auto buf = fuzz.RegisterBuffer(1 << 16, &data);
  ASSERT_TRUE(gid.ok() && buf.ok());

  // Phase 1: random descriptors with sequential op ids; fields random bytes,
  // but often with our real group and buffer ids to get past the first checks.
  uint64_t op_id = 0;
  for (int round = 0; round < 8; ++round) {
    const uint64_t first = op_id + 1;
    for (int k = 0; k < 50; ++k) {
      uint64_t words[sizeof(shm::OpDescriptor) / 8];
      for (uint64_t& w : words) w = rng();
      shm::OpDescriptor desc{};
      std::memcpy(static_cast<void*>(&desc), words, sizeof(desc));
      desc.op_id = ++op_id;
      if (rng() % 2) desc.group_id = *gid;
      if (rng() % 2) desc.send.buffer_id = *buf;
      if (rng() % 2) desc.recv.buffer_id = *buf;
      if (rng() % 2) desc.seq = rng() % 8;
      if (rng() % 4 == 0) desc.collective = uint8_t(rng() % 5);  // not barrier
      if (desc.collective == uint8_t(Collective::kBarrier)) desc.collective = 0;
      fuzz.Push(desc);
    }
    for (uint64_t id = first; id <= op_id; ++id) {
      auto s = fuzz.Completion(id, 5000);
      ASSERT_TRUE(s.has_value()) << "op " << id << " never completed";
      EXPECT_EQ(s->code(), absl::StatusCode::kInvalidArgument) << "op " << id << ": " << *s;
    }
  }
  EXPECT_FALSE(fuzz.closed());

  // Phase 2: scribble on header fields the daemon must not trust, then a
  // random head index: the session ends, nothing else does.
  shm::ChannelHeader* h = fuzz.header();
  h->ring_entries = 3;
  h->ring_offset = ~uint64_t{0};
  h->completion_offset = 12345;
  h->tail.store(rng());
  h->state.store(0xdeadbeef);
  fuzz.Push(AllReduce(++op_id, 1, 9999, *buf, 4));  // still handled with the daemon's own layout
  EXPECT_EQ(fuzz.Completion(op_id, 5000).value_or(absl::OkStatus()).code(),
            absl::StatusCode::kInvalidArgument);
  h->head.store(h->head.load() + (uint64_t{1} << 40) + 17);
  fuzz.Bell();
  EXPECT_TRUE(Eventually([&] { return fuzz.closed(); }, 3000)) << "corrupt ring must end the session";
  EXPECT_TRUE(Eventually([&] { return CountSessions(d.socket(), "fuzz") == 0; }, 3000));
  EXPECT_THAT(d.Log(), HasSubstr("corrupt"));

  // Phase 3: many sessions writing pure garbage at once, head indices included.
  std::vector<std::unique_ptr<RawSession>> garbage;
  for (int i = 0; i < 4; ++i) {
    garbage.push_back(std::make_unique<RawSession>());
    ASSERT_TRUE(garbage.back()->Open(d.socket(), "garbage" + std::to_string(i), 0, 1).ok());
    (void)garbage.back()->NewGroup({0});
  }
  for (int round = 0; round < 20; ++round) {
    for (auto& g : garbage) {
      auto* ring = reinterpret_cast<uint64_t*>(g->Ring());
      for (size_t i = 0; i < g->entries() * sizeof(shm::OpDescriptor) / 8; i += 7) ring[i] = rng();
      g->header()->head.store(g->header()->head.load() + rng() % (round < 10 ? 64 : 1u << 20));
      g->Bell();
    }
  }
  EXPECT_TRUE(Eventually([&] { return CountSessions(d.socket()) >= 2; }, 1000));

  // The bystanders never saw an error; stop them.
  testing::WriteFile(stop, "stop");
  ASSERT_EQ(r0.Finish(30000), 0) << r0.output();
  ASSERT_EQ(r1.Finish(30000), 0) << r1.output();
  EXPECT_THAT(r0.output(), HasSubstr("ops "));
  EXPECT_TRUE(d.Alive()) << d.Log();
  EXPECT_EQ(RunCommand(testing::Hsdpctl(d.socket(), "health")).exit_code, 0);
  // A fresh normal client still gets service.
  ClientOptions o;
  o.socket_path = d.socket();
  o.job_id = "after-fuzz";
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto g = (*c)->NewGroup({0});
  ASSERT_TRUE(g.ok());
  auto w = (*c)->Barrier(*g);
  ASSERT_TRUE(w.ok());
  EXPECT_TRUE(w->Wait(absl::Seconds(10)).ok());
  c->reset();
  garbage.clear();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

}  // namespace
}  // namespace hsdp
