// PlanReduce: which NCCL op, wire dtype and scale kernels a ReduceSpec becomes.
#include "daemon/engine/nccl/reduce_plan.h"

#include "gtest/gtest.h"

namespace hsdp::nccl {
namespace {

ReduceSpec Spec(ReduceOp op, double pre = 1, double post = 1,
                DataType wire = DataType::kInvalid, DataType dtype = DataType::kFloat32) {
  ReduceSpec s;
  s.dtype = dtype;
  s.op = op;
  s.pre_divide = pre;
  s.post_divide = post;
  s.wire_dtype = wire;
  return s;
}

TEST(ReducePlanTest, PlainOpsMapToNcclBuiltins) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kProduct}) {
    auto p = PlanReduce(Spec(op), 4);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->op, op);
    EXPECT_FALSE(p->cast);
    EXPECT_EQ(p->out_scale, 1.0);
    EXPECT_EQ(p->wire, DataType::kFloat32);
  }
}

TEST(ReducePlanTest, PreDivideBecomesAPreMulSumPostDivideAnOutputScale) {
  // SEMANTICS.md: world 8 -> pre 2, post 4, with AVG.
  auto p = PlanReduce(Spec(ReduceOp::kAvg, 2, 4), 8);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->op, ReduceOp::kPremulSum);
  EXPECT_DOUBLE_EQ(p->premul, 0.5);
  EXPECT_DOUBLE_EQ(p->out_scale, 1.0 / 32);
  auto q = PlanReduce(Spec(ReduceOp::kSum, 1, 4), 8);
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->op, ReduceOp::kSum);
  EXPECT_DOUBLE_EQ(q->out_scale, 0.25);
  ReduceSpec pm = Spec(ReduceOp::kPremulSum, 2);
  pm.premul_factor = 0.125;
  auto r = PlanReduce(pm, 8);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->op, ReduceOp::kPremulSum);
  EXPECT_DOUBLE_EQ(r->premul, 0.0625);
}

TEST(ReducePlanTest, ReduceDtypeFusesThePreScaleIntoTheCast) {
  auto p = PlanReduce(Spec(ReduceOp::kAvg, 2, 2, DataType::kBFloat16), 4);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->cast);
  EXPECT_EQ(p->wire, DataType::kBFloat16);
  EXPECT_EQ(p->op, ReduceOp::kSum);
  EXPECT_DOUBLE_EQ(p->in_scale, 0.5);
  EXPECT_DOUBLE_EQ(p->out_scale, 1.0 / 8);
  // A wider wire type for a 16-bit dtype changes nothing (as on the CPU).
  auto q = PlanReduce(Spec(ReduceOp::kSum, 1, 1, DataType::kFloat32, DataType::kBFloat16), 4);
  ASSERT_TRUE(q.ok());
  EXPECT_FALSE(q->cast);
}

TEST(ReducePlanTest, MinMaxScaleAfterwards) {
  auto p = PlanReduce(Spec(ReduceOp::kMax, 2, 4), 8);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->op, ReduceOp::kMax);
  EXPECT_DOUBLE_EQ(p->out_scale, 0.125);
}

TEST(ReducePlanTest, IntegerLimits) {
  EXPECT_TRUE(PlanReduce(Spec(ReduceOp::kSum, 1, 1, DataType::kInvalid, DataType::kInt64), 2).ok());
  EXPECT_EQ(PlanReduce(Spec(ReduceOp::kAvg, 1, 1, DataType::kInvalid, DataType::kInt32), 2)
                .status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(PlanReduce(Spec(ReduceOp::kSum, 2, 1, DataType::kInvalid, DataType::kInt32), 2)
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(PlanReduce(Spec(ReduceOp::kSum, 0, 1), 2).ok());
}

}  // namespace
}  // namespace hsdp::nccl
