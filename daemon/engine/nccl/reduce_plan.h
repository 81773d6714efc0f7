// How the NCCL engine realises a ReduceSpec on the device: which NCCL op
// (built-in or PreMulSum with which scalar), which dtype travels on the wire,
// and which element-wise kernels run before and after the collective. The
// pre-divide (and a PreMulSum factor) is fused into the cast-in kernel when
// there is a cast, into a PreMulSum op otherwise; the post-divide (and AVG's
// 1/n when ncclAvg cannot be used) runs in the cast-out kernel, or in place.
// Follows the CPU kernels' semantics (daemon/kernels/reduce_kernels.h) up
// to rounding. Pure functions; thread-safe.
#ifndef HSDP_DAEMON_ENGINE_NCCL_REDUCE_PLAN_H_
#define HSDP_DAEMON_ENGINE_NCCL_REDUCE_PLAN_H_

#include "absl/status/statusor.h"
#include "hsdp/kernels/reduce_spec.h"
#include "hsdp/types.h"

namespace hsdp::nccl {

struct DeviceReducePlan {
  ReduceOp op = ReduceOp::kSum;  // NCCL op: kSum, kAvg, kMin, kMax, kProduct, kPremulSum
  double premul = 1.0;           // kPremulSum: the scalar
  DataType wire = DataType::kInvalid;  // dtype the collective runs in
  bool cast = false;             // wire != dtype: cast in to scratch, cast out of it
  double in_scale = 1.0;         // applied by the cast-in kernel (cast only)
  double out_scale = 1.0;        // applied after the collective (cast-out or in place)
};

// `n`: members of the collective. UNIMPLEMENTED naming the combination for
// what the device path does not do (integer AVG / PreMulSum).
absl::StatusOr<DeviceReducePlan> PlanReduce(const ReduceSpec& spec, int n);

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_REDUCE_PLAN_H_
