// NodeLedger: the node's bytes, mappings and group members are checked,
// reserved and given back exactly; every pool also holds each uid to its
// share (root only to the node's total); refusals name the limit.
#include "daemon/jobs/node_ledger.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

NodeLimits Limits(uint64_t bytes, uint64_t mappings, uint64_t members_per_job = 1 << 20,
                  uint64_t members = 1 << 21) {
  NodeLimits l;
  l.max_node_bytes = bytes;
  l.max_mappings = mappings;
  l.max_group_members_per_job = members_per_job;
  l.max_group_members = members;
  return l;
}

TEST(NodeLedgerTest, SessionsTakeAMappingEachAndTheUidsShare) {
  NodeLedger ledger(Limits(1 << 20, 3), /*max_sessions=*/4, 0, /*uid_share_percent=*/50);
  EXPECT_TRUE(ledger.ReserveSession(1000).ok());
  EXPECT_TRUE(ledger.ReserveSession(1000).ok());
  EXPECT_EQ(ledger.mappings(), 2u);
  const absl::Status share = ledger.ReserveSession(1000);
  EXPECT_EQ(share.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(share.message(), AllOf(HasSubstr("uid 1000"), HasSubstr("share of 2 sessions")));
  EXPECT_EQ(ledger.mappings(), 2u) << "a refused session holds nothing";
  EXPECT_TRUE(ledger.ReserveSession(1001).ok());
  const absl::Status maps = ledger.ReserveSession(0);  // root: only the node's limits
  EXPECT_EQ(maps.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(maps.message(), HasSubstr("vm.max_map_count"));
  ledger.ReleaseSession(1000);
  EXPECT_EQ(ledger.mappings(), 2u);
  EXPECT_EQ(ledger.sessions_share().used_by(1000), 1u);
  EXPECT_TRUE(ledger.ReserveSession(0).ok());
}

TEST(NodeLedgerTest, BuffersAreCheckedReservedAndGivenBack) {
  NodeLedger ledger(Limits(100, 10), 4, 0, 100);
  EXPECT_TRUE(ledger.CheckBufferFits(100).ok());
  const absl::Status big = ledger.CheckBufferFits(101);
  EXPECT_EQ(big.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(big.message(), AllOf(HasSubstr("a buffer of 101 bytes"),
                                   HasSubstr("limits.max_node_bytes")));
  ASSERT_TRUE(ledger.ReserveBuffer(1000, 60).ok());
  EXPECT_EQ(ledger.bytes(), 60u);
  EXPECT_EQ(ledger.mappings(), 1u);
  EXPECT_TRUE(ledger.CheckBufferFits(40).ok());
  EXPECT_THAT(ledger.CheckBufferFits(41).message(), HasSubstr("bring this node to 101 bytes"));
  EXPECT_EQ(ledger.CheckBufferFits(UINT64_MAX).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(ledger.ReserveBuffer(1000, 40).ok());
  // A session that ended gives back all its buffers at once.
  ledger.ReleaseBuffers(1000, 2, 100);
  EXPECT_EQ(ledger.bytes(), 0u);
  EXPECT_EQ(ledger.mappings(), 0u);
  EXPECT_EQ(ledger.bytes_share().used(), 0u);
}

TEST(NodeLedgerTest, BuffersAreHeldToTheMappingBudgetAndTheUidsShare) {
  NodeLedger ledger(Limits(1000, 2), 4, 0, 50);
  const absl::Status share = ledger.ReserveBuffer(1000, 501);
  EXPECT_EQ(share.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(share.message(), HasSubstr("share of 500 bytes"));
  EXPECT_EQ(ledger.bytes(), 0u) << "a refused reservation holds nothing";
  ASSERT_TRUE(ledger.ReserveBuffer(1000, 10).ok());
  ASSERT_TRUE(ledger.ReserveBuffer(1001, 10).ok());
  EXPECT_THAT(ledger.CheckBufferFits(1).message(), HasSubstr("2 shared-memory mappings"));
  ledger.ReleaseBuffers(1001, 1, 10);
  EXPECT_TRUE(ledger.CheckBufferFits(1).ok());
}

TEST(NodeLedgerTest, JobBytesAreCheckedOnlyWhenLimited) {
  const JobKey job{1000, "train"};
  NodeLedger unlimited(Limits(1 << 20, 10), 4, /*max_job_bytes=*/0, 100);
  EXPECT_TRUE(unlimited.CheckJobBytes(job, UINT64_MAX, UINT64_MAX).ok());
  NodeLedger ledger(Limits(1 << 20, 10), 4, /*max_job_bytes=*/100, 100);
  EXPECT_TRUE(ledger.CheckJobBytes(job, 60, 40).ok());
  const absl::Status over = ledger.CheckJobBytes(job, 60, 41);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.message(), AllOf(HasSubstr("job \"train\" of uid 1000"),
                                    HasSubstr("to 101 bytes"), HasSubstr("limits.max_job_bytes")));
  EXPECT_EQ(ledger.CheckJobBytes(job, 0, UINT64_MAX).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ledger.CheckJobBytes(job, UINT64_MAX, 1).code(), absl::StatusCode::kResourceExhausted);
}

TEST(NodeLedgerTest, GroupMembersPerJobPerNodeAndPerOwner) {
  NodeLedger ledger(Limits(1 << 20, 10, /*members_per_job=*/6, /*members=*/8), 4, 0, 50);
  const JobKey a{1000, "a"};
  EXPECT_TRUE(ledger.CheckMembers(a, 2, 4).ok());
  const absl::Status job = ledger.CheckMembers(a, 2, 5);
  EXPECT_EQ(job.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(job.message(), AllOf(HasSubstr("a group of 5 ranks"), HasSubstr("to 7 group members"),
                                   HasSubstr("at most 6 per job and 8 per node, 0 in use")));
  ASSERT_TRUE(ledger.ReserveMembers(1000, 4).ok());
  const absl::Status share = ledger.ReserveMembers(1000, 1);
  EXPECT_THAT(share.message(), HasSubstr("share of 4 members"));
  ASSERT_TRUE(ledger.ReserveMembers(0, 3).ok());  // root: only the node's total
  EXPECT_EQ(ledger.group_members(), 7u);
  EXPECT_THAT(ledger.CheckMembers(JobKey{1001, "b"}, 0, 2).message(), HasSubstr("7 in use"));
  ledger.ReleaseMembers(1000, 4);
  EXPECT_EQ(ledger.group_members(), 3u);
  EXPECT_EQ(ledger.members_share().used_by(1000), 0u);
  EXPECT_TRUE(ledger.CheckMembers(JobKey{1001, "b"}, 0, 2).ok());
}

TEST(NodeLedgerTest, MappingBudgetLeavesAQuarterOfTheKernelsLimit) {
  EXPECT_EQ(MappingBudget(65530), 49146u);
  EXPECT_EQ(MappingBudget(100), 1024u);
  EXPECT_GT(KernelMaxMapCount(), 0u);
  EXPECT_EQ(FormatBytes(3), "3 bytes");
  EXPECT_EQ(FormatBytes(3 << 20), "3145728 bytes (3 MiB)");
  EXPECT_EQ(FormatBytes(uint64_t{5} << 30), "5368709120 bytes (5 GiB)");
}

}  // namespace
}  // namespace hsdp
