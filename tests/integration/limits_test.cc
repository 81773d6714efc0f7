// Resource bounds against a real daemon: limits are reserved atomically,
// memory never grows with a number the client chose (group size, sequence
// numbers, refused requests), messages do not overflow, and registrations
// waiting for their fd hold no thread each.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "hsdp/v1/node.grpc.pb.h"
#include "hardening_util.h"
#include "raw_session.h"
#include "test_util.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::DaemonProcess;
using testing::RawSession;
using testing::RssKiB;
using testing::TempDir;

int Threads(pid_t pid) {
  int n = 0;
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
  if (d == nullptr) return -1;
  while (struct dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

std::unique_ptr<Client> Connect(const std::string& socket, const std::string& job, int rank = 0,
                                int world = 1) {
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = job;
  o.rank = rank;
  o.world_size = world;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(LimitsTest, ConcurrentRegistrationsAreReservedAtomically) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("limits:\n  max_session_bytes: 1MiB\n  max_buffers_per_session: 2\n"))
      << d.Log();
  auto c = Connect(d.socket(), "atomic");
  ASSERT_NE(c, nullptr);
  std::atomic<int> ok{0}, exhausted{0}, other{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      auto b = c->AllocateBuffer(1 << 20);
      if (b.ok()) {
        ++ok;
      } else if (b.status().code() == absl::StatusCode::kResourceExhausted) {
        ++exhausted;
      } else {
        ++other;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 1) << "only one 1 MiB buffer fits a 1 MiB session";
  EXPECT_EQ(exhausted.load(), 7);
  EXPECT_EQ(other.load(), 0);
  v1::StatusResponse st;
  ASSERT_TRUE(testing::QueryStatus(d.socket(), &st));
  EXPECT_EQ(st.bytes_registered(), uint64_t{1} << 20);
}

TEST(LimitsTest, HugeSizesAreReportedWithoutOverflow) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  auto c = Connect(d.socket(), "huge");
  ASSERT_NE(c, nullptr);
  auto b = c->AllocateBuffer(~size_t{0});
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string msg(b.status().message());
  EXPECT_THAT(msg, HasSubstr("18446744073709551615"));
  EXPECT_THAT(msg, Not(HasSubstr("4095 bytes"))) << "a wrapped sum";
}

TEST(LimitsTest, MemoryDoesNotFollowAClientChosenGroupSizeOrSequenceNumbers) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  shutdown_grace_ms: 200\n")) << d.Log();
  constexpr int kWorld = 1 << 20;
  RawSession raw;
  ASSERT_TRUE(raw.Open(d.socket(), "big", 0, kWorld).ok());
  std::vector<int> all(kWorld);
  for (int i = 0; i < kWorld; ++i) all[i] = i;
  // Refused NewGroup calls cost nothing (here: the caller is not in the list).
  std::vector<int> others(all.begin() + 1, all.end());
  // (Warm up first: gRPC and malloc keep their buffers for reuse.)
  for (int i = 0; i < 10; ++i) EXPECT_FALSE(raw.NewGroup(others).ok());
  const int64_t rss0 = RssKiB(d.pid());
  for (int i = 0; i < 30; ++i) EXPECT_FALSE(raw.NewGroup(others).ok());
  const int64_t rss1 = RssKiB(d.pid());
  // The old daemon kept each refused 4 MiB rank list: +120 MiB here. Under
  // ASan freed memory waits in its quarantine and every block has redzones,
  // so the bound is looser there (it still catches a kept list).
#ifdef HSDP_SANITIZED
  constexpr int64_t kBoundKiB = 64 * 1024;
#else
  constexpr int64_t kBoundKiB = 16 * 1024;
#endif
  EXPECT_LT(rss1 - rss0, kBoundKiB) << "KiB kept by 30 refused NewGroup calls";
  // A group of 2^20 ranks (within the per-job member budget) ...
  auto gid = raw.NewGroup(all);
  ASSERT_TRUE(gid.ok()) << gid.status();
  // ... and a second one exceeds the budget.
  auto second = raw.NewGroup(all);
  ASSERT_FALSE(second.ok());
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("group members"));
  char* data = nullptr;
  auto buf = raw.RegisterBuffer(1 << 16, &data);
  ASSERT_TRUE(buf.ok()) << buf.status();
  const int64_t rss2 = RssKiB(d.pid());
  // Every queued submission of this group waits for 2^20 - 1 members that
  // will never come; each must cost a bounded amount, not one slot per rank.
  const uint32_t n = raw.entries();
  for (uint64_t op = 1; op <= n; ++op) {
    shm::OpDescriptor desc{};
    desc.op_id = op;
    desc.seq = op;
    desc.epoch = 1;
    desc.group_id = *gid;
    desc.collective = static_cast<uint8_t>(Collective::kAllReduce);
    desc.dtype = static_cast<uint8_t>(DataType::kFloat32);
    desc.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    desc.count = 4;
    desc.send = {*buf, 0};
    desc.recv = {*buf, 1024};
    desc.premul_factor = desc.pre_divide = desc.post_divide = 1.0;
    raw.Push(desc);
  }
  ASSERT_TRUE(testing::Eventually([&] { return raw.header()->tail.load() == n; }, 10000))
      << "the daemon consumed every descriptor";
  const int64_t rss3 = RssKiB(d.pid());
  EXPECT_LT(rss3 - rss2, 64 * 1024) << "KiB for " << n << " pending operations";
  EXPECT_TRUE(d.Alive());
  EXPECT_FALSE(raw.closed());
}

TEST(LimitsTest, RegistrationsWaitingForTheirFdHoldNoThreadEach) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  constexpr int kSessions = 6;
  std::vector<std::unique_ptr<RawSession>> sessions;
  for (int i = 0; i < kSessions; ++i) {
    sessions.push_back(std::make_unique<RawSession>());
    ASSERT_TRUE(sessions.back()->Open(d.socket(), "wait-" + std::to_string(i), 0, 1).ok());
  }
  const int threads_before = Threads(d.pid());
  // 16 RegisterBuffer calls per session for fds that are never sent, all at once.
  grpc::ChannelArguments args;
  auto channel = grpc::CreateCustomChannel("unix:" + d.socket(),
                                           grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Node::NewStub(channel);
  grpc::CompletionQueue cq;
  struct Call {
    grpc::ClientContext ctx;
    v1::RegisterBufferResponse resp;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::RegisterBufferResponse>> rpc;
  };
  std::vector<std::unique_ptr<Call>> calls;
  for (int s = 0; s < kSessions; ++s) {
    for (int i = 0; i < 17; ++i) {
      auto call = std::make_unique<Call>();
      call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      v1::RegisterBufferRequest req;
      req.set_session_id(sessions[s]->session_id());
      req.set_fd_tag(1000 + i);
      req.set_size_bytes(4096);
      call->rpc = stub->AsyncRegisterBuffer(&call->ctx, req, &cq);
      call->rpc->Finish(&call->resp, &call->status, call.get());
      calls.push_back(std::move(call));
    }
  }
  // The 17th call of each session is refused at once (16 waiters at most).
  int refused = 0;
  for (int k = 0; k < kSessions; ++k) {
    void* tag;
    bool ok;
    ASSERT_EQ(cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(3)),
              grpc::CompletionQueue::GOT_EVENT);
    auto* call = static_cast<Call*>(tag);
    EXPECT_EQ(call->status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << call->status.error_message();
    refused += call->status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
  }
  EXPECT_EQ(refused, kSessions);
  const int threads_waiting = Threads(d.pid());
  EXPECT_LT(threads_waiting - threads_before, 8)
      << kSessions * 16 << " waiting registrations grew the daemon from " << threads_before
      << " to " << threads_waiting << " threads";
  // Other work is not held up: a new trainer attaches and registers at once.
  auto c = Connect(d.socket(), "busy-node");
  ASSERT_NE(c, nullptr);
  const int64_t t0 = testing::NowMs();
  auto b = c->AllocateBuffer(4096);
  EXPECT_TRUE(b.ok()) << b.status();
  EXPECT_LT(testing::NowMs() - t0, 2000);
  // The waiters end with NOT_FOUND when their deadline passes (5 s).
  int not_found = 0;
  for (int k = 0; k < kSessions * 16; ++k) {
    void* tag;
    bool ok;
    if (cq.AsyncNext(&tag, &ok, std::chrono::system_clock::now() + std::chrono::seconds(15)) !=
        grpc::CompletionQueue::GOT_EVENT) {
      break;
    }
    not_found += static_cast<Call*>(tag)->status.error_code() == grpc::StatusCode::NOT_FOUND;
  }
  EXPECT_EQ(not_found, kSessions * 16);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
}

}  // namespace
}  // namespace hsdp
