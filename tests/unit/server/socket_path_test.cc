// DaemonDefaultSocketPath for root, and OpenTrustedDir's rules: components
// created 0755, no symlinks, owners root or us, no shared-writable directory.
#include "hsdp/common/socket_path.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;

class TrustedDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hsdp-trusted.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    const std::string cmd = "rm -rf '" + dir_ + "'";
    (void)std::system(cmd.c_str());
  }
  std::string Error(const std::string& path) {
    absl::StatusOr<UniqueFd> fd = OpenTrustedDir(path);
    EXPECT_FALSE(fd.ok()) << path;
    return std::string(fd.status().message());
  }
  std::string dir_;
};

mode_t ModeOf(const std::string& path) {
  struct stat st{};
  ::lstat(path.c_str(), &st);
  return st.st_mode & 07777;
}

TEST(SocketPathTest, RootAlwaysUsesTheSystemSocket) {
  if (::geteuid() != 0) GTEST_SKIP() << "checks root's choice";
  ::setenv("XDG_RUNTIME_DIR", "/tmp", 1);
  EXPECT_EQ(DaemonDefaultSocketPath(), "/run/hsdpd/hsdpd.sock");
  ::unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(DaemonDefaultSocketPath(), "/run/hsdpd/hsdpd.sock");
}

TEST_F(TrustedDirTest, ClientSkipsASocketInAnotherUsersDirectory) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  struct stat st;
  if (::lstat("/run/hsdpd/hsdpd.sock", &st) == 0) GTEST_SKIP() << "a system hsdpd is running";
  ::unsetenv("HSDPD_SOCKET");
  ::setenv("XDG_RUNTIME_DIR", dir_.c_str(), 1);
  const std::string d = dir_ + "/hsdpd";
  ASSERT_EQ(::mkdir(d.c_str(), 0755), 0);
  const std::string path = d + "/hsdpd.sock";
  UniqueFd sock(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  ASSERT_EQ(::bind(sock.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(ClientDefaultSocketPath(), path);  // ours: found
  ASSERT_EQ(::chown(d.c_str(), 65534, 65534), 0);
  EXPECT_NE(ClientDefaultSocketPath(), path) << "trusted a socket another user controls";
  ::unsetenv("XDG_RUNTIME_DIR");
}

TEST_F(TrustedDirTest, CreatesMissingComponents0755UnderAnyUmask) {
  const mode_t old = ::umask(077);
  absl::StatusOr<UniqueFd> fd = OpenTrustedDir(dir_ + "/a/b/c");
  ::umask(old);
  ASSERT_TRUE(fd.ok()) << fd.status();
  EXPECT_EQ(ModeOf(dir_ + "/a"), 0755u);
  EXPECT_EQ(ModeOf(dir_ + "/a/b/c"), 0755u);
  // The fd is the directory: files made through it land there.
  ASSERT_EQ(::mkdirat(fd->get(), "x", 0700), 0);
  EXPECT_EQ(ModeOf(dir_ + "/a/b/c/x"), 0700u);
  // An existing private directory (a mkdtemp one) is fine.
  EXPECT_TRUE(OpenTrustedDir(dir_).ok());
}

TEST_F(TrustedDirTest, RefusesSymlinksAnywhere) {
  ASSERT_EQ(::mkdir((dir_ + "/real").c_str(), 0755), 0);
  ASSERT_EQ(::symlink((dir_ + "/real").c_str(), (dir_ + "/link").c_str()), 0);
  EXPECT_THAT(Error(dir_ + "/link"), HasSubstr("symbolic link"));
  EXPECT_THAT(Error(dir_ + "/link/sub"), HasSubstr("symbolic link"));
  EXPECT_FALSE(::access((dir_ + "/real/sub").c_str(), F_OK) == 0);
}

TEST_F(TrustedDirTest, RefusesSharedWritableDirectories) {
  const std::string w = dir_ + "/w";
  ASSERT_EQ(::mkdir(w.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(w.c_str(), 0777), 0);
  EXPECT_THAT(Error(w), HasSubstr("writable by every user"));
  EXPECT_THAT(Error(w + "/below"), HasSubstr("without the sticky bit"));
  ASSERT_EQ(::chmod(w.c_str(), 0770), 0);
  EXPECT_THAT(Error(w), HasSubstr("writable by its group"));
  // Sticky like /tmp: fine on the way, never as the socket's directory.
  ASSERT_EQ(::chmod(w.c_str(), 01777), 0);
  EXPECT_TRUE(OpenTrustedDir(w + "/below").ok());
  EXPECT_THAT(Error(w), HasSubstr("mode 1777"));
}

TEST_F(TrustedDirTest, RefusesDirectoriesOfOtherUsers) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to chown";
  const std::string theirs = dir_ + "/theirs";
  ASSERT_EQ(::mkdir(theirs.c_str(), 0755), 0);
  ASSERT_EQ(::chown(theirs.c_str(), 65534, 65534), 0);
  EXPECT_THAT(Error(theirs), HasSubstr("owned by uid 65534"));
  EXPECT_THAT(Error(theirs + "/sub"), HasSubstr("owned by uid 65534"));
}

TEST_F(TrustedDirTest, RefusesRelativeAndDotDotPaths) {
  EXPECT_THAT(Error("tmp/x"), HasSubstr("not absolute"));
  EXPECT_THAT(Error(dir_ + "/../x"), HasSubstr("\"..\""));
}

}  // namespace
}  // namespace hsdp
