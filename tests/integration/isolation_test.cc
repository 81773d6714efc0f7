// Isolation between users and between sessions, against a real daemon:
// a job belongs to the uid that first attached it (other uids can neither
// join it, nor take its ranks, nor see it in status), and nothing one
// session can write in shared memory affects another session.
//
// The other users are real uids (setresuid in forked children), so these
// tests need root; they skip, saying so, otherwise.
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "raw_session.h"
#include "test_util.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::Child;
using testing::DaemonProcess;
using testing::RawSession;
using testing::RunCommand;
using testing::TempDir;

constexpr uid_t kAlice = 60001;
constexpr uid_t kMallory = 60002;

// Becomes `uid` (and gid) for good.
bool BecomeUser(uid_t uid) {
  return ::setgroups(0, nullptr) == 0 && ::setresgid(uid, uid, uid) == 0 &&
         ::setresuid(uid, uid, uid) == 0;
}

std::string MultiUserConfig() {
  return "node:\n  socket_mode: 0666\n  allowed_uids: [0, 60001, 60002]\n"
         "timeouts:\n  shutdown_grace_ms: 200\n";
}

TEST(IsolationTest, AJobBelongsToTheUidThatAttachedItFirst) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as two other users";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);  // other users may reach the socket
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(MultiUserConfig())) << d.Log();

  // Alice's trainer holds rank 0 of job "alpha".
  Child alice([&](FILE* out) {
    if (!BecomeUser(kAlice)) return 10;
    ClientOptions o;
    o.socket_path = d.socket();
    o.job_id = "alpha";
    o.rank = 0;
    o.world_size = 2;
    auto c = Client::Connect(o);
    if (!c.ok()) {
      std::fprintf(out, "attach failed: %s\n", std::string(c.status().message()).c_str());
      return 11;
    }
    std::fprintf(out, "attached\n");
    ::pause();
    return 0;
  });
  ASSERT_TRUE(alice.WaitFor("attached", 10000)) << alice.output() << d.Log();

  // Mallory tries to join Alice's job as the free rank, and to take her rank.
  Child mallory([&](FILE* out) {
    if (!BecomeUser(kMallory)) return 10;
    for (int rank : {1, 0}) {
      ClientOptions o;
      o.socket_path = d.socket();
      o.job_id = "alpha";
      o.rank = rank;
      o.world_size = 2;
      auto c = Client::Connect(o);
      std::fprintf(out, "rank %d: %s %s\n", rank,
                   c.ok() ? "OK" : absl::StatusCodeToString(c.status().code()).c_str(),
                   c.ok() ? "" : std::string(c.status().message()).c_str());
    }
    // And looks for other users' jobs.
    auto st = RunCommand(testing::Hsdpctl(d.socket(), "--json status"));
    std::fprintf(out, "status exit=%d\n%s\nend-status\n", st.exit_code, st.output.c_str());
    ClientOptions own;
    own.socket_path = d.socket();
    own.job_id = "mallory-job";
    auto mine = Client::Connect(own);
    std::fprintf(out, "own job: %s\n", mine.ok() ? "OK" : std::string(mine.status().message()).c_str());
    return 0;
  });
  ASSERT_EQ(mallory.Finish(20000), 0) << mallory.output();
  const std::string& m = mallory.output();
  EXPECT_THAT(m, HasSubstr("rank 1: PERMISSION_DENIED"));
  EXPECT_THAT(m, HasSubstr("rank 0: PERMISSION_DENIED")) << "no ALREADY_EXISTS leak";
  EXPECT_THAT(m, HasSubstr("job \"alpha\" belongs to another user"));
  EXPECT_THAT(m, HasSubstr("status exit=0"));
  const std::string status = m.substr(m.find("status exit="));
  EXPECT_THAT(status.substr(0, status.find("end-status")), Not(HasSubstr("alpha")))
      << "another user's job ids are not visible";
  EXPECT_THAT(m, HasSubstr("own job: OK"));

  // Root (the operator) sees the job and its owner.
  v1::StatusResponse st;
  ASSERT_TRUE(testing::QueryStatus(d.socket(), &st));
  bool found = false;
  for (const auto& j : st.jobs()) {
    if (j.job_id() == "alpha") {
      found = true;
      EXPECT_EQ(j.owner_uid(), kAlice);
      EXPECT_EQ(j.attached_ranks(), 1);
    }
  }
  EXPECT_TRUE(found) << st.DebugString();
  alice.Kill();
  alice.Finish(5000);
}

TEST(IsolationTest, NothingOneSessionWritesAffectsAnother) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("timeouts:\n  shutdown_grace_ms: 200\n")) << d.Log();
  // The second fd a session receives is the wake-up eventfd: nothing mapped,
  // nothing shared to scribble on.
  RawSession vandal;
  ASSERT_TRUE(vandal.Open(d.socket(), "vandal", 0, 1).ok());
  char link[128] = {0};
  const std::string proc = "/proc/self/fd/" + std::to_string(vandal.wake_fd());
  ASSERT_GT(::readlink(proc.c_str(), link, sizeof(link) - 1), 0);
  EXPECT_THAT(std::string(link), HasSubstr("eventfd"));
  // Scribble over every byte of the vandal's own channel and flood the wake fd.
  auto* base = reinterpret_cast<unsigned char*>(vandal.header());
  std::memset(base, 0xA5, vandal.channel_bytes());
  for (int i = 0; i < 1000; ++i) {
    const uint64_t v = ~uint64_t{0} - 1;
    ssize_t ignored = ::write(vandal.wake_fd(), &v, sizeof(v));
    (void)ignored;
  }
  // Other trainers attach and run collectives as before.
  for (int round = 0; round < 2; ++round) {
    ClientOptions o;
    o.socket_path = d.socket();
    o.job_id = "victim-" + std::to_string(round);
    auto c = Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status() << d.Log();
    auto buf = (*c)->AllocateBuffer(4096);
    ASSERT_TRUE(buf.ok()) << buf.status();
    auto g = (*c)->NewGroup({0});
    ASSERT_TRUE(g.ok()) << g.status();
    static_cast<float*>(buf->data)[0] = 2.5f;
    auto w = (*c)->AllReduce(*g, {buf->id, 0}, {buf->id, 2048}, 1, DataType::kFloat32);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE(w->Wait(absl::Seconds(10)).ok());
    EXPECT_EQ(static_cast<float*>(buf->data)[512], 2.5f);
  }
  EXPECT_TRUE(d.Alive());
}

}  // namespace
}  // namespace hsdp
