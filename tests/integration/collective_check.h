// The independent reference (computed in double) of the multi-process
// collective tests, over the inputs of common/reduce_reference.h.
#ifndef HSDP_TESTS_INTEGRATION_COLLECTIVE_CHECK_H_
#define HSDP_TESTS_INTEGRATION_COLLECTIVE_CHECK_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/reduce_reference.h"  // Input, Tolerance, Combine, WrapInt
#include "hsdp/types.h"

namespace hsdp::testing {

inline double Tolerance(DataType t, const ReduceOptions& o, double expect) {
  double tol = Tolerance(t, expect);
  if (o.reduce_dtype != DataType::kInvalid) tol = std::max(tol, Tolerance(o.reduce_dtype, expect));
  return tol;
}

// Reduction over the inputs of `ranks` at element i, as SEMANTICS.md defines it.
template <typename Ranks>
double Reference(DataType t, const ReduceOptions& o, const Ranks& ranks, uint64_t i) {
  const int n = static_cast<int>(std::size(ranks));
  if (!IsFloatingPoint(t)) {
    bool first = true;
    int64_t acc = 0;
    for (int r : ranks) {
      const int64_t x = int64_t(Input(t, r, i));
      acc = first ? x : Combine(o.op, acc, x);
      first = false;
    }
    double w = WrapInt(t, acc);
    if (o.op == ReduceOp::kAvg) w = std::trunc(w / n);
    return w;
  }
  bool first = true;
  double acc = 0;
  for (int r : ranks) {
    double x = Input(t, r, i) / o.pre_divide;
    if (o.op == ReduceOp::kPremulSum) x *= o.premul_factor;
    acc = first ? x : Combine(o.op, acc, x);
    first = false;
  }
  acc /= o.post_divide;
  if (o.op == ReduceOp::kAvg) acc /= n;
  return acc;
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_COLLECTIVE_CHECK_H_
