// The client reconnects by itself when its daemon comes back on the same
// socket: after SIGKILL and a restart, and after `hsdpctl drain`
// and a restart, a training loop of two trainer processes keeps running with the Buffer and
// Group values it had; only the operations in flight fail (UNAVAILABLE), the
// loop retries its step after the ranks agree which one that is, and the
// result equals an uninterrupted run's. Without ClientOptions::reconnect the
// client stays failed; a daemon that does not come back within the timeout
// is reported as such.
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "hardening_util.h"
#include "hsdp/common/unix_socket.h"
#include "hsdp/shm/data_conn.h"
#include "raw_session.h"
#include "test_util.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::DaemonProcess;
using testing::RssKiB;
using testing::TempDir;

constexpr int kSteps = 600;

ClientOptions Options(const std::string& socket, const std::string& job, int rank) {
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = job;
  o.rank = rank;
  o.world_size = 2;
  o.reconnect_timeout = absl::Seconds(20);
  return o;
}

// One rank's loop: step s all-reduces 4 floats of value rank + 1 + s and
// adds the result to its history. An op that fails UNAVAILABLE (the daemon
// went away under it) is not counted: the ranks then all-reduce (min) how
// many steps each completed, roll back to that and go on, since one rank may
// have seen a step complete that the other did not.
struct RankResult {
  absl::Status status;
  double total = 0;
  int failed_ops = 0;
  uint64_t reconnects = 0;
  uint64_t first_buffer_id = 0, last_buffer_id = 0;
};

RankResult RunRank(const std::string& socket, const std::string& job, int rank,
                   std::atomic<int>* progress) {
  RankResult out;
  auto c = Client::Connect(Options(socket, job, rank));
  if (!c.ok()) {
    out.status = c.status();
    return out;
  }
  Client& client = **c;
  auto x = client.AllocateBuffer(4 * sizeof(float), "x");
  auto agree = client.AllocateBuffer(sizeof(float), "agree");
  auto g = client.NewGroup({0, 1});
  if (!x.ok() || !agree.ok() || !g.ok()) {
    out.status = !x.ok() ? x.status() : !agree.ok() ? agree.status() : g.status();
    return out;
  }
  out.first_buffer_id = x->id;
  std::vector<double> history = {0.0};
  auto* v = static_cast<float*>(x->data);
  auto* a = static_cast<float*>(agree->data);
  int step = 0;
  while (step < kSteps) {
    for (int i = 0; i < 4; ++i) v[i] = float(rank + 1 + step);
    absl::StatusOr<Work> op = client.AllReduce(*g, {x->id, 0}, {x->id, 0}, 4, DataType::kFloat32);
    absl::Status s = op.ok() ? op->Wait(absl::Seconds(30)) : op.status();
    if (s.ok()) {
      history.push_back(history.back() + v[0]);
      ++step;
      progress->fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(500));
      continue;
    }
    if (!absl::IsUnavailable(s)) {
      out.status = s;
      return out;
    }
    ++out.failed_ops;
    // While a drain runs, new operations are refused (UNAVAILABLE) until the
    // daemon ends the sessions and its successor starts: retry, bounded.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (;;) {
      a[0] = float(step);
      absl::StatusOr<Work> w = client.AllReduce(*g, {agree->id, 0}, {agree->id, 0}, 1,
                                                DataType::kFloat32, ReduceOptions{ReduceOp::kMin});
      s = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
      if (s.ok()) break;
      if (!absl::IsUnavailable(s) || std::chrono::steady_clock::now() > give_up) {
        out.status = s;
        return out;
      }
      ++out.failed_ops;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    step = static_cast<int>(a[0]);
    history.resize(step + 1);
  }
  out.total = history.back();
  out.reconnects = client.reconnects();
  out.last_buffer_id = x->id;
  out.status = client.Detach();
  return out;
}

double Expected() {
  double sum = 0;
  for (int s = 0; s < kSteps; ++s) sum += (1 + s) + (2 + s);
  return sum;
}

// Runs both ranks, each in its own process (a trainer); `disrupt` is called
// once they have done 100 steps each. Progress and results travel through a
// shared anonymous mapping made before the fork.
std::vector<RankResult> RunLoop(const std::string& socket, const std::string& job,
                                const std::function<void()>& disrupt) {
  struct Shared {
    std::atomic<int> progress{0};
    struct {
      double total;
      int failed_ops;
      uint64_t reconnects, first_buffer_id, last_buffer_id;
      int code;
      char message[256];
    } rank[2];
  };
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return {};
  auto* shared = new (mem) Shared();
  std::vector<std::unique_ptr<testing::Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<testing::Child>([=](FILE*) {
      const RankResult res = RunRank(socket, job, r, &shared->progress);
      auto& out = shared->rank[r];
      out.total = res.total;
      out.failed_ops = res.failed_ops;
      out.reconnects = res.reconnects;
      out.first_buffer_id = res.first_buffer_id;
      out.last_buffer_id = res.last_buffer_id;
      out.code = static_cast<int>(res.status.code());
      std::snprintf(out.message, sizeof(out.message), "%s",
                    std::string(res.status.message()).c_str());
      return 0;
    }));
  }
  (void)testing::Eventually([&] { return shared->progress.load() >= 200; }, 30000, 2);
  disrupt();
  std::vector<RankResult> results(2);
  for (int r = 0; r < 2; ++r) {
    const int rc = ranks[r]->Finish(120000);
    const auto& in = shared->rank[r];
    results[r].status = rc != 0 ? absl::InternalError("rank process exit " + std::to_string(rc))
                                : absl::Status(static_cast<absl::StatusCode>(in.code), in.message);
    results[r].total = in.total;
    results[r].failed_ops = in.failed_ops;
    results[r].reconnects = in.reconnects;
    results[r].first_buffer_id = in.first_buffer_id;
    results[r].last_buffer_id = in.last_buffer_id;
  }
  ::munmap(mem, sizeof(Shared));
  return results;
}

void ExpectUninterruptedResult(const std::vector<RankResult>& results) {
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(r);
    EXPECT_TRUE(results[r].status.ok()) << results[r].status;
    EXPECT_EQ(results[r].total, Expected());
    EXPECT_EQ(results[r].reconnects, 1u);
    EXPECT_EQ(results[r].last_buffer_id, results[r].first_buffer_id);
  }
}

TEST(ReconnectTest, ATrainingLoopKeepsRunningAcrossSigkillAndARestartOfTheDaemon) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  const auto results = RunLoop(d.socket(), "reconnect-kill", [&] {
    d.Kill();
    ASSERT_TRUE(d.Start()) << d.Log();
  });
  ExpectUninterruptedResult(results);
  // At most the op in flight and the first agreement on the dead daemon.
  for (const RankResult& r : results) EXPECT_LE(r.failed_ops, 3);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(ReconnectTest, ATrainingLoopKeepsRunningAcrossADrainAndARestart) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  const auto results = RunLoop(d.socket(), "reconnect-drain", [&] {
    const auto r = testing::RunCommand(testing::Hsdpctl(d.socket(), "drain --timeout 10"));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(d.WaitForExit(10000), 0) << d.Log();
    ASSERT_TRUE(d.Start()) << d.Log();
  });
  ExpectUninterruptedResult(results);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(ReconnectTest, ThreadsSharingAClientReconnectItOnce) {
  // Four threads of one client (world 1) run barriers and all-reduces on
  // their own buffers; the daemon is killed and started again under them.
  // Each thread's next op after a failure works; the client reconnected
  // once, not once per thread, and every buffer kept its id and memory.
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  ClientOptions o = Options(d.socket(), "threads", 0);
  o.world_size = 1;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  Client& client = **c;
  auto g = client.NewGroup({0});
  ASSERT_TRUE(g.ok()) << g.status();
  constexpr int kThreads = 4;
  std::atomic<int> progress[kThreads] = {0, 0, 0, 0};  // ops each thread completed
  std::atomic<bool> stop{false};
  std::vector<absl::Status> errors(kThreads);
  std::vector<int> done_after(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto b = client.AllocateBuffer(64);
      if (!b.ok()) {
        errors[t] = b.status();
        return;
      }
      auto* v = static_cast<float*>(b->data);
      int restarted_ops = 0;
      bool failed_once = false;
      while (!stop.load() || restarted_ops < 20) {
        for (int i = 0; i < 16; ++i) v[i] = float(t);
        absl::StatusOr<Work> w = client.AllReduce(*g, {b->id, 0}, {b->id, 0}, 16,
                                                  DataType::kFloat32);
        const absl::Status s = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
        if (absl::IsUnavailable(s) && !failed_once) {
          failed_once = true;  // in flight when the daemon died
          continue;
        }
        if (!s.ok() || v[0] != float(t) || v[15] != float(t)) {
          errors[t] = s.ok() ? absl::DataLossError("wrong result") : s;
          return;
        }
        progress[t].fetch_add(1);
        if (stop.load()) ++restarted_ops;
      }
      done_after[t] = restarted_ops;
      if (b->id != client.GetBuffer(b->id)->id || client.GetBuffer(b->id)->data != b->data) {
        errors[t] = absl::DataLossError("the buffer changed");
      }
    });
  }
  // Every thread has its buffer and ran ops before the daemon dies (small
  // ops in the arena are fast: one thread alone can make hundreds while
  // another is still registering its buffer).
  ASSERT_TRUE(testing::Eventually(
      [&] {
        for (const auto& p : progress) {
          if (p.load() < 50) return false;
        }
        return true;
      },
      20000));
  d.Kill();
  ASSERT_TRUE(d.Start()) << d.Log();
  stop = true;
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(errors[t].ok()) << t << ": " << errors[t];
    EXPECT_EQ(done_after[t], 20) << t;
  }
  EXPECT_EQ(client.reconnects(), 1u);
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// RSS a daemon may keep after churn: allocator pages, not state per session.
// Under AddressSanitizer its quarantine keeps freed memory resident (18 MiB
// after this test's churn in CI), so the bound is wider there.
#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kRssSlackKiB = 64 * 1024;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr int64_t kRssSlackKiB = 64 * 1024;
#else
constexpr int64_t kRssSlackKiB = 16 * 1024;
#endif
#else
constexpr int64_t kRssSlackKiB = 16 * 1024;
#endif

TEST(ReconnectTest, AFloodOfReconnectsLeavesTheDaemonAsItWasAndAnImpostorChangesNothing) {
  // Eight clients (four jobs of two ranks) reconnect at once after a
  // restart, 11 times over (SIGKILL and start again each time). Meanwhile an
  // impostor attaching as a rank that already re-attached is refused
  // (ALREADY_EXISTS) and the others never notice. Then, on one daemon, the
  // trainers come and go 20 times: its fds, sessions and RSS end where they
  // were.
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  std::vector<std::unique_ptr<Client>> clients;
  std::vector<Group> groups;
  std::vector<Buffer> buffers;
  for (int job = 0; job < 4; ++job) {
    for (int r = 0; r < 2; ++r) {
      auto c = Client::Connect(Options(d.socket(), "flood-" + std::to_string(job), r));
      ASSERT_TRUE(c.ok()) << c.status();
      clients.push_back(std::move(*c));
    }
  }
  for (auto& c : clients) {
    auto b = c->AllocateBuffer(1024);
    auto g = c->NewGroup({0, 1});
    ASSERT_TRUE(b.ok() && g.ok());
    buffers.push_back(*b);
    groups.push_back(*g);
  }
  // One op per client, both ranks of a job at once; true when all match.
  auto round = [&](bool expect_ok) {
    std::vector<std::thread> ts;
    std::atomic<int> ok{0};
    for (size_t i = 0; i < clients.size(); ++i) {
      ts.emplace_back([&, i] {
        for (int attempt = 0; attempt < 2; ++attempt) {  // the first may meet the dead daemon
          auto* v = static_cast<float*>(buffers[i].data);
          v[0] = 1.0f;
          absl::StatusOr<Work> w = clients[i]->AllReduce(groups[i], {buffers[i].id, 0},
                                                         {buffers[i].id, 0}, 1,
                                                         DataType::kFloat32);
          const absl::Status s = w.ok() ? w->Wait(absl::Seconds(30)) : w.status();
          if (s.ok() && v[0] == 2.0f) {
            ok.fetch_add(1);
            return;
          }
          if (!absl::IsUnavailable(s) || expect_ok) return;
        }
      });
    }
    for (auto& t : ts) t.join();
    return ok.load() == static_cast<int>(clients.size());
  };
  ASSERT_TRUE(round(true));
  d.Kill();
  ASSERT_TRUE(d.Start()) << d.Log();
  ASSERT_TRUE(round(false));  // everyone reconnected
  for (int i = 0; i < 10; ++i) {
    d.Kill();
    ASSERT_TRUE(d.Start()) << d.Log();
    ASSERT_TRUE(round(false)) << "restart " << i;
    // The impostor: rank 1 of job flood-0, which just re-attached.
    auto impostor = Client::Connect(Options(d.socket(), "flood-0", 1));
    ASSERT_FALSE(impostor.ok());
    EXPECT_EQ(impostor.status().code(), absl::StatusCode::kAlreadyExists) << impostor.status();
    ASSERT_TRUE(round(true)) << "after the impostor, restart " << i;
  }
  for (const auto& c : clients) EXPECT_EQ(c->reconnects(), 11u);
  EXPECT_EQ(testing::CountSessions(d.socket()), 8);
  // On this one daemon: every trainer goes and comes back 20 times (a new
  // session each time, as a restarted trainer's); then its fds, sessions and
  // RSS are where they were (RSS within 16 MiB: allocator pages, not state
  // per session).
  const int fds0 = testing::CountOpenFds(d.pid());
  const int64_t rss0 = RssKiB(d.pid());
  for (int cycle = 0; cycle < 20; ++cycle) {
    for (size_t i = 0; i < clients.size(); ++i) {
      const ClientOptions o = clients[i]->options();
      clients[i].reset();  // detaches
      auto c = Client::Connect(o);
      ASSERT_TRUE(c.ok()) << c.status();
      clients[i] = std::move(*c);
      auto b = clients[i]->AllocateBuffer(1024);
      auto g = clients[i]->NewGroup({0, 1});
      ASSERT_TRUE(b.ok() && g.ok());
      buffers[i] = *b;
      groups[i] = *g;
    }
    ASSERT_TRUE(round(true)) << "cycle " << cycle;
  }
  EXPECT_EQ(testing::CountSessions(d.socket()), 8);
  // (A dropped client's gRPC connection closes on the daemon's side a moment later.)
  EXPECT_TRUE(
      testing::Eventually([&] { return testing::CountOpenFds(d.pid()) == fds0; }, 5000))
      << testing::CountOpenFds(d.pid()) << " fds, " << fds0 << " before";
  EXPECT_LT(RssKiB(d.pid()) - rss0, kRssSlackKiB);
  clients.clear();  // detach
  EXPECT_TRUE(testing::Eventually([&] { return testing::CountSessions(d.socket()) == 0; }, 10000));
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

// Sends a data-connection hello naming (session, token); the daemon's reply
// code (0: accepted) and message.
std::pair<int, std::string> Hello(const std::string& socket, uint64_t session,
                                  const std::string& token) {
  auto conn = ConnectUnix(socket);
  if (!conn.ok()) return {-1, conn.status().ToString()};
  shm::DataHello hello{};
  std::memcpy(hello.magic, shm::kDataHelloMagic, sizeof(hello.magic));
  hello.version = shm::kLayoutVersion;
  hello.session_id = session;
  std::memcpy(hello.token, token.data(), std::min(token.size(), sizeof(hello.token)));
  if (!SendWithFds(conn->get(), &hello, sizeof(hello), {}).ok()) return {-1, "send"};
  shm::DataHelloReply reply{};
  std::vector<UniqueFd> fds;
  if (!RecvWithFds(conn->get(), &reply, sizeof(reply), &fds, 10000).ok()) return {-1, "recv"};
  return {static_cast<int>(reply.code),
          std::string(reply.message, std::min<size_t>(reply.message_len, sizeof(reply.message)))};
}

TEST(ReconnectTest, AStaleSessionTokenOrAnotherSessionsIsRefusedAndChangesNothing) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  // A session attached (not yet claimed) before the restart: its id and token.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto stub = v1::Node::NewStub(
      grpc::CreateCustomChannel("unix:" + d.socket(), grpc::InsecureChannelCredentials(), args));
  v1::AttachResponse old;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Attach(&ctx, testing::RawAttachRequest("stale", 0, 1), &old).ok());
  }
  d.Kill();
  ASSERT_TRUE(d.Start()) << d.Log();
  // A live client on the new daemon.
  ClientOptions o = Options(d.socket(), "live", 0);
  o.world_size = 1;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto g = (*c)->NewGroup({0});
  ASSERT_TRUE(g.ok());
  // The old session's token on the new daemon: refused.
  auto [code, message] = Hello(d.socket(), old.session_id(), old.session_token());
  EXPECT_NE(code, 0) << message;
  // The live session's id with the stale token: refused, and the live
  // session goes on.
  auto [code2, message2] = Hello(d.socket(), (*c)->session_id(), old.session_token());
  EXPECT_EQ(code2, static_cast<int>(absl::StatusCode::kPermissionDenied)) << message2;
  EXPECT_THAT(message2, HasSubstr("token"));
  ASSERT_TRUE((*c)->Barrier(*g)->Wait(absl::Seconds(10)).ok());
  EXPECT_EQ((*c)->reconnects(), 0u);
  EXPECT_EQ(testing::CountSessions(d.socket()), 1);
}

TEST(ReconnectTest, AnotherUsersProcessOnTheSocketGetsNoBuffers) {
  // While hsdpd is down, another user's process takes its socket path (here:
  // an hsdpd run as nobody, once the directory became nobody's). The client
  // does not reconnect to it: its memory (memfds) goes only to a daemon of
  // the uid it first connected to.
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (to run a daemon as nobody)";
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  ClientOptions o = Options(d.socket(), "impostor", 0);
  o.world_size = 1;
  o.reconnect_timeout = absl::Seconds(10);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto x = (*c)->AllocateBuffer(4096);
  auto g = (*c)->NewGroup({0});
  ASSERT_TRUE(x.ok() && g.ok());
  ASSERT_TRUE((*c)->Barrier(*g)->Wait(absl::Seconds(10)).ok());
  d.Kill();
  ::unlink(d.socket().c_str());
  ::unlink((d.socket() + ".lock").c_str());
  ASSERT_EQ(::chown(dir.path().c_str(), 65534, 65534), 0);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string log = dir.File("impostor.log");
  const pid_t impostor = ::fork();
  if (impostor == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(90);
    const std::string bin = testing::BinDir() + "/hsdpd";
    const std::string sock = d.socket();
    ::execl(bin.c_str(), bin.c_str(), "--socket", sock.c_str(), "--log-level", "info",
            static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_TRUE(testing::Eventually([&] { return ConnectUnix(d.socket()).ok(); }, 10000))
      << testing::ReadFile(log);
  absl::StatusOr<Work> w = (*c)->Barrier(*g);
  absl::Status s = w.ok() ? w->Wait(absl::Seconds(10)) : w.status();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;  // the op in flight
  w = (*c)->Barrier(*g);
  s = w.ok() ? w->Wait(absl::Seconds(10)) : w.status();
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("runs as uid 65534"),
                                               HasSubstr("hsdpd ran as uid 0")));
  // It was not even told who is asking: no Attach reached it.
  EXPECT_THAT(testing::ReadFile(log), ::testing::Not(HasSubstr("\"impostor\"")))
      << testing::ReadFile(log);
  EXPECT_EQ((*c)->reconnects(), 0u);
  // The impostor holds no session of this client (its attach there ended
  // before any buffer was sent).
  EXPECT_TRUE(testing::Eventually([&] { return testing::CountSessions(d.socket()) == 0; }, 5000))
      << testing::CountSessions(d.socket()) << " sessions";
  ::kill(impostor, SIGKILL);
  testing::WaitExit(impostor, 5000);
}

TEST(ReconnectTest, WithoutReconnectTheClientStaysFailed) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  ClientOptions o = Options(d.socket(), "no-reconnect", 0);
  o.world_size = 1;
  o.reconnect = false;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto x = (*c)->AllocateBuffer(16);
  auto g = (*c)->NewGroup({0});
  ASSERT_TRUE(x.ok() && g.ok());
  ASSERT_TRUE((*c)->AllReduce(*g, {x->id, 0}, {x->id, 0}, 4, DataType::kFloat32)->Wait().ok());
  // While the session is fine, Reconnect() does nothing.
  ASSERT_TRUE((*c)->Reconnect().ok());
  EXPECT_EQ((*c)->reconnects(), 0u);
  d.Kill();
  ASSERT_TRUE(d.Start()) << d.Log();
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<Work> w = (*c)->AllReduce(*g, {x->id, 0}, {x->id, 0}, 4, DataType::kFloat32);
    const absl::Status s = w.ok() ? w->Wait(absl::Seconds(10)) : w.status();
    EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  }
  EXPECT_EQ((*c)->reconnects(), 0u);
  // Asked for explicitly, it works.
  ASSERT_TRUE((*c)->Reconnect().ok());
  EXPECT_EQ((*c)->reconnects(), 1u);
  ASSERT_TRUE((*c)->AllReduce(*g, {x->id, 0}, {x->id, 0}, 4, DataType::kFloat32)->Wait().ok());
}

TEST(ReconnectTest, ADaemonThatDoesNotComeBackIsReportedAfterTheTimeout) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  ClientOptions o = Options(d.socket(), "gone", 0);
  o.world_size = 1;
  o.reconnect_timeout = absl::Milliseconds(300);
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto g = (*c)->NewGroup({0});
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*c)->Barrier(*g)->Wait().ok());
  d.Kill();
  absl::StatusOr<Work> w = (*c)->Barrier(*g);
  absl::Status s = w.ok() ? w->Wait(absl::Seconds(10)) : w.status();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;  // the op in flight
  w = (*c)->Barrier(*g);  // reconnects, and gives up after 300 ms
  s = w.ok() ? w->Wait(absl::Seconds(10)) : w.status();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("did not take this client back within"));
  EXPECT_EQ((*c)->reconnects(), 0u);
}

}  // namespace
}  // namespace hsdp
