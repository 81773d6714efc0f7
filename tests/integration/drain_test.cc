// hsdpctl drain and SIGHUP through a real hsdpd. Drain: the daemon
// stops taking new work, lets the operations in flight finish (or fails them
// after the timeout), tells its sessions why and exits 0, so a service
// manager starts the new binary; attaching during the drain is refused with a
// clear error; only root or the daemon's uid may drain it. SIGHUP: the
// reloadable keys apply at once, the others are named as needing a restart,
// an invalid file changes nothing.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hardening_util.h"
#include "hsdp/client.h"
#include "observability_util.h"

namespace hsdp {
namespace {

using testing::Child;
using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::Workload;

// Runs `hsdpctl --socket SOCKET ARGS...` as uid 65534 (no gRPC in the forked
// child: it execs); its output goes to `out` (a file it may write, or
// /dev/null). Returns its exit code.
int HsdpctlAsNobody(const std::string& socket, const std::vector<std::string>& args,
                    const std::string& out) {
  const std::string ctl = testing::BinDir() + "/hsdpctl";
  std::vector<std::string> argv = {ctl, "--socket", socket};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::RunAsNobody([&] {
    const int fd = ::open(out.c_str(), O_WRONLY | O_APPEND);
    if (fd < 0) return 98;
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> a;
    for (const std::string& x : argv) a.push_back(const_cast<char*>(x.c_str()));
    a.push_back(nullptr);
    ::execv(a[0], a.data());
    return 127;
  });
}

TEST(DrainTest, ADrainWithNothingInFlightExitsZeroAndTellsTheSessions) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  Workload w;
  w.socket = d.socket();
  w.job = "drain-idle";
  w.all_reduces = 5;
  w.hold_file = dir.File("release");
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(testing::RunWorkload(w, &ranks, &why)) << why << d.Log();

  const auto r = testing::RunCommand(testing::Hsdpctl(d.socket(), "drain --timeout 10"));
  EXPECT_EQ(r.exit_code, 0) << r.output << d.Log();
  EXPECT_THAT(r.output, HasSubstr("is draining: 2 sessions, 0 operations in flight"));
  EXPECT_THAT(r.output, HasSubstr("hsdpd stopped"));
  EXPECT_EQ(d.WaitForExit(5000), 0) << d.Log();
  EXPECT_THAT(d.Log(), HasSubstr("drained: no operation in flight"));
  testing::WriteFile(dir.File("release"), "");
  for (auto& c : ranks) EXPECT_EQ(c->Finish(20000), 0) << c->output();
}

TEST(DrainTest, OpsStillInFlightAfterTheTimeoutFailAndAttachIsRefusedMeanwhile) {
  TempDir dir;
  DaemonProcess d(dir);
  // Through the daemon: what a drain does with operations in its rings.
  ASSERT_TRUE(d.Start(testing::kDaemonPathOnly)) << d.Log();
  // Rank 0 submits at once; rank 1 only after 4 s: rank 0's op stays in
  // flight through a 1.5 s drain.
  Workload w;
  w.socket = d.socket();
  w.job = "drain-busy";
  w.all_reduces = 1;
  w.slow_rank = 1;
  w.delay_ms = 4000;
  std::vector<std::unique_ptr<Child>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<Child>([w, r](FILE* out) { return testing::RunRank(w, r, out); }));
  }
  ASSERT_TRUE(testing::Eventually([&] { return testing::CountSessions(d.socket()) == 2; }, 10000))
      << d.Log();
  // Rank 0's operation is in the daemon.
  ASSERT_TRUE(testing::Eventually([&] { return testing::OpsInDaemon(d.socket(), w.job) >= 1; },
                                  10000))
      << d.Log();

  testing::CommandResult drained;
  std::thread drain([&] {
    drained = testing::RunCommand(testing::Hsdpctl(d.socket(), "drain --timeout 1.5"));
  });
  // While it drains (health NOT_SERVING): a new attach is refused, naming the drain.
  ASSERT_TRUE(testing::Eventually(
      [&] { return testing::RunCommand(testing::Hsdpctl(d.socket(), "health")).exit_code == 1; },
      1000));
  ClientOptions o;
  o.socket_path = d.socket();
  o.job_id = "late";
  absl::StatusOr<std::unique_ptr<Client>> late = Client::Connect(o);
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("draining"));
  drain.join();
  EXPECT_EQ(drained.exit_code, 0) << drained.output << d.Log();
  EXPECT_THAT(drained.output, HasSubstr("1 operations in flight"));
  EXPECT_EQ(d.WaitForExit(5000), 0) << d.Log();
  EXPECT_THAT(d.Log(), HasSubstr("drain timed out"));
  // Rank 0's operation failed with the reason, not a hang.
  EXPECT_EQ(ranks[0]->Finish(20000), 1);
  EXPECT_THAT(ranks[0]->output(), HasSubstr("FAIL all_reduce 0"));
  EXPECT_THAT(ranks[0]->output(), HasSubstr("drained for a restart"));
  EXPECT_NE(ranks[1]->Finish(20000), 0);  // its daemon is gone
}

TEST(DrainTest, OnlyRootOrTheDaemonsUidMayDrain) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);  // other users may reach the socket
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("node:\n  socket_mode: 0666\n  allowed_uids: [0, 65534]\n")) << d.Log();
  const std::string out = dir.File("nobody.out");
  testing::WriteFile(out, "");
  ASSERT_EQ(::chmod(out.c_str(), 0666), 0);
  EXPECT_EQ(HsdpctlAsNobody(d.socket(), {"drain", "--timeout", "1"}, out), 1) << d.Log();
  EXPECT_TRUE(d.Alive());
  EXPECT_THAT(testing::ReadFile(out), HasSubstr("only root or hsdpd's own uid may drain it"));
  EXPECT_THAT(d.Log(), ::testing::Not(HasSubstr("drain requested")));
  EXPECT_EQ(d.Stop(), 0);
}

TEST(DrainTest, ATimeoutOutsideItsRangeIsRefused) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start()) << d.Log();
  const auto r = testing::RunCommand(testing::Hsdpctl(d.socket(), "drain --timeout 7200"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("timeout_seconds"));
  EXPECT_TRUE(d.Alive());
  EXPECT_EQ(d.Stop(), 0);
}

TEST(ReloadTest, SighupAppliesAllowedUidsNamesWhatNeedsARestartAndKeepsAnInvalidFileOut) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("node:\n  socket_mode: 0666\n")) << d.Log();
  const std::string sock = d.socket();
  auto status_as_nobody = [&] { return HsdpctlAsNobody(sock, {"status"}, "/dev/null"); };
  EXPECT_EQ(status_as_nobody(), 1) << "65534 is not allowed yet";

  testing::WriteFile(dir.File("node.yaml"),
                     "node:\n  socket_mode: 0666\n  allowed_uids: [0, 65534]\n"
                     "data_plane:\n  ring_entries: 2048\n");
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(testing::Eventually(
      [&] { return d.Log().find("SIGHUP: reloaded") != std::string::npos; }, 5000))
      << d.Log();
  EXPECT_THAT(d.Log(), HasSubstr("applied [node.allowed_uids]; needs a restart "
                                 "[data_plane.ring_entries]"));
  EXPECT_EQ(status_as_nobody(), 0) << d.Log();
  const auto config = testing::RunCommand(testing::Hsdpctl(sock, "config"));
  EXPECT_THAT(config.output, HasSubstr("allowed_uids: [0, 65534]"));
  EXPECT_THAT(config.output, HasSubstr("ring_entries: 1024")) << "needs a restart: unchanged";

  // An invalid file: nothing changes, the daemon goes on.
  testing::WriteFile(dir.File("node.yaml"), "node:\n  allowed_uids: [0]\n  bogus: 1\n");
  ASSERT_EQ(::kill(d.pid(), SIGHUP), 0);
  ASSERT_TRUE(testing::Eventually(
      [&] { return d.Log().find("is invalid, nothing changed") != std::string::npos; }, 5000))
      << d.Log();
  EXPECT_EQ(status_as_nobody(), 0) << "65534 is still allowed";
  EXPECT_TRUE(d.Alive());
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace hsdp
