// The members-agree rule of a collective (agreement.h), without a group.
#include "daemon/dataplane/agreement.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;

Arrival Make(Collective c, uint64_t count, DataType dtype = DataType::kFloat32) {
  Arrival a;
  a.desc.collective = static_cast<uint8_t>(c);
  a.desc.count = count;
  a.desc.dtype = static_cast<uint8_t>(dtype);
  a.desc.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  a.desc.premul_factor = 1.0;
  a.desc.pre_divide = 1.0;
  a.desc.post_divide = 1.0;
  return a;
}

// Local members 0 and 1 are group ranks 1 and 3 of global ranks {10, 11, 12, 13}.
const std::vector<int> kLocal = {1, 3};
const std::vector<int> kRanks = {10, 11, 12, 13};

std::string Check(const Arrival& a, const Arrival& b) {
  return MembersDisagree({{0, a}, {1, b}}, kLocal, kRanks);
}

TEST(AgreementTest, IdenticalSubmissionsAgree) {
  const Arrival a = Make(Collective::kAllReduce, 64);
  EXPECT_EQ(Check(a, a), "");
  EXPECT_EQ(MembersDisagree({}, kLocal, kRanks), "");
  EXPECT_EQ(MembersDisagree({{0, a}}, kLocal, kRanks), "");
}

TEST(AgreementTest, EachFieldIsNamedWithTheGlobalRanks) {
  const Arrival a = Make(Collective::kAllReduce, 64);
  Arrival b = Make(Collective::kAllReduce, 65);
  EXPECT_EQ(Check(a, b), "members disagree: count: rank 11 has 64, rank 13 has 65");
  b = Make(Collective::kAllReduce, 64, DataType::kFloat16);
  EXPECT_THAT(Check(a, b), HasSubstr("dtype: rank 11 has float32, rank 13 has float16"));
  b = Make(Collective::kAllGather, 64);
  EXPECT_THAT(Check(a, b), HasSubstr("collective: rank 11 has all_reduce"));
  b = a;
  b.kind = MemoryKind::kDevice;
  EXPECT_THAT(Check(a, b), HasSubstr("memory: rank 11 has host buffers, rank 13 has device buffers"));
  // Two problems: both named, in one message.
  b = Make(Collective::kAllReduce, 65, DataType::kFloat16);
  EXPECT_THAT(Check(a, b), AllOf(HasSubstr("count:"), HasSubstr("dtype:")));
}

TEST(AgreementTest, ReductionsAgreeOnOpDtypeAndFactorsBitForBit) {
  const Arrival a = Make(Collective::kReduceScatter, 64);
  Arrival b = a;
  b.desc.reduce_op = static_cast<uint8_t>(ReduceOp::kMax);
  EXPECT_THAT(Check(a, b), HasSubstr("reduce_op:"));
  b = a;
  b.desc.reduce_dtype = static_cast<uint8_t>(DataType::kFloat32);
  EXPECT_THAT(Check(a, b), HasSubstr("reduce_dtype: rank 11 has (buffer dtype)"));
  b = a;
  b.desc.pre_divide = 2.0;
  EXPECT_THAT(Check(a, b), HasSubstr("pre_divide: rank 11 has 1, rank 13 has 2"));
  // -0.0 == 0.0 arithmetically, but not bit for bit: a disagreement.
  Arrival z = a, nz = a;
  z.desc.premul_factor = 0.0;
  nz.desc.premul_factor = -0.0;
  EXPECT_THAT(Check(z, nz), HasSubstr("premul_factor"));
  // The same NaN agrees with itself.
  Arrival n1 = a;
  n1.desc.post_divide = std::nan("");
  EXPECT_EQ(Check(n1, n1), "");
  // Not a reduction: the reduce op is not compared.
  Arrival g1 = Make(Collective::kAllGather, 8), g2 = g1;
  g2.desc.reduce_op = static_cast<uint8_t>(ReduceOp::kMax);
  EXPECT_EQ(Check(g1, g2), "");
}

TEST(AgreementTest, BroadcastRootAndAllToAllSplitsMustMatch) {
  Arrival a = Make(Collective::kBroadcast, 16), b = a;
  b.desc.root = 2;
  EXPECT_THAT(Check(a, b), HasSubstr("root: rank 11 has 0, rank 13 has 2"));
  // Uneven all-to-all: group ranks 1 and 3 exchange; counts by group rank.
  Arrival s1 = Make(Collective::kAllToAll, 16), s3 = s1;
  s1.send_counts = {0, 1, 0, 5};
  s1.recv_counts = {0, 1, 0, 4};
  s3.send_counts = {0, 4, 0, 2};
  s3.recv_counts = {0, 5, 0, 2};
  EXPECT_EQ(Check(s1, s3), "");
  s3.recv_counts = {0, 6, 0, 2};  // expects 6 from rank 11, which sends 5
  EXPECT_THAT(Check(s1, s3),
              HasSubstr("splits: rank 11 sends 5 elements to rank 13, which expects 6"));
  Arrival even = Make(Collective::kAllToAll, 16);
  EXPECT_THAT(Check(s1, even), HasSubstr("splits: rank 11 has splits, rank 13 has equal blocks"));
}

}  // namespace
}  // namespace hsdp
