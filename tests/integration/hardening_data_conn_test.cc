// Data connections cannot hold the daemon hostage: a hello sent a byte at a
// time delays nobody else (attaches and hang-ups are served at once), an
// incomplete hello is closed at timeouts.hello_ms, and only memfds may be
// passed: a client handing back its own data connection (an SCM_RIGHTS
// cycle that kept its session alive forever) or a pipe ends its session at
// once, as does a message carrying too many fds.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "common/send_fds.h"  // SendFdsRaw
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hardening_util.h"
#include "test_util.h"

namespace hsdp {
namespace {

using testing::AttachOnly;
using testing::Child;
using testing::ClosedWithin;
using testing::ConnectAndSend;
using testing::CountOpenFds;
using testing::CountSessions;
using testing::DaemonProcess;
using testing::Eventually;
using ::testing::HasSubstr;
using testing::NowMs;
using testing::OpenDataConnection;
using testing::RawAttach;
using testing::SettledFdCount;
using testing::TempDir;

// Sends FdMessage{tag} with `fds` attached in one sendmsg (no limit on the
// count, unlike SendWithFds).
bool SendFdMessage(int conn, uint64_t tag, const std::vector<int>& fds) {
  const shm::FdMessage msg{shm::kFdMessageMagic, 0, tag};
  return testing::SendFdsRaw(conn, &msg, sizeof(msg), fds) == static_cast<ssize_t>(sizeof(msg));
}

// A child that attaches as `job`, opens its data connection, runs `then`
// with it and, if that returns, sleeps until killed.
std::unique_ptr<Child> AttachedChild(const std::string& socket, const std::string& job,
                                     const std::function<void(int conn, FILE* out)>& then) {
  return std::make_unique<Child>([=](FILE* out) {
    const int64_t start = NowMs();
    absl::StatusOr<RawAttach> a = AttachOnly(socket, job);
    if (!a.ok()) {
      std::fprintf(out, "attach failed: %s\n", a.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<UniqueFd> conn = OpenDataConnection(socket, *a);
    if (!conn.ok()) {
      std::fprintf(out, "hello failed: %s\n", conn.status().ToString().c_str());
      return 1;
    }
    std::fprintf(out, "attached in %lld ms\n", static_cast<long long>(NowMs() - start));
    then(conn->get(), out);
    ::pause();
    return 0;
  });
}

TEST(HardeningDataConnTest, SlowHelloDelaysNobody) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  const int fds = SettledFdCount(d.pid(), d.socket());
  // A client that sends its hello one byte every 200 ms.
  UniqueFd slow = ConnectAndSend(d.socket(), "HSDPDAT1");
  ASSERT_TRUE(slow.valid());
  std::atomic<bool> stop{false};
  std::atomic<int> sent{0};
  std::thread trickle([&] {
    for (int i = 0; i < 25 && !stop.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      if (::send(slow.get(), "x", 1, MSG_NOSIGNAL) != 1) break;
      ++sent;
    }
  });
  // The daemon holds the trickling connection (one fd more) and its hello
  // is under way before the other client attaches.
  EXPECT_TRUE(Eventually([&] { return CountOpenFds(d.pid()) > fds && sent.load() >= 1; }, 5000))
      << "fds " << CountOpenFds(d.pid()) << " (" << fds << " before), bytes sent " << sent.load();

  std::unique_ptr<Child> c =
      AttachedChild(d.socket(), "slowjob", [](int, FILE* out) { std::fprintf(out, "ready\n"); });
  const bool ready = c->WaitFor("ready", 10000);
  stop = true;
  trickle.join();
  ASSERT_TRUE(ready) << c->output() << d.Log();
  int ms = -1;
  ASSERT_EQ(std::sscanf(c->output().c_str(), "attached in %d ms", &ms), 1) << c->output();
  EXPECT_LT(ms, 1500) << "another connection's slow hello held up this attach";

  // A killed client's session ends promptly too.
  ASSERT_EQ(CountSessions(d.socket(), "slowjob"), 1);
  c->Kill();
  const int64_t killed = NowMs();
  EXPECT_TRUE(Eventually([&] { return CountSessions(d.socket(), "slowjob") == 0; }, 5000));
  EXPECT_LT(NowMs() - killed, 1500) << d.Log();
}

TEST(HardeningDataConnTest, IncompleteHelloIsClosedAtTheDeadline) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  hello_ms: 500\n")) << d.Log();
  const int64_t start = NowMs();
  UniqueFd partial = ConnectAndSend(d.socket(), "HSDPDAT1" + std::string(10, '\0'));
  ASSERT_TRUE(partial.valid());
  EXPECT_TRUE(ClosedWithin(partial.get(), 3000));
  EXPECT_GE(NowMs() - start, 400);
  EXPECT_THAT(d.Log(), HasSubstr("timeouts.hello_ms"));
}

TEST(HardeningDataConnTest, PassingItsOwnDataConnectionBackEndsTheSession) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  // The client passes its data connection to the daemon and exits. Were the
  // daemon to keep that fd, the connection would never see EOF and the
  // session would outlive the process.
  std::unique_ptr<Child> c = AttachedChild(d.socket(), "cycle", [](int conn, FILE* out) {
    std::fprintf(out, SendFdMessage(conn, 1, {conn}) ? "sent\n" : "send failed\n");
    std::fflush(out);
    _exit(0);
  });
  EXPECT_EQ(c->Finish(10000), 0) << c->output();
  ASSERT_THAT(c->output(), HasSubstr("sent"));
  EXPECT_TRUE(Eventually([&] { return CountSessions(d.socket(), "cycle") == 0; }, 3000))
      << "the session outlived its process\n"
      << d.Log();
  EXPECT_THAT(d.Log(), HasSubstr("passed a socket where only memfds are accepted"));
}

TEST(HardeningDataConnTest, PipeInsteadOfMemfdEndsTheSessionAtOnce) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  std::unique_ptr<Child> c = AttachedChild(d.socket(), "piper", [](int conn, FILE* out) {
    int p[2];
    if (::pipe(p) != 0) return;
    std::fprintf(out, SendFdMessage(conn, 1, {p[0]}) ? "sent\n" : "send failed\n");
  });
  ASSERT_TRUE(c->WaitFor("sent", 10000)) << c->output();
  // The client is still alive: the daemon ended the session itself.
  EXPECT_TRUE(Eventually([&] { return CountSessions(d.socket(), "piper") == 0; }, 3000)) << d.Log();
  EXPECT_THAT(d.Log(), HasSubstr("passed a pipe"));
}

TEST(HardeningDataConnTest, TooManyFdsInOneMessageAreAllClosed) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  const int baseline_fds = testing::SettledFdCount(d.pid(), d.socket());
  std::unique_ptr<Child> c = AttachedChild(d.socket(), "flood", [](int conn, FILE* out) {
    std::vector<int> fds;
    for (int i = 0; i < 12; ++i) fds.push_back(::memfd_create("x", MFD_CLOEXEC));
    std::fprintf(out, SendFdMessage(conn, 1, fds) ? "sent\n" : "send failed\n");
  });
  ASSERT_TRUE(c->WaitFor("sent", 10000)) << c->output();
  EXPECT_TRUE(Eventually([&] { return CountSessions(d.socket(), "flood") == 0; }, 3000)) << d.Log();
  // Nothing the client sent stays open in the daemon (MSG_CTRUNC: all closed).
  EXPECT_TRUE(Eventually([&] { return testing::CountOpenFds(d.pid()) <= baseline_fds; }, 3000))
      << testing::CountOpenFds(d.pid()) << " fds open, " << baseline_fds << " before";
}

}  // namespace
}  // namespace hsdp
