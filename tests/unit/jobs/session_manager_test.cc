// SessionManager without a daemon: job identity (owner uid + name), the limits it reserves
// before the work (buffers, mappings, group members), non-blocking buffer
// registration, and group keys / re-joining across epochs.
#include "daemon/jobs/session_manager.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <optional>

#include "absl/synchronization/notification.h"
#include "daemon/engine/fake/fake_engine.h"
#include "fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/shm/arena.h"
#include "hsdp/shm/layout.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using testing::SealedMemfd;

class SessionManagerTest : public ::testing::Test {
 protected:
  void Make(NodeLimits limits) {
    limits_ = limits;
    sm_ = std::make_unique<SessionManager>(config_, limits_, &engine_);
  }
  void SetUp() override {
    NodeLimits l;
    l.max_node_bytes = 1 << 30;
    l.max_mappings = 100;
    Make(l);
  }

  // Attaches and claims (as the data connection would) a session.
  uint64_t Attach(const std::string& job, int rank, int world, uint32_t uid = 1000) {
    AttachParams p;
    p.job_id = job;
    p.rank = rank;
    p.world_size = world;
    p.protocol_version = shm::kLayoutVersion;
    p.features = shm::kFeaturesImplemented;
    auto r = sm_->Attach(p, Cred(uid));
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return 0;
    EXPECT_TRUE(sm_->ClaimSession(r->session_id, r->token.data(), Cred(uid)).ok());
    return r->session_id;
  }
  static PeerCred Cred(uint32_t uid) { return PeerCred{1, uid, uid}; }

  // Registers a memfd of `bytes` the way a client does (fd first, then the call).
  absl::StatusOr<uint64_t> Register(uint64_t sid, uint64_t bytes, uint64_t tag) {
    sm_->FindSession(sid)->PutFd(tag, SealedMemfd(bytes));
    return sm_->RegisterBufferSync(sid, tag, bytes, "b", Cred(1000));
  }

  NodeConfig config_;
  NodeLimits limits_;
  FakeStreamEngine engine_;
  std::unique_ptr<SessionManager> sm_;
};

TEST_F(SessionManagerTest, AttachRefusesAnotherVersionNamingBoth) {
  AttachParams p;
  p.job_id = "j";
  p.protocol_version = 1;
  p.features = shm::kFeaturesImplemented;
  auto r = sm_->Attach(p, Cred(1000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("layout 1"), HasSubstr("layout 2")));
  p.protocol_version = shm::kLayoutVersion;
  p.features = 0;  // a client without the required features
  r = sm_->Attach(p, Cred(1000));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("features"));
}

// A daemon restarted on the same socket (a drain for an upgrade) must not
// hand out the numbers of the sessions it had before: a client's call with
// the id it kept (a Detach after a failed reconnect) ended another trainer's
// new session of the same number.
TEST_F(SessionManagerTest, AnIdFromAnEarlierIncarnationNamesNoSessionOfANewOne) {
  const uint64_t a0 = Attach("j", 0, 2), a1 = Attach("j", 1, 2);
  ASSERT_NE(a0, 0u);
  ASSERT_NE(a1, 0u);
  sm_->EndAll("drained");
  Make(limits_);  // the next incarnation
  const uint64_t b0 = Attach("j", 1, 2), b1 = Attach("j", 0, 2);
  for (uint64_t old_id : {a0, a1}) {
    EXPECT_NE(old_id, b0);
    EXPECT_NE(old_id, b1);
    const absl::Status s = sm_->Detach(old_id, Cred(1000));
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  }
  EXPECT_NE(sm_->FindSession(b0), nullptr);
  EXPECT_NE(sm_->FindSession(b1), nullptr);
  EXPECT_LE(std::max(b0, b1), uint64_t{1} << 53);  // exact in JSON
}

// A drain ends the sessions the moment their last operation completed; a
// member that has not read that completion yet must still find it, not the
// zeros of a released channel (it would fail an operation its peers
// completed, and the job would go on out of step). A detach (the client is
// done) releases the pages at once as before.
TEST_F(SessionManagerTest, ChannelsEndedByTheDaemonStoppingKeepTheirPagesForTheirClients) {
  const uint64_t kept = Attach("j", 0, 2), dropped = Attach("k", 0, 1);
  auto map = [&](uint64_t sid) {
    const SharedRegion& r = sm_->FindSession(sid)->channel().region();
    void* m = ::mmap(nullptr, r.bytes(), PROT_READ, MAP_SHARED, r.fd(), 0);
    EXPECT_NE(m, MAP_FAILED);
    return std::make_pair(static_cast<const shm::ChannelHeader*>(m), r.bytes());
  };
  auto [kept_header, kept_bytes] = map(kept);
  auto [dropped_header, dropped_bytes] = map(dropped);
  const uint64_t magic = kept_header->magic;
  ASSERT_NE(magic, 0u);
  ASSERT_TRUE(sm_->Detach(dropped, Cred(1000)).ok());
  sm_->EndAll("drained");
  sm_.reset();  // every session object gone
  EXPECT_EQ(kept_header->magic, magic);
  EXPECT_EQ(dropped_header->magic, 0u);
  ::munmap(const_cast<shm::ChannelHeader*>(kept_header), kept_bytes);
  ::munmap(const_cast<shm::ChannelHeader*>(dropped_header), dropped_bytes);
  Make(limits_);
}

TEST_F(SessionManagerTest, AJobGetsItsPriorityClassAtItsFirstAttach) {
  config_.priority_classes = {{"interactive", 1, {"infer-*"}, {}}, {"batch", 6, {}, {2000}}};
  Make(limits_);
  auto attach = [&](const std::string& job, int rank, uint32_t uid, const std::string& cls) {
    AttachParams p;
    p.job_id = job;
    p.rank = rank;
    p.world_size = 2;
    p.protocol_version = shm::kLayoutVersion;
    p.features = shm::kFeaturesImplemented;
    p.priority_class = cls;
    return sm_->Attach(p, Cred(uid));
  };
  auto class_of = [&](const std::string& job) {
    for (const JobSummary& j : sm_->Jobs(std::nullopt)) {
      if (j.job_id == job) return absl::StrCat(j.priority_class, "/", j.priority_level);
    }
    return std::string("none");
  };
  ASSERT_TRUE(attach("infer-1", 0, 1000, "").ok());
  EXPECT_EQ(class_of("infer-1"), "interactive/1");
  // Asking for a lower class is granted; the job keeps it for every member.
  ASSERT_TRUE(attach("infer-2", 0, 1000, "batch").ok());
  EXPECT_EQ(class_of("infer-2"), "batch/6");
  ASSERT_TRUE(attach("infer-2", 1, 1000, "").ok());
  EXPECT_EQ(class_of("infer-2"), "batch/6");
  // A member asking for another class than the job's: refused, naming both.
  ASSERT_TRUE(attach("train", 0, 1000, "").ok());
  EXPECT_EQ(class_of("train"), "default/4");
  auto r = attach("train", 1, 1000, "batch");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              AllOf(HasSubstr("\"default\""), HasSubstr("\"batch\"")));
  // Higher than its own: refused; unknown: refused; malformed: refused.
  r = attach("bulk", 0, 2000, "interactive");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  r = attach("bulk", 0, 2000, "gold");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  r = attach("bulk", 0, 2000, std::string(4096, 'x'));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("priority_class"));
  // None of the refusals created the job.
  EXPECT_EQ(class_of("bulk"), "none");
  EXPECT_EQ(sm_->Snapshot().size(), 4u);
}

TEST_F(SessionManagerTest, FeaturesAreTheIntersection) {
  AttachParams p;
  p.job_id = "j";
  p.protocol_version = shm::kLayoutVersion;
  p.features = shm::kFeaturesImplemented | shm::kFeatureDeviceMemory | (1ull << 40);
  auto r = sm_->Attach(p, Cred(1000));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->features, shm::kFeaturesImplemented);
}

// A job is its owner's uid plus its name: two uids' "alpha" are two jobs
// (own world sizes, ranks, groups), and neither can reach the other's.
TEST_F(SessionManagerTest, JobsAreKeyedByOwnerAndName) {
  const uint64_t a0 = Attach("alpha", 0, 2, /*uid=*/1000);
  const uint64_t a1 = Attach("alpha", 1, 2, /*uid=*/1000);
  // Another uid's "alpha": same ranks, another world size, attaches fine.
  const uint64_t m0 = Attach("alpha", 0, 3, /*uid=*/2000);
  ASSERT_NE(m0, 0u);
  ASSERT_EQ(sm_->Jobs(1000u).size(), 1u);
  EXPECT_EQ(sm_->Jobs(1000u)[0].world_size, 2);
  EXPECT_EQ(sm_->Jobs(1000u)[0].attached, 2);
  ASSERT_EQ(sm_->Jobs(2000u).size(), 1u);
  EXPECT_EQ(sm_->Jobs(2000u)[0].world_size, 3);
  EXPECT_EQ(sm_->Jobs(2000u)[0].owner_uid, 2000u);
  EXPECT_EQ(sm_->Jobs().size(), 2u);
  // Groups of the same ranks are separate groups with separate keys.
  auto ga = sm_->NewGroup(a0, {0, 1}, Cred(1000));
  ASSERT_TRUE(ga.ok()) << ga.status();
  ASSERT_TRUE(sm_->NewGroup(a1, {0, 1}, Cred(1000)).ok());
  const uint64_t m1 = Attach("alpha", 1, 3, /*uid=*/2000);
  auto gm = sm_->NewGroup(m0, {0, 1}, Cred(2000));
  ASSERT_TRUE(gm.ok()) << gm.status();
  ASSERT_TRUE(sm_->NewGroup(m1, {0, 1}, Cred(2000)).ok());
  EXPECT_NE(ga->group_id, gm->group_id);
  EXPECT_EQ(sm_->FindGroup(ga->group_id)->key(), GroupKey(JobKey{1000, "alpha"}, {0, 1}, 0));
  EXPECT_EQ(sm_->FindGroup(gm->group_id)->key(), GroupKey(JobKey{2000, "alpha"}, {0, 1}, 0));
  EXPECT_NE(GroupKey(JobKey{1000, "alpha"}, {0, 1}, 0), GroupKey(JobKey{2000, "alpha"}, {0, 1}, 0));
  // The other uid's group cannot be re-joined by id.
  EXPECT_EQ(sm_->NewGroup(m0, {}, Cred(2000), ga->group_id).status().code(),
            absl::StatusCode::kNotFound);
  // Naming another owner: PERMISSION_DENIED before anything is looked up, so
  // the answer is the same for a taken rank, a free rank and no job at all.
  std::vector<std::string> messages;
  for (auto [job, rank] : {std::pair<std::string, int>{"alpha", 0}, {"alpha", 1}, {"nope", 0}}) {
    AttachParams p;
    p.job_id = job;
    p.rank = rank;
    p.world_size = 2;
    p.owner_uid = 1000;
    p.protocol_version = shm::kLayoutVersion;
    p.features = shm::kFeaturesImplemented;
    auto r = sm_->Attach(p, Cred(2000));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("owner_uid"));
    std::string m(r.status().message());
    messages.push_back(m.substr(0, m.find("job \"")));
  }
  EXPECT_EQ(messages[0], messages[1]);
  EXPECT_EQ(messages[0], messages[2]);
  // Naming oneself as the owner is the same as naming nobody.
  AttachParams self;
  self.job_id = "alpha";
  self.rank = 2;
  self.world_size = 3;
  self.owner_uid = 2000;
  self.protocol_version = shm::kLayoutVersion;
  self.features = shm::kFeaturesImplemented;
  EXPECT_TRUE(sm_->Attach(self, Cred(2000)).ok());
  EXPECT_EQ(sm_->Jobs(2000u)[0].attached, 3);
}

// Root (or the daemon's uid) joins another user's job only by naming its
// owner, and only a job that exists.
TEST_F(SessionManagerTest, RootJoinsAnotherUsersJobOnlyByNamingItsOwner) {
  const uint64_t user = Attach("alpha", 0, 2, /*uid=*/1000);
  AttachParams p;
  p.job_id = "alpha";
  p.rank = 1;
  p.world_size = 2;
  p.protocol_version = shm::kLayoutVersion;
  p.features = shm::kFeaturesImplemented;
  p.caller_is_admin = true;
  // Without the owner: not a separate root job by accident.
  auto none = sm_->Attach(p, Cred(0));
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(none.status().message()),
              AllOf(HasSubstr("uid 1000"), HasSubstr("set owner_uid")));
  // A wrong owner: no such job.
  p.owner_uid = 1001;
  auto wrong = sm_->Attach(p, Cred(0));
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(wrong.status().message()), HasSubstr("uid 1001 has no job \"alpha\""));
  EXPECT_EQ(sm_->Jobs(1001u).size(), 0u) << "a refused join creates nothing";
  // The right owner: root's session is a member of the user's job.
  p.owner_uid = 1000;
  auto joined = sm_->Attach(p, Cred(0));
  ASSERT_TRUE(joined.ok()) << joined.status();
  ASSERT_TRUE(sm_->ClaimSession(joined->session_id, joined->token.data(), Cred(0)).ok());
  EXPECT_EQ(sm_->FindSession(joined->session_id)->info().owner_uid, 1000u);
  EXPECT_EQ(sm_->FindSession(joined->session_id)->info().uid, 0u);
  ASSERT_EQ(sm_->Jobs(1000u).size(), 1u);
  EXPECT_EQ(sm_->Jobs(1000u)[0].attached, 2);
  EXPECT_EQ(sm_->Jobs(0u).size(), 0u);
  auto gu = sm_->NewGroup(user, {0, 1}, Cred(1000));
  auto gr = sm_->NewGroup(joined->session_id, {0, 1}, Cred(0));
  ASSERT_TRUE(gu.ok() && gr.ok());
  EXPECT_EQ(gu->group_id, gr->group_id);
  // A name only root uses is root's own job, as for anyone.
  p.job_id = "ops";
  p.rank = 0;
  p.world_size = 1;
  p.owner_uid.reset();
  EXPECT_TRUE(sm_->Attach(p, Cred(0)).ok());
  ASSERT_EQ(sm_->Jobs(0u).size(), 1u);
  // A user who took the name of root's job first cannot block it: root names
  // itself as the owner and gets a job of its own beside the user's.
  Attach("nightly", 0, 1, /*uid=*/1000);
  p.job_id = "nightly";
  auto squatted = sm_->Attach(p, Cred(0));
  EXPECT_EQ(squatted.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(squatted.status().message()), HasSubstr("set owner_uid to 0"));
  p.owner_uid = 0;
  EXPECT_TRUE(sm_->Attach(p, Cred(0)).ok());
  ASSERT_EQ(sm_->Jobs(0u).size(), 2u);
  ASSERT_EQ(sm_->Jobs(1000u).size(), 2u);
  // caller_is_admin comes from the server's Authenticator, never from the
  // client; without it, naming another owner is refused.
  p.job_id = "alpha";
  p.owner_uid = 1000;
  p.caller_is_admin = false;
  EXPECT_EQ(sm_->Attach(p, Cred(3000)).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(SessionManagerTest, RegistrationReservesAndReleasesEveryLimit) {
  const uint64_t sid = Attach("j", 0, 1);
  EXPECT_EQ(sm_->mappings(), 1u) << "the session channel";
  auto b = Register(sid, 4096, 1);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(sm_->bytes_registered(), 4096u);
  EXPECT_EQ(sm_->mappings(), 2u);
  // A registration whose fd never comes releases what it reserved.
  absl::Notification done;
  absl::StatusOr<uint64_t> late = absl::UnknownError("not yet");
  sm_->RegisterBuffer(sid, 77, 8192, "never", Cred(1000), [&](absl::StatusOr<uint64_t> r) {
    late = std::move(r);
    done.Notify();
  });
  EXPECT_FALSE(done.HasBeenNotified()) << "waits without blocking the caller";
  EXPECT_EQ(sm_->bytes_registered(), 4096u + 8192u) << "reserved while waiting";
  sm_->FindSession(sid)->ExpireFdWaiters(absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sm_->bytes_registered(), 4096u);
  EXPECT_EQ(sm_->mappings(), 2u);
  // A wrong fd kind (not a sealed memfd) is refused and released too.
  sm_->FindSession(sid)->PutFd(5, UniqueFd(::dup(0)));
  auto bad = sm_->RegisterBufferSync(sid, 5, 4096, "bad", Cred(1000));
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(sm_->bytes_registered(), 4096u);
  // Ending the session releases everything.
  sm_->EndSession(sid, "test");
  EXPECT_EQ(sm_->bytes_registered(), 0u);
  EXPECT_EQ(sm_->mappings(), 0u);
}

TEST_F(SessionManagerTest, AJobsSessionsShareItsByteLimit) {
  config_.max_job_bytes = 12288;  // 3 pages for the whole job on this node
  Make(limits_);
  const uint64_t a = Attach("j", 0, 2);
  const uint64_t b = Attach("j", 1, 2);
  const uint64_t other = Attach("k", 0, 1);
  ASSERT_TRUE(Register(a, 8192, 1).ok());
  ASSERT_TRUE(Register(b, 4096, 2).ok());
  // The job is full: its next buffer is refused naming the job and the limit,
  // from either session; another job is not affected.
  auto over = Register(b, 4096, 3);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()),
              AllOf(HasSubstr("job \"j\" of uid 1000"), HasSubstr("limits.max_job_bytes")));
  EXPECT_EQ(Register(a, 4096, 4).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Register(other, 8192, 5).ok());
  // A registration in progress counts against the job too.
  absl::Notification done;
  sm_->RegisterBuffer(other, 77, 4096, "pending", Cred(1000), [&](absl::StatusOr<uint64_t>) {
    done.Notify();
  });
  EXPECT_EQ(Register(other, 4096, 6).status().code(), absl::StatusCode::kResourceExhausted);
  sm_->FindSession(other)->ExpireFdWaiters(absl::Now() + absl::Seconds(60));
  ASSERT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(5)));
  EXPECT_TRUE(Register(other, 4096, 7).ok()) << "released when it failed";
  // Freeing or ending a session gives the job its bytes back.
  sm_->EndSession(b, "test");
  EXPECT_TRUE(Register(a, 4096, 8).ok());
}

TEST_F(SessionManagerTest, MappingBudgetBoundsSessionsAndBuffers) {
  NodeLimits l;
  l.max_node_bytes = 1 << 30;
  l.max_mappings = 3;
  Make(l);
  const uint64_t sid = Attach("j", 0, 1);
  ASSERT_TRUE(Register(sid, 4096, 1).ok());
  ASSERT_TRUE(Register(sid, 4096, 2).ok());
  auto over = Register(sid, 4096, 3);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("vm.max_map_count"));
  AttachParams p;
  p.job_id = "k";
  p.protocol_version = shm::kLayoutVersion;
  p.features = shm::kFeaturesImplemented;
  EXPECT_EQ(sm_->Attach(p, Cred(1000)).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(MappingBudget(65530), 49146u);
  EXPECT_EQ(MappingBudget(100), 1024u);
}

TEST_F(SessionManagerTest, GroupMemberBudgetsAreCheckedBeforeAllocating) {
  NodeLimits l;
  l.max_node_bytes = 1 << 30;
  l.max_mappings = 100;
  l.max_group_members_per_job = 10;
  l.max_group_members = 14;
  config_.uid_share_percent = 100;  // the node's own bound, not a uid's share
  Make(l);
  const uint64_t a = Attach("a", 0, 8);
  const uint64_t b = Attach("b", 0, 8);
  std::vector<int> eight = {0, 1, 2, 3, 4, 5, 6, 7};
  ASSERT_TRUE(sm_->NewGroup(a, eight, Cred(1000)).ok());
  auto over_job = sm_->NewGroup(a, {0, 1, 2}, Cred(1000));
  EXPECT_EQ(over_job.status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(sm_->NewGroup(a, {0, 1}, Cred(1000)).ok());
  auto over_node = sm_->NewGroup(b, eight, Cred(1000));
  EXPECT_EQ(over_node.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over_node.status().message()), HasSubstr("per node"));
  // A refused call does not count as the caller's k-th call of that list.
  ASSERT_TRUE(sm_->NewGroup(b, {0, 1, 2, 3}, Cred(1000)).ok());
  // Ranks must exist in the job, once each, and include the caller.
  EXPECT_EQ(sm_->NewGroup(b, {0, 9}, Cred(1000)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sm_->NewGroup(b, {0, 0}, Cred(1000)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(sm_->NewGroup(b, {1, 2}, Cred(1000)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SessionManagerTest, GroupKeysAreGlobalAndARestartedRankRejoinsInTheNextEpoch) {
  const uint64_t r0 = Attach("job", 0, 2);
  const uint64_t r1 = Attach("job", 1, 2);
  auto g0 = sm_->NewGroup(r0, {0, 1}, Cred(1000));
  auto g1 = sm_->NewGroup(r1, {0, 1}, Cred(1000));
  ASSERT_TRUE(g0.ok() && g1.ok());
  EXPECT_EQ(g0->group_id, g1->group_id);
  EXPECT_EQ(g0->epoch, 1u);
  EXPECT_EQ(sm_->FindGroup(g0->group_id)->key(), GroupKey(JobKey{1000, "job"}, {0, 1}, 0));
  // The k-th call names the k-th group.
  auto second = sm_->NewGroup(r0, {0, 1}, Cred(1000));
  ASSERT_TRUE(second.ok());
  EXPECT_NE(second->group_id, g0->group_id);
  EXPECT_EQ(sm_->FindGroup(second->group_id)->key(), GroupKey(JobKey{1000, "job"}, {0, 1}, 1));
  // Rank 1 dies; its restarted process (a new session) joins the same group
  // with its first NewGroup call, and the survivor re-joins: epoch 2.
  sm_->EndSession(r1, "killed");
  EXPECT_TRUE(sm_->FindGroup(g0->group_id)->stats().broken);
  const uint64_t r1b = Attach("job", 1, 2);
  auto back = sm_->NewGroup(r1b, {0, 1}, Cred(1000));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->group_id, g0->group_id);
  EXPECT_EQ(back->epoch, 2u);
  auto again = sm_->NewGroup(r0, {}, Cred(1000), /*rejoin_group_id=*/g0->group_id);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->epoch, 2u);
  EXPECT_FALSE(sm_->FindGroup(g0->group_id)->stats().broken);
  EXPECT_EQ(sm_->FindGroup(g0->group_id)->stats().epoch, 2u);
  // Another job's group cannot be re-joined.
  const uint64_t x = Attach("other", 0, 1);
  EXPECT_EQ(sm_->NewGroup(x, {}, Cred(1000), g0->group_id).status().code(),
            absl::StatusCode::kNotFound);
}

// One uid (not root) holds at most its share of every node-wide pool
// (limits.uid_share_percent): sessions, registered bytes and group members;
// another uid is never refused because of it, and what a uid held comes back
// when its sessions end.
TEST_F(SessionManagerTest, EveryNodeWidePoolHasAShareForEachUid) {
  config_.max_sessions = 4;
  config_.uid_share_percent = 50;
  NodeLimits l;
  l.max_node_bytes = 64 * 4096;
  l.max_mappings = 100;
  l.max_group_members = 8;
  Make(l);
  AttachParams p;
  p.protocol_version = shm::kLayoutVersion;
  p.features = shm::kFeaturesImplemented;
  const uint64_t a0 = Attach("a", 0, 1, 1000);
  const uint64_t a1 = Attach("a2", 0, 1, 1000);
  p.job_id = "a3";
  absl::StatusOr<AttachResult> third = sm_->Attach(p, Cred(1000));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              AllOf(HasSubstr("uid 1000"), HasSubstr("share of 2 sessions"),
                    HasSubstr("limits.uid_share_percent")));
  const uint64_t b0 = Attach("b", 0, 4, 1001);
  // Bytes: uid 1000 may register half of the node's 256 KiB.
  ASSERT_TRUE(Register(a0, 32 * 4096, 1).ok());
  absl::StatusOr<uint64_t> over = Register(a1, 4096, 2);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("share of 131072 bytes"));
  sm_->FindSession(b0)->PutFd(3, SealedMemfd(32 * 4096));
  EXPECT_TRUE(sm_->RegisterBufferSync(b0, 3, 32 * 4096, "b", Cred(1001)).ok());
  // Group members: 4 of the node's 8 per owner.
  EXPECT_TRUE(sm_->NewGroup(b0, {0, 1, 2, 3}, Cred(1001)).ok());
  absl::StatusOr<NewGroupResult> members = sm_->NewGroup(b0, {0, 1}, Cred(1001));
  EXPECT_EQ(members.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(members.status().message()), HasSubstr("share of 4 members"));
  EXPECT_TRUE(sm_->NewGroup(a0, {0}, Cred(1000)).ok());
  // Root is held only to the node's totals: it takes the last session.
  p.job_id = "root-job";
  p.world_size = 1;
  EXPECT_TRUE(sm_->Attach(p, Cred(0)).ok());
  // uid 1000's session ends: its session, bytes and members come back.
  sm_->EndSession(a0, "test");
  const uint64_t a4 = Attach("a4", 0, 1, 1000);
  EXPECT_TRUE(Register(a4, 32 * 4096, 4).ok());
}

// Arena memory is charged to the job's owner within its share; when the
// group ends the memory itself goes, even from a tenant that kept the fd
// (the OS's own count of the file's blocks drops to zero, and a mapping
// reads the retired header), and the owner's share comes back.
TEST_F(SessionManagerTest, ArenaMemoryIsSharedPerOwnerAndReleasedWithTheGroup) {
  config_.small_op_bytes = 4096;
  config_.small_op_slots = 8;
  config_.small_op_arena_mib = 1;
  config_.uid_share_percent = 50;
  Make(limits_);
  const uint64_t a = Attach("a", 0, 1, 1000);
  std::vector<UniqueFd> kept;
  uint64_t arena_bytes = 0;
  int with_arena = 0;
  for (int i = 0; i < 64; ++i) {
    absl::StatusOr<NewGroupResult> g = sm_->NewGroup(a, {0}, Cred(1000));
    ASSERT_TRUE(g.ok()) << g.status();
    if (g->arena == nullptr) break;  // over the share: the group runs through the daemon
    ++with_arena;
    arena_bytes = g->arena->bytes();
    kept.emplace_back(::dup(g->arena->fd()));  // a tenant keeping its fd
  }
  ASSERT_GT(with_arena, 0);
  ASSERT_LT(with_arena, 64) << "the share never refused";
  EXPECT_LE(uint64_t(with_arena) * arena_bytes, (1u << 20) / 2) << "over uid 1000's share";
  // Another owner still gets arenas.
  const uint64_t b = Attach("b", 0, 1, 1001);
  absl::StatusOr<NewGroupResult> other = sm_->NewGroup(b, {0}, Cred(1001));
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->arena, nullptr);
  struct stat st;
  ASSERT_EQ(::fstat(kept[0].get(), &st), 0);
  EXPECT_GE(uint64_t(st.st_blocks) * 512, arena_bytes) << "allocated while the group lives";
  // The job ends: every arena's pages go, though the tenant kept the fds.
  sm_->EndSession(a, "test");
  uint64_t blocks = 0;
  for (const UniqueFd& fd : kept) {
    ASSERT_EQ(::fstat(fd.get(), &st), 0);
    blocks += st.st_blocks;
    EXPECT_EQ(uint64_t(st.st_size), arena_bytes) << "the file keeps its size";
  }
  EXPECT_EQ(blocks, 0u) << "memory hsdpd handed out outlived the group";
  void* m = ::mmap(nullptr, arena_bytes, PROT_READ, MAP_SHARED, kept[0].get(), 0);
  ASSERT_NE(m, MAP_FAILED);
  EXPECT_TRUE(shm::ArenaRetired(*static_cast<const shm::ArenaHeader*>(m)));
  ::munmap(m, arena_bytes);
  // uid 1000's share is back.
  const uint64_t a2 = Attach("a2", 0, 1, 1000);
  absl::StatusOr<NewGroupResult> again = sm_->NewGroup(a2, {0}, Cred(1000));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->arena, nullptr);
}

// A session's channel is memory hsdpd hands out too: it goes with the session.
TEST_F(SessionManagerTest, AChannelsMemoryGoesWithItsSessionEvenWhenTheFdIsKept) {
  const uint64_t a = Attach("a", 0, 1, 1000);
  UniqueFd kept(::dup(sm_->FindSession(a)->channel().region().fd()));
  ASSERT_TRUE(kept.valid());
  struct stat st;
  ASSERT_EQ(::fstat(kept.get(), &st), 0);
  EXPECT_GT(st.st_blocks, 0);
  sm_->EndSession(a, "test");
  // The daemon's last reference may be held a moment longer by in-flight work;
  // none here.
  ASSERT_EQ(::fstat(kept.get(), &st), 0);
  EXPECT_EQ(st.st_blocks, 0);
}

}  // namespace
}  // namespace hsdp
