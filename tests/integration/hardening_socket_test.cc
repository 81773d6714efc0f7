// The socket's directory and files cannot be turned against the daemon: a
// directory another user owns (with a planted lock-file symlink), a
// world-writable or symlinked directory, a regular file at the socket path
// (never deleted), and a socket swapped while running (not removed on stop).
// Run as root; the "other user" is uid 65534.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hardening_util.h"
#include "test_util.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using testing::CommandResult;
using testing::DaemonProcess;
using testing::Exists;
using ::testing::HasSubstr;
using testing::Hsdpctl;
using testing::ReadFile;
using testing::RunAsNobody;
using testing::RunCommand;
using testing::TempDir;
using testing::WriteFile;

// Runs hsdpd on `socket` expecting it to refuse to start; a daemon that does
// start is killed after 5 s (exit 124).
CommandResult StartExpectingRefusal(const std::string& socket) {
  return RunCommand("timeout -s KILL 5 " + testing::BinDir() + "/hsdpd --socket '" + socket + "'");
}

mode_t ModeOf(const std::string& path) {
  struct stat st{};
  ::lstat(path.c_str(), &st);
  return st.st_mode & 07777;
}

class HardeningSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user (uid 65534)";
    ASSERT_FALSE(dir_.path().empty());
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);  // let uid 65534 in
  }
  TempDir dir_;
};

TEST_F(HardeningSocketTest, PlantedLockSymlinkInAnotherUsersDirectoryIsRefused) {
  const std::string victim = dir_.File("victim");
  WriteFile(victim, "precious\n");
  const std::string d = dir_.File("d");
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  ASSERT_EQ(::chown(d.c_str(), testing::kNobody, testing::kNobody), 0);
  // The other user plants the lock file as a symlink to a root-owned file.
  ASSERT_EQ(
      RunAsNobody([&] { return ::symlink(victim.c_str(), (d + "/hsdpd.sock.lock").c_str()); }), 0);

  CommandResult r = StartExpectingRefusal(d + "/hsdpd.sock");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, AllOf(HasSubstr(d), HasSubstr("owned by uid 65534")));
  EXPECT_EQ(ReadFile(victim), "precious\n") << "the daemon wrote through the planted symlink";
  EXPECT_FALSE(Exists(d + "/hsdpd.sock"));
}

TEST_F(HardeningSocketTest, SharedWritableDirectoriesAreRefused) {
  for (const mode_t mode : {0777, 0770, 01777}) {
    const std::string d = dir_.File("w" + std::to_string(mode));
    ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
    ASSERT_EQ(::chmod(d.c_str(), mode), 0);
    CommandResult r = StartExpectingRefusal(d + "/hsdpd.sock");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_THAT(r.output, AllOf(HasSubstr(d), HasSubstr("writable by"))) << mode;
    EXPECT_FALSE(Exists(d + "/hsdpd.sock.lock")) << mode;
  }
  // /tmp itself (sticky, world-writable) is no place for root's socket.
  const std::string in_tmp = "/tmp/hsdpd-hardening-" + std::to_string(::getpid()) + ".sock";
  CommandResult r = StartExpectingRefusal(in_tmp);
  ::unlink(in_tmp.c_str());
  ::unlink((in_tmp + ".lock").c_str());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("writable by every user"));
}

TEST_F(HardeningSocketTest, SymlinkedDirectoryIsRefused) {
  const std::string real = dir_.File("real");
  ASSERT_EQ(::mkdir(real.c_str(), 0755), 0);
  const std::string link = dir_.File("link");
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0);
  CommandResult r = StartExpectingRefusal(link + "/hsdpd.sock");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("symbolic link"));
  EXPECT_FALSE(Exists(real + "/hsdpd.sock"));
}

TEST_F(HardeningSocketTest, MissingDirectoriesAreCreated0755EvenUnderUmask077) {
  const mode_t old_umask = ::umask(077);  // inherited by the daemon
  DaemonProcess d(dir_);
  const std::string socket = dir_.File("a/b/hsdpd.sock");
  ASSERT_TRUE(d.Start("", {"--socket", socket}, {}, /*wait_ready=*/false));
  ::umask(old_umask);
  ASSERT_TRUE(testing::Eventually([&] { return Exists(socket); }, 5000)) << d.Log();
  EXPECT_EQ(ModeOf(dir_.File("a")), 0755u);
  EXPECT_EQ(ModeOf(dir_.File("a/b")), 0755u);
  EXPECT_EQ(ModeOf(socket), 0660u);
  EXPECT_EQ(RunCommand(Hsdpctl(socket, "health")).exit_code, 0);
  EXPECT_EQ(d.Stop(), 0);
  EXPECT_FALSE(Exists(socket));
  EXPECT_FALSE(Exists(socket + ".lock"));
}

TEST_F(HardeningSocketTest, RegularFileAtTheSocketPathIsNeverDeleted) {
  const std::string socket = dir_.File("hsdpd.sock");
  WriteFile(socket, "not a socket\n");
  CommandResult r = StartExpectingRefusal(socket);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("refusing to replace it"));
  EXPECT_EQ(ReadFile(socket), "not a socket\n") << "the file was deleted";
}

TEST_F(HardeningSocketTest, FileSwappedInWhileRunningIsNotRemovedOnStop) {
  DaemonProcess d(dir_);
  ASSERT_TRUE(d.Start()) << d.Log();
  ASSERT_EQ(::unlink(d.socket().c_str()), 0);
  WriteFile(d.socket(), "someone else's\n");
  EXPECT_EQ(d.Stop(), 0);
  EXPECT_EQ(ReadFile(d.socket()), "someone else's\n")
      << "the daemon removed a file it did not create";
}

}  // namespace
}  // namespace hsdp
