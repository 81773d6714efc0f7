#include "daemon/engine/nccl/reduce_plan.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace hsdp::nccl {

absl::StatusOr<DeviceReducePlan> PlanReduce(const ReduceSpec& spec, int n) {
  DeviceReducePlan p;
  p.wire = spec.dtype;
  if (n < 1) return absl::InvalidArgumentError("reduce plan: no members");
  if (!IsFloatingPoint(spec.dtype)) {
    if (spec.pre_divide != 1.0 || spec.post_divide != 1.0) {
      return absl::InvalidArgumentError("pre/post divide need a floating-point dtype");
    }
    if (spec.op == ReduceOp::kAvg || spec.op == ReduceOp::kPremulSum) {
      return absl::UnimplementedError(absl::StrCat(
          "the nccl engine does not run ", spec.op == ReduceOp::kAvg ? "avg" : "premul_sum",
          " on integer dtype ", std::string(DataTypeName(spec.dtype))));
    }
    p.op = spec.op;
    return p;
  }
  if (!(spec.pre_divide > 0) || !(spec.post_divide > 0)) {
    return absl::InvalidArgumentError("pre/post divide must be > 0");
  }
  const DataType w = spec.wire_dtype;
  const bool narrow = DataTypeSize(spec.dtype) == 2;
  if (w != DataType::kInvalid && w != spec.dtype && !(w == DataType::kFloat32 && narrow)) {
    if (!IsFloatingPoint(w)) return absl::InvalidArgumentError("reduce dtype must be a float type");
    p.cast = true;
    p.wire = w;
  }
  const double pre = spec.pre_divide, post = spec.post_divide;
  double scale_in = 1.0;  // per-input factor before the sum
  switch (spec.op) {
    case ReduceOp::kSum:
      scale_in = 1.0 / pre;
      p.out_scale = 1.0 / post;
      break;
    case ReduceOp::kAvg:
      if (pre == 1.0 && post == 1.0 && !p.cast) {
        p.op = ReduceOp::kAvg;
        return p;
      }
      scale_in = 1.0 / pre;
      p.out_scale = 1.0 / (post * n);
      break;
    case ReduceOp::kPremulSum:
      scale_in = spec.premul_factor / pre;
      p.out_scale = 1.0 / post;
      break;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      // Positive factors commute with min/max.
      p.op = spec.op;
      p.out_scale = 1.0 / (pre * post);
      return p;
    case ReduceOp::kProduct:
      p.op = spec.op;
      p.out_scale = 1.0 / (post * std::pow(pre, n));
      return p;
    default:
      return absl::InvalidArgumentError("unknown reduce op");
  }
  if (scale_in == 1.0) {
    p.op = ReduceOp::kSum;
  } else if (p.cast) {
    p.op = ReduceOp::kSum;  // the factor rides in the cast-in kernel
    p.in_scale = scale_in;
  } else {
    p.op = ReduceOp::kPremulSum;
    p.premul = scale_in;
  }
  return p;
}

}  // namespace hsdp::nccl
