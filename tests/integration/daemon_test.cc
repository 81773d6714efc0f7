// A real hsdpd subprocess: health and hsdpctl, attach/detach, attach errors,
// permissions, limits, shutdown, single-instance lock, stale sockets,
// sd_notify, and cleanup after a SIGKILLed trainer.
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <future>
#include <thread>

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
using testing::CommandResult;
using testing::CountSessions;
using testing::DaemonProcess;
using testing::Eventually;
using testing::Exists;
using testing::Hsdpctl;
using testing::NowMs;
using testing::QueryStatus;
using testing::RunCommand;
using testing::TempDir;

ClientOptions Opts(const DaemonProcess& d, const std::string& job, int rank, int world) {
  ClientOptions o;
  o.socket_path = d.socket();
  o.job_id = job;
  o.rank = rank;
  o.world_size = world;
  o.connect_timeout = absl::Seconds(10);
  return o;
}

TEST(DaemonTest, HealthStatusSessionsAndConfigThroughHsdpctl) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  collective_ms: 1234\nnode:\n  name: it-node\n"))
      << d.Log();
  CommandResult h = RunCommand(Hsdpctl(d.socket(), "health"));
  EXPECT_EQ(h.exit_code, 0) << h.output;
  EXPECT_THAT(h.output, HasSubstr("SERVING"));

  CommandResult st = RunCommand(Hsdpctl(d.socket(), "status"));
  EXPECT_EQ(st.exit_code, 0) << st.output;
  EXPECT_THAT(st.output, AllOf(HasSubstr(d.socket()), HasSubstr("it-node"), HasSubstr("cpu"),
                               HasSubstr("retired groups 0")));

  v1::StatusResponse s;
  std::string err;
  ASSERT_TRUE(QueryStatus(d.socket(), &s, &err)) << err;
  EXPECT_EQ(s.socket_path(), d.socket());
  EXPECT_EQ(s.node_name(), "it-node");
  EXPECT_EQ(s.engine(), "cpu");
  EXPECT_GE(s.engine_threads(), 1);
  EXPECT_EQ(s.sessions_size(), 0);
  EXPECT_THAT(s.config_summary(), HasSubstr("collective_timeout_ms=1234"));

  CommandResult sess = RunCommand(Hsdpctl(d.socket(), "--json sessions"));
  EXPECT_EQ(sess.exit_code, 0) << sess.output;
  EXPECT_THAT(sess.output, HasSubstr("\"sessions\""));

  // The effective config is valid input for --check-config and carries our value.
  CommandResult cfg = RunCommand(Hsdpctl(d.socket(), "config"));
  ASSERT_EQ(cfg.exit_code, 0) << cfg.output;
  EXPECT_THAT(cfg.output, HasSubstr("1234"));
  testing::WriteFile(dir.File("effective.yaml"), cfg.output);
  CommandResult check =
      RunCommand(testing::BinDir() + "/hsdpd --check-config " + dir.File("effective.yaml"));
  EXPECT_EQ(check.exit_code, 0) << check.output;
  CommandResult cfg_json = RunCommand(Hsdpctl(d.socket(), "--json config"));
  EXPECT_EQ(cfg_json.exit_code, 0);
  EXPECT_THAT(cfg_json.output, HasSubstr("\"yaml\""));
  EXPECT_EQ(d.Stop(), 0) << d.Log();
}

TEST(DaemonTest, AttachShowsInStatusAndDetachRemovesIt) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  auto c = Client::Connect(Opts(d, "attach-job", 1, 2));
  ASSERT_TRUE(c.ok()) << c.status();
  auto buf = (*c)->AllocateBuffer(8192, "weights");
  ASSERT_TRUE(buf.ok()) << buf.status();
  v1::StatusResponse s;
  ASSERT_TRUE(QueryStatus(d.socket(), &s));
  ASSERT_EQ(s.sessions_size(), 1);
  const v1::SessionInfo& si = s.sessions(0);
  EXPECT_EQ(si.session_id(), (*c)->session_id());
  EXPECT_EQ(si.job_id(), "attach-job");
  EXPECT_EQ(si.rank(), 1);
  EXPECT_EQ(si.world_size(), 2);
  EXPECT_EQ(si.pid(), ::getpid());
  EXPECT_EQ(si.peer_pid(), ::getpid());
  EXPECT_TRUE(si.data_connected());
  EXPECT_EQ(si.buffers(), 1u);
  EXPECT_EQ(si.buffer_bytes(), 8192u);
  ASSERT_EQ(s.jobs_size(), 1);
  EXPECT_EQ(s.jobs(0).attached_ranks(), 1);
  EXPECT_EQ(s.bytes_registered(), 8192u);

  ASSERT_TRUE((*c)->Detach().ok());
  EXPECT_EQ(CountSessions(d.socket()), 0);
  ASSERT_TRUE(QueryStatus(d.socket(), &s));
  EXPECT_EQ(s.jobs_size(), 0);
  EXPECT_EQ(s.bytes_registered(), 0u);
  // Work after detach fails on the client side.
  Group g{1, 0, 1, {1}};
  auto w = (*c)->Barrier(g);
  EXPECT_FALSE(w.ok() && w->Wait(absl::Seconds(2)).ok());

  // The same rank can attach again; destroying the Client detaches too.
  {
    auto again = Client::Connect(Opts(d, "attach-job", 1, 2));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(CountSessions(d.socket()), 1);
  }
  EXPECT_EQ(CountSessions(d.socket()), 0);
  c->reset();
  EXPECT_EQ(d.Stop(), 0);
}

// A client library from before the arena's settle word (arena version 2)
// offers the retired feature bit: hsdpd grants it nothing and gives its
// groups no arena (they run through the daemon), where it would otherwise
// hand it an arena it refuses. The current library's offer gets an arena.
TEST(DaemonTest, AClientOfTheRetiredArenaVersionGetsGroupsWithoutAnArena) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  testing::RawSession old_lib;
  ASSERT_TRUE(old_lib
                  .Open(d.socket(), "old-library", 0, 1,
                        shm::kFeatureEpochs | shm::kFeaturePointToPoint |
                            shm::kFeatureOpPriority | shm::kFeatureRetiredArenaV1)
                  .ok());
  EXPECT_EQ(old_lib.features() & (shm::kFeatureRetiredArenaV1 | shm::kFeatureSmallOpArena), 0u);
  auto g = old_lib.NewGroupReply({0});
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(g->arena_fd_tag(), 0u);
  EXPECT_EQ(g->arena_bytes(), 0u);
  testing::RawSession current;
  ASSERT_TRUE(current.Open(d.socket(), "current-library", 0, 1).ok());
  EXPECT_NE(current.features() & shm::kFeatureSmallOpArena, 0u);
  auto h = current.NewGroupReply({0});
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_NE(h->arena_fd_tag(), 0u);
  EXPECT_GT(h->arena_bytes(), 0u);
}

TEST(DaemonTest, AttachErrors) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  auto expect_error = [&](ClientOptions o, absl::StatusCode code, const std::string& field) {
    auto c = Client::Connect(o);
    ASSERT_FALSE(c.ok()) << "rank " << o.rank << " world " << o.world_size << " device " << o.device;
    EXPECT_EQ(c.status().code(), code) << c.status();
    EXPECT_THAT(std::string(c.status().message()), HasSubstr(field));
  };
  expect_error(Opts(d, "j", 2, 2), absl::StatusCode::kInvalidArgument, "rank");
  expect_error(Opts(d, "j", -1, 2), absl::StatusCode::kInvalidArgument, "rank");
  expect_error(Opts(d, "j", 0, 0), absl::StatusCode::kInvalidArgument, "world_size");
  {
    // The clients fill an empty job id in (DefaultJobId); the daemon itself
    // refuses one.
    testing::RawSession raw;
    const absl::Status empty = raw.Open(d.socket(), "", 0, 1);
    EXPECT_THAT(std::string(empty.message()), HasSubstr("job_id: must be 1 to 128 bytes"));
  }
  ClientOptions bad_dev = Opts(d, "j", 0, 2);
  for (const char* dev : {"gpu0", "cuda:", "cuda:x", ""}) {
    bad_dev.device = dev;
    expect_error(bad_dev, absl::StatusCode::kInvalidArgument, "device");
  }
  auto first = Client::Connect(Opts(d, "j", 0, 2));
  ASSERT_TRUE(first.ok()) << first.status();
  // World size mismatch within a job.
  expect_error(Opts(d, "j", 1, 3), absl::StatusCode::kInvalidArgument, "world_size");
  // Duplicate rank names the holder.
  auto dup = Client::Connect(Opts(d, "j", 0, 2));
  ASSERT_FALSE(dup.ok());
  EXPECT_EQ(dup.status().code(), absl::StatusCode::kAlreadyExists) << dup.status();
  EXPECT_THAT(std::string(dup.status().message()),
              AllOf(HasSubstr("rank 0"), HasSubstr(std::to_string(::getpid()))));
  // None of the failures left a session behind.
  EXPECT_EQ(CountSessions(d.socket()), 1);
  // Another job may reuse the rank; "cuda:N" is a valid device name.
  ClientOptions other = Opts(d, "k", 0, 2);
  other.device = "cuda:3";
  auto ok = Client::Connect(other);
  EXPECT_TRUE(ok.ok()) << ok.status();
  first->reset();
  if (ok.ok()) ok->reset();
  EXPECT_EQ(d.Stop(), 0);
}

TEST(DaemonTest, NoDaemonIsUnavailable) {
  TempDir dir;
  ClientOptions o;
  o.socket_path = dir.File("nobody.sock");
  o.connect_timeout = absl::Milliseconds(300);
  auto c = Client::Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr(o.socket_path));
}

TEST(DaemonTest, UidNotAllowedIsPermissionDenied) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("node:\n  allowed_uids: [12345]\n")) << d.Log();
  auto c = Client::Connect(Opts(d, "j", 0, 1));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kPermissionDenied) << c.status();
  EXPECT_THAT(std::string(c.status().message()),
              AllOf(HasSubstr("uid " + std::to_string(::getuid())), HasSubstr("allowed_uids")));
  CommandResult st = RunCommand(Hsdpctl(d.socket(), "status"));
  EXPECT_EQ(st.exit_code, 1) << st.output;
  EXPECT_THAT(st.output, HasSubstr("not allowed"));
  EXPECT_TRUE(d.Alive());
  EXPECT_EQ(d.Stop(), 0);
}

TEST(DaemonTest, SessionBufferLimitIsResourceExhausted) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("limits:\n  max_session_bytes: 1MiB\n  max_buffers_per_session: 3\n"))
      << d.Log();
  auto c = Client::Connect(Opts(d, "j", 0, 1));
  ASSERT_TRUE(c.ok()) << c.status();
  auto big = (*c)->AllocateBuffer(2 << 20);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted) << big.status();
  EXPECT_THAT(std::string(big.status().message()),
              AllOf(HasSubstr("2097152"), HasSubstr("1048576"), HasSubstr("max_session_bytes")));
  auto a = (*c)->AllocateBuffer(512 << 10);
  auto b = (*c)->AllocateBuffer(512 << 10);
  ASSERT_TRUE(a.ok() && b.ok());
  auto over = (*c)->AllocateBuffer(4096);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("max_session_bytes"));
  // Freeing makes room again; the buffer-count limit applies too.
  ASSERT_TRUE((*c)->FreeBuffer(a->id).ok());
  auto c1 = (*c)->AllocateBuffer(4096);
  auto c2 = (*c)->AllocateBuffer(4096);
  ASSERT_TRUE(c1.ok()) << c1.status();
  ASSERT_TRUE(c2.ok()) << c2.status();
  auto c3 = (*c)->AllocateBuffer(4096);
  ASSERT_FALSE(c3.ok());
  EXPECT_EQ(c3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(c3.status().message()), HasSubstr("max_buffers_per_session"));
  EXPECT_EQ((*c)->FreeBuffer(12345).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(RunCommand(Hsdpctl(d.socket(), "health")).exit_code, 0);
  c->reset();
  EXPECT_EQ(d.Stop(), 0);
}

TEST(DaemonTest, SigtermShutsDownCleanlyAndFailsPendingWork) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  auto c0 = Client::Connect(Opts(d, "j", 0, 2));
  auto c1 = Client::Connect(Opts(d, "j", 1, 2));
  ASSERT_TRUE(c0.ok() && c1.ok());
  auto g0 = (*c0)->NewGroup({0, 1});
  auto g1 = (*c1)->NewGroup({0, 1});
  ASSERT_TRUE(g0.ok() && g1.ok());
  auto buf = (*c0)->AllocateBuffer(4096);
  ASSERT_TRUE(buf.ok());
  // Rank 1 never submits: rank 0's all-reduce stays pending.
  auto w = (*c0)->AllReduce(*g0, {buf->id, 0}, {buf->id, 0}, 16, DataType::kFloat32);
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(w->Wait(absl::Milliseconds(200)).code(), absl::StatusCode::kDeadlineExceeded);
  auto waited = std::async(std::launch::async, [&] {
    absl::Status s = w->Wait(absl::Seconds(20));
    return std::make_pair(s, NowMs());
  });
  const int64_t t0 = NowMs();
  EXPECT_EQ(d.Stop(), 0) << d.Log();
  // Connected clients keep gRPC's shutdown waiting for timeouts.shutdown_grace_ms (5 s).
  EXPECT_LT(NowMs() - t0, 8000);
  auto [status, when] = waited.get();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_LT(when - t0, 2000) << "pending Wait must end promptly";
  EXPECT_FALSE(Exists(d.socket())) << "socket left behind";
  EXPECT_FALSE(Exists(d.socket() + ".lock")) << "lock file left behind";
}

TEST(DaemonTest, SecondInstanceOnTheSameSocketIsRefused) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  CommandResult second = RunCommand(testing::BinDir() + "/hsdpd --socket '" + d.socket() + "'");
  EXPECT_EQ(second.exit_code, 1) << second.output;
  EXPECT_THAT(second.output, HasSubstr("pid " + std::to_string(d.pid())));
  // The first one is unharmed and still owns its socket.
  EXPECT_EQ(RunCommand(Hsdpctl(d.socket(), "health")).exit_code, 0);
  EXPECT_EQ(d.Stop(), 0);
}

TEST(DaemonTest, StaleSocketFromAKilledDaemonIsReplaced) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  d.Kill();
  ASSERT_TRUE(Exists(d.socket())) << "SIGKILL leaves the socket file behind";
  DaemonProcess again(dir);
  ASSERT_TRUE(again.Start()) << again.Log();
  EXPECT_EQ(RunCommand(Hsdpctl(again.socket(), "health")).exit_code, 0);
  EXPECT_THAT(again.Log(), HasSubstr("stale"));
  auto c = Client::Connect(Opts(again, "j", 0, 1));
  EXPECT_TRUE(c.ok()) << c.status();
  c->reset();
  EXPECT_EQ(again.Stop(), 0);
}

TEST(DaemonTest, NotifySocketReceivesReady) {
  TempDir dir;
  const std::string path = dir.File("notify.sock");
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(fd.valid());
  struct sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("", {}, {"NOTIFY_SOCKET=" + path})) << d.Log();
  struct pollfd pfd{fd.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&pfd, 1, 10000), 1) << "no sd_notify datagram";
  char buf[512] = {0};
  const ssize_t n = ::recv(fd.get(), buf, sizeof(buf) - 1, 0);
  ASSERT_GT(n, 0);
  EXPECT_THAT(std::string(buf, n), AllOf(HasSubstr("READY=1"), HasSubstr(d.socket())));
  EXPECT_EQ(d.Stop(), 0);
  // STOPPING=1 on the way out.
  ASSERT_EQ(::poll(&pfd, 1, 5000), 1);
  const ssize_t m = ::recv(fd.get(), buf, sizeof(buf) - 1, 0);
  EXPECT_THAT(std::string(buf, std::max<ssize_t>(m, 0)), HasSubstr("STOPPING=1"));
}

// A trainer SIGKILLed while its peer waits on a collective: the session
// disappears from Status and the peer gets an error, not a hang.
TEST(DaemonTest, SigkilledClientIsCleanedUpAndPeerFails) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  auto body = [&](int rank) {
    return [&, rank](FILE* out) -> int {
      auto c = Client::Connect(Opts(d, "killjob", rank, 2));
      if (!c.ok()) {
        std::fprintf(out, "connect: %s\n", c.status().ToString().c_str());
        return 1;
      }
      auto g = (*c)->NewGroup({0, 1});
      auto buf = (*c)->AllocateBuffer(4096);
      if (!g.ok() || !buf.ok()) return 2;
      std::fprintf(out, "ready\n");
      if (rank == 1) {
        ::pause();  // killed here
        return 0;
      }
      auto w = (*c)->AllReduce(*g, {buf->id, 0}, {buf->id, 0}, 64, DataType::kFloat32);
      if (!w.ok()) return 3;
      std::fprintf(out, "submitted\n");
      const int64_t t0 = NowMs();
      absl::Status s = w->Wait(absl::Seconds(30));
      std::fprintf(out, "wait: %s after %lld ms\n", s.ToString().c_str(),
                   static_cast<long long>(NowMs() - t0));
      return s.ok() ? 4 : 0;
    };
  };
  Child r0(body(0));
  Child r1(body(1));
  ASSERT_TRUE(r1.WaitFor("ready", 15000)) << r1.output();
  ASSERT_TRUE(r0.WaitFor("submitted", 15000)) << r0.output();
  ASSERT_EQ(CountSessions(d.socket(), "killjob"), 2);
  r1.Kill(SIGKILL);
  EXPECT_EQ(r1.Finish(5000), 128 + SIGKILL);
  const int64_t t0 = NowMs();
  auto rank1_gone = [&] {
    v1::StatusResponse st;
    if (!QueryStatus(d.socket(), &st)) return false;
    for (const auto& s : st.sessions()) {
      if (s.job_id() == "killjob" && s.rank() == 1) return false;
    }
    return true;
  };
  EXPECT_TRUE(Eventually(rank1_gone, 2500)) << d.Log();
  EXPECT_LT(NowMs() - t0, 2500);
  EXPECT_EQ(r0.Finish(10000), 0) << r0.output();
  EXPECT_THAT(r0.output(), AllOf(HasSubstr("ABORTED"), HasSubstr("rank 1")));
  EXPECT_TRUE(Eventually([&] { return CountSessions(d.socket(), "killjob") == 0; }, 3000));
  EXPECT_TRUE(d.Alive());
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace hsdp
