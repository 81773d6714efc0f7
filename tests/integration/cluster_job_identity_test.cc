// Job identity across nodes (docs/security.md, "Job identity"): a job's
// cluster-wide key carries its owner uid, so the same job id under another
// uid on another node is another job (it neither blocks the owner's ranks
// nor meets them), and root on another node joins a user's job only by
// naming its owner, and only a job placed somewhere in the cluster.
//
// The users are real uids (setresuid in forked children), so this needs
// root; it skips, saying so, otherwise.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "cluster_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "job_identity_util.h"

namespace hsdp::testing {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kAlice = 60001;
constexpr uid_t kMallory = 60002;

class ClusterJobIdentityTest : public ClusterFixture {};

TEST_F(ClusterJobIdentityTest, TheOwnerKeysTheJobOnEveryNodeAndRootJoinsOnlyByNamingIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as two other users";
  StartCluster(2, /*collective_ms=*/15000, /*join_timeout_ms=*/3000,
               "node:\n  socket_mode: 0666\n  allowed_uids: [0, 60001, 60002]\n");
  for (auto& d : daemons_) ASSERT_EQ(::chmod(d->dir.path().c_str(), 0755), 0);
  TempDir sync;
  ASSERT_EQ(::chmod(sync.path().c_str(), 0755), 0);  // the users look for `go` in it
  const std::string go = sync.File("go");

  // Mallory takes rank 1 of "x" on node 1 first: her own job; its rank 0
  // (never attached anywhere) is not Alice's rank 0 on node 0.
  Child mallory([&](FILE* out) {
    if (!BecomeUser(kMallory)) return 10;
    std::unique_ptr<Client> c;
    std::fprintf(out, "attach: %s\n", TryAttach(Socket(1), "x", 1, 2, {}, &c).c_str());
    if (c == nullptr) return 11;
    auto g = c->NewGroup({0, 1});
    std::fprintf(out, "group: %s\nsquatting\n", g.ok() ? "OK" : g.status().ToString().c_str());
    ::pause();
    return 0;
  });
  ASSERT_TRUE(mallory.WaitFor("squatting", 20000)) << mallory.output() << Logs();
  EXPECT_THAT(mallory.output(), HasSubstr("attach: OK"));
  EXPECT_THAT(mallory.output(), HasSubstr("rank(s) 0 of job \"x\" of uid 60002 did not attach"));

  // Alice's rank 0 on node 0.
  Child alice([&](FILE* out) {
    return CheckedRank(out, Socket(0), kAlice, "x", std::nullopt, 0, 5, go, 20);
  });
  // Root on node 1: without an owner (on node 1 "x" is only Mallory's), and
  // naming an owner with no such job anywhere, gets clear errors.
  EXPECT_THAT(TryAttach(Socket(1), "x", 1, 2),
              HasSubstr("FAILED_PRECONDITION owner_uid: job \"x\" exists on this node only under "
                        "uid 60002"));
  EXPECT_THAT(TryAttach(Socket(1), "x", 1, 2, 60003u),
              HasSubstr("NOT_FOUND owner_uid: uid 60003 has no job \"x\" on any node of the "
                        "cluster"));
  // Naming Alice, root becomes rank 1 of her job (placed on node 0 only) and
  // they run checked all-reduces across the two daemons.
  Child root([&](FILE* out) { return CheckedRank(out, Socket(1), 0, "x", kAlice, 1, 5, go, 20); });
  ASSERT_TRUE(alice.WaitFor("grouped", 20000)) << alice.output() << Logs();
  ASSERT_TRUE(root.WaitFor("grouped", 20000)) << root.output() << Logs();
  FILE* f = std::fopen(go.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_EQ(alice.Finish(60000), 0) << alice.output() << Logs();
  EXPECT_EQ(root.Finish(60000), 0) << root.output() << Logs();
  EXPECT_THAT(alice.output(), HasSubstr("checked 20"));
  EXPECT_THAT(root.output(), HasSubstr("checked 20"));
  mallory.Kill();
  mallory.Finish(5000);
}

}  // namespace
}  // namespace hsdp::testing
