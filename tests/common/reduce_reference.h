// The tests' independent references of a reduction (SEMANTICS.md): the
// inputs every rank writes, how two ranks' values combine under each
// operation, how an integer result wraps to its dtype and how close a result
// of each dtype must come. Kept apart from the engines' kernels, so a test
// never checks a kernel against itself.
#ifndef HSDP_TESTS_COMMON_REDUCE_REFERENCE_H_
#define HSDP_TESTS_COMMON_REDUCE_REFERENCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "hsdp/types.h"

namespace hsdp::testing {

// Input of global rank r at element i: small values exact in every dtype.
inline double Input(DataType t, int r, uint64_t i) {
  const int v = int((r * 5 + i * 3 + (i >> 4)) % 9);
  if (t == DataType::kUInt8) return v + 1;
  if (IsFloatingPoint(t)) return (v - 4) * 0.5;
  return v - 4;
}

// How far a result of dtype `t` may be from the reference `expect`
// (integers: exact).
inline double Tolerance(DataType t, double expect) {
  const double mag = std::max(1.0, std::fabs(expect));
  switch (t) {
    case DataType::kFloat16:
      return 2e-3 * mag;
    case DataType::kBFloat16:
      return 1.6e-2 * mag;
    case DataType::kFloat32:
      return 1e-6 * mag;
    case DataType::kFloat64:
      return 1e-12 * mag;
    default:
      return 0;
  }
}

// `acc` combined with the next rank's `x`: min, max, product, or the sum
// (sum, avg and premul_sum add; avg divides once at the end).
template <typename T>
T Combine(ReduceOp op, T acc, T x) {
  switch (op) {
    case ReduceOp::kMin:
      return std::min(acc, x);
    case ReduceOp::kMax:
      return std::max(acc, x);
    case ReduceOp::kProduct:
      return acc * x;
    default:
      return acc + x;
  }
}

// `v` wrapped to the integer dtype `t` as two's complement arithmetic would.
inline double WrapInt(DataType t, int64_t v) {
  switch (t) {
    case DataType::kUInt8:
      return double(uint8_t(v));
    case DataType::kInt32:
      return double(int32_t(uint32_t(v)));
    default:
      return double(v);
  }
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_COMMON_REDUCE_REFERENCE_H_
