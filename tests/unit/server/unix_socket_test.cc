// RecvSomeWithFds (non-blocking, fds stay with their bytes) and what both
// receive functions do with MSG_CTRUNC: every fd received is closed.
#include "hsdp/common/unix_socket.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/send_fds.h"  // SendFdsRaw
#include "gtest/gtest.h"

namespace hsdp {
namespace {

int OpenFds() {
  int n = 0;
  DIR* d = ::opendir("/proc/self/fd");
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

struct Pair {
  Pair() { ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fd); }
  ~Pair() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }
  int fd[2] = {-1, -1};
};

// Sends `len` bytes with `count` fresh memfds in one sendmsg.
void SendWithMemfds(int sock, const char* data, size_t len, int count) {
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) fds.push_back(::memfd_create("t", MFD_CLOEXEC));
  ASSERT_EQ(testing::SendFdsRaw(sock, data, len, fds), static_cast<ssize_t>(len));
  for (int f : fds) ::close(f);
}

TEST(RecvSomeWithFdsTest, NonBlockingPartialReadsKeepFdsWithTheirBytes) {
  Pair p;
  char buf[16];
  std::vector<UniqueFd> fds;
  absl::StatusOr<size_t> n = RecvSomeWithFds(p.fd[1], buf, sizeof(buf), &fds);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 0u);  // nothing yet: no wait

  SendWithMemfds(p.fd[0], "abcd", 4, 1);
  ASSERT_EQ(::send(p.fd[0], "efgh", 4, 0), 4);
  n = RecvSomeWithFds(p.fd[1], buf, 2, &fds);  // part of the first message
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  ASSERT_EQ(fds.size(), 1u);
  EXPECT_GE(::fcntl(fds[0].get(), F_GETFD) & FD_CLOEXEC, 1);
  n = RecvSomeWithFds(p.fd[1], buf, sizeof(buf), &fds);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(buf, *n), "cdefgh");
  EXPECT_EQ(fds.size(), 1u);

  ::close(p.fd[0]);
  p.fd[0] = -1;
  n = RecvSomeWithFds(p.fd[1], buf, sizeof(buf), &fds);
  EXPECT_TRUE(absl::IsUnavailable(n.status())) << n.status();
}

TEST(RecvSomeWithFdsTest, TooManyFdsAreAllClosed) {
  Pair p;
  const int before = OpenFds();
  SendWithMemfds(p.fd[0], "x", 1, kMaxFdsPerMessage + 4);
  char buf[4];
  std::vector<UniqueFd> fds;
  absl::StatusOr<size_t> n = RecvSomeWithFds(p.fd[1], buf, sizeof(buf), &fds);
  EXPECT_TRUE(absl::IsInvalidArgument(n.status())) << n.status();
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(OpenFds(), before);
}

TEST(RecvWithFdsTest, TooManyFdsAreAllClosed) {
  Pair p;
  const int before = OpenFds();
  SendWithMemfds(p.fd[0], "abcd", 4, kMaxFdsPerMessage + 1);
  char buf[4];
  std::vector<UniqueFd> fds;
  absl::Status s = RecvWithFds(p.fd[1], buf, sizeof(buf), &fds, 1000);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_TRUE(fds.empty());
  EXPECT_EQ(OpenFds(), before);
}

}  // namespace
}  // namespace hsdp
