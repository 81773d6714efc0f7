#include "arguments.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "errors.h"

namespace hsdp::python {

namespace {

constexpr const char* kDtypeNames =
    "float32, float16, bfloat16, float64, int32, int64, uint8 (aliases fp32, fp16, half, bf16, "
    "fp64, double, float, int, long)";
constexpr const char* kReduceOpNames = "sum, avg, premul_sum, min, max, product";

}  // namespace

DataType ParseDtypeOrThrow(const std::string& name, const char* field) {
  DataType t = ParseDataType(name);
  if (t == DataType::kInvalid) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat(field, ": unknown dtype '", name, "'; expected one of ", kDtypeNames)));
  }
  return t;
}

absl::Duration SecondsOrInfinite(std::optional<double> seconds) {
  if (!seconds.has_value()) return absl::InfiniteDuration();
  const double v = *seconds;
  if (std::isnan(v) || v < 0) {
    ThrowStatus(
        absl::InvalidArgumentError(absl::StrCat("timeout: must be >= 0 seconds or None, got ", v)));
  }
  if (std::isinf(v)) return absl::InfiniteDuration();
  return absl::Seconds(v);
}

ReduceOptions MakeReduceOptions(const std::string& op, double premul, double pre_divide,
                                double post_divide, const std::optional<std::string>& rdtype) {
  ReduceOptions r;
  r.op = ParseReduceOp(op);
  if (r.op == ReduceOp::kInvalid) {
    ThrowStatus(absl::InvalidArgumentError(
        absl::StrCat("op: unknown reduce op '", op, "'; expected one of ", kReduceOpNames)));
  }
  // The factors are checked, with the buffer dtype, by the client library's
  // Submit (hsdp/shm/op_rules.h: the daemon's rules, defined once).
  r.premul_factor = premul;
  r.pre_divide = pre_divide;
  r.post_divide = post_divide;
  if (rdtype.has_value()) {
    r.reduce_dtype = ParseDtypeOrThrow(*rdtype, "reduce_dtype");
  }
  return r;
}

}  // namespace hsdp::python
