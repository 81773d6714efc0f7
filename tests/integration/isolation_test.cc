// Isolation between users and between sessions, against a real daemon:
// a job is its owner's uid plus its name (docs/security.md, "Job identity"):
// two users' jobs of the same name are two jobs that run side by side, a
// squatter who attaches first under another user's name changes nothing for
// that user, nobody sees or probes another user's job, and root joins a
// user's job only by naming its owner. Nothing one session can write in
// shared memory affects another session.
//
// The other users are real uids (setresuid in forked children), so these
// tests need root; they skip, saying so, otherwise.
#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "job_identity_util.h"
#include "raw_session.h"
#include "test_util.h"

namespace hsdp {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::Child;
using testing::DaemonProcess;
using testing::RawSession;
using testing::RunCommand;
using testing::TempDir;

using testing::BecomeUser;
using testing::CheckedRank;
using testing::TryAttach;

constexpr uid_t kAlice = 60001;
constexpr uid_t kMallory = 60002;

std::string MultiUserConfig() {
  return "node:\n  socket_mode: 0666\n  allowed_uids: [0, 60001, 60002]\n"
         "timeouts:\n  shutdown_grace_ms: 200\n";
}

// "job <name> owner <uid> attached <n>" for every job in `st`, one per line.
std::string JobLines(const v1::StatusResponse& st) {
  std::string out;
  for (const auto& j : st.jobs()) {
    absl::StrAppend(&out, "job ", j.job_id(), " owner ", j.owner_uid(), " attached ",
                    j.attached_ranks(), "\n");
  }
  return out;
}

// Two users run a checked all-reduce under the same job name at the same
// time: two jobs, each with its own result, each invisible to the other.
TEST(IsolationTest, TwoUsersRunJobsOfTheSameNameAtTheSameTime) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as two other users";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);  // other users may reach the socket
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(MultiUserConfig())) << d.Log();
  const std::string go = dir.path() + "/go";
  std::vector<std::unique_ptr<Child>> ranks;
  for (uid_t uid : {kAlice, kMallory}) {
    for (int r = 0; r < 2; ++r) {
      ranks.push_back(std::make_unique<Child>([&, uid, r](FILE* out) {
        return CheckedRank(out, d.socket(), uid, "train", std::nullopt, r, int(uid), go, 200);
      }));
    }
  }
  for (auto& c : ranks) ASSERT_TRUE(c->WaitFor("grouped", 20000)) << c->output() << d.Log();
  // Both are attached now, as two jobs named "train".
  v1::StatusResponse st;
  ASSERT_TRUE(testing::QueryStatus(d.socket(), &st));
  EXPECT_THAT(JobLines(st), HasSubstr("job train owner 60001 attached 2"));
  EXPECT_THAT(JobLines(st), HasSubstr("job train owner 60002 attached 2"));
  const testing::CommandResult jobs = RunCommand(testing::Hsdpctl(d.socket(), "jobs"));
  EXPECT_THAT(jobs.output, ContainsRegex("train +60001 +2 +2 +1"));
  EXPECT_THAT(jobs.output, ContainsRegex("train +60002 +2 +2 +1"));
  // Each user sees only their own.
  Child look([&](FILE* out) {
    if (!BecomeUser(kMallory)) return 10;
    v1::StatusResponse mine;
    if (!testing::QueryStatus(d.socket(), &mine)) return 11;
    std::fprintf(out, "%s", JobLines(mine).c_str());
    for (const auto& s : mine.sessions()) {
      std::fprintf(out, "session uid %u owner %u\n", s.peer_uid(), s.owner_uid());
    }
    return 0;
  });
  ASSERT_EQ(look.Finish(20000), 0) << look.output();
  EXPECT_THAT(look.output(), HasSubstr("job train owner 60002 attached 2"));
  EXPECT_THAT(look.output(), Not(HasSubstr("60001"))) << "Alice's job and sessions are hidden";
  // Go: both run at once; every result is checked against its own job.
  FILE* f = std::fopen(go.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  for (auto& c : ranks) {
    EXPECT_EQ(c->Finish(60000), 0) << c->output() << d.Log();
    EXPECT_THAT(c->output(), HasSubstr("checked 200"));
  }
  EXPECT_TRUE(d.Alive());
}

// A squatter who attaches first under the name another user will use —
// every rank, another world size, a group — changes nothing for that user,
// learns nothing about them, and cannot join them by naming them as owner.
TEST(IsolationTest, ASquatterAttachingFirstChangesNothingForTheUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as two other users";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(MultiUserConfig())) << d.Log();
  // Mallory squats "alpha" first: both ranks of a world of 2, and a group.
  Child squat([&](FILE* out) {
    if (!BecomeUser(kMallory)) return 10;
    std::unique_ptr<Client> r0, r1;
    std::fprintf(out, "rank 0: %s\n", TryAttach(d.socket(), "alpha", 0, 2, {}, &r0).c_str());
    std::fprintf(out, "rank 1: %s\n", TryAttach(d.socket(), "alpha", 1, 2, {}, &r1).c_str());
    if (r0 == nullptr || r1 == nullptr) return 11;
    auto g = r0->NewGroup({0, 1});
    std::fprintf(out, "group: %s\n", g.ok() ? "OK" : g.status().ToString().c_str());
    std::fprintf(out, "squatting\n");
    ::pause();
    return 0;
  });
  ASSERT_TRUE(squat.WaitFor("squatting", 20000)) << squat.output() << d.Log();
  EXPECT_THAT(squat.output(), HasSubstr("rank 0: OK"));
  EXPECT_THAT(squat.output(), HasSubstr("rank 1: OK"));
  // Alice's trainers attach under "alpha" and train as if nobody were there.
  const std::string go = dir.path() + "/go";
  FILE* f = std::fopen(go.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  Child a0([&](FILE* out) {
    return CheckedRank(out, d.socket(), kAlice, "alpha", std::nullopt, 0, 1000, go, 50);
  });
  Child a1([&](FILE* out) {
    return CheckedRank(out, d.socket(), kAlice, "alpha", std::nullopt, 1, 1000, go, 50);
  });
  ASSERT_TRUE(a0.WaitFor("grouped", 20000)) << a0.output() << d.Log();
  // Meanwhile Mallory tries to reach Alice's job by naming her: refused the
  // same way for a taken rank, a free rank and a job that does not exist (no
  // probing), and her status shows only her own "alpha".
  Child probe([&](FILE* out) {
    if (!BecomeUser(kMallory)) return 10;
    std::fprintf(out, "owner rank 0: %s\n", TryAttach(d.socket(), "alpha", 0, 2, kAlice).c_str());
    std::fprintf(out, "owner rank 1: %s\n", TryAttach(d.socket(), "alpha", 1, 2, kAlice).c_str());
    std::fprintf(out, "owner none: %s\n", TryAttach(d.socket(), "ghost", 0, 2, kAlice).c_str());
    auto st = RunCommand(testing::Hsdpctl(d.socket(), "--json status"));
    std::fprintf(out, "status exit=%d\n%s\nend-status\n", st.exit_code, st.output.c_str());
    return 0;
  });
  ASSERT_EQ(probe.Finish(20000), 0) << probe.output();
  const std::string& m = probe.output();
  const std::string denied =
      "PERMISSION_DENIED owner_uid: only root and the daemon's uid may join another user's job "
      "(uid 60002 named uid 60001)";
  EXPECT_THAT(m, HasSubstr("owner rank 0: " + denied));
  EXPECT_THAT(m, HasSubstr("owner rank 1: " + denied));
  EXPECT_THAT(m, HasSubstr("owner none: " + denied));
  ASSERT_THAT(m, HasSubstr("status exit=0"));
  const std::string status = m.substr(m.find("status exit="));
  EXPECT_THAT(status.substr(0, status.find("end-status")), Not(HasSubstr("60001")))
      << "another user's jobs and sessions are not visible";
  EXPECT_EQ(a0.Finish(60000), 0) << a0.output() << d.Log();
  EXPECT_EQ(a1.Finish(60000), 0) << a1.output() << d.Log();
  EXPECT_THAT(a0.output(), HasSubstr("checked 50"));
  EXPECT_THAT(a1.output(), HasSubstr("checked 50"));
  squat.Kill();
  squat.Finish(5000);
  EXPECT_TRUE(d.Alive());
}

// Root joins a user's job only by naming its owner: without it (a separate
// job by accident) and with a wrong owner it gets a clear error; with the
// owner it runs a checked all-reduce with the user's rank.
TEST(IsolationTest, RootJoinsAUsersJobOnlyByNamingItsOwner) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  TempDir dir;
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(MultiUserConfig())) << d.Log();
  const std::string go = dir.path() + "/go";
  Child alice([&](FILE* out) {
    return CheckedRank(out, d.socket(), kAlice, "alpha", std::nullopt, 0, 7, go, 20);
  });
  ASSERT_TRUE(alice.WaitFor("grouped", 20000)) << alice.output() << d.Log();
  // Root (this process's uid) without the owner, and with the wrong one.
  const std::string without = TryAttach(d.socket(), "alpha", 1, 2);
  EXPECT_THAT(without, HasSubstr("FAILED_PRECONDITION owner_uid: job \"alpha\" exists on this "
                                 "node only under uid 60001"));
  const std::string wrong = TryAttach(d.socket(), "alpha", 1, 2, kMallory);
  EXPECT_THAT(wrong, HasSubstr("NOT_FOUND owner_uid: uid 60002 has no job \"alpha\""));
  // With the owner: rank 1 of Alice's job, and they train together.
  Child root([&](FILE* out) {
    return CheckedRank(out, d.socket(), 0, "alpha", kAlice, 1, 7, go, 20);
  });
  ASSERT_TRUE(root.WaitFor("grouped", 20000)) << root.output() << d.Log();
  // Alice sees root's session in her job; root is not an owner of anything.
  v1::StatusResponse st;
  ASSERT_TRUE(testing::QueryStatus(d.socket(), &st));
  EXPECT_EQ(JobLines(st), "job alpha owner 60001 attached 2\n");
  FILE* f = std::fopen(go.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_EQ(alice.Finish(60000), 0) << alice.output() << d.Log();
  EXPECT_EQ(root.Finish(60000), 0) << root.output() << d.Log();
  EXPECT_THAT(root.output(), HasSubstr("checked 20"));
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
