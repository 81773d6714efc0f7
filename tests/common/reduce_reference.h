// The reduction rule of the tests' independent references (SEMANTICS.md):
// how two ranks' values combine under each operation, and how an integer
// result wraps to its dtype. Kept apart from the engines' kernels, so a
// test never checks a kernel against itself.
#ifndef HSDP_TESTS_COMMON_REDUCE_REFERENCE_H_
#define HSDP_TESTS_COMMON_REDUCE_REFERENCE_H_

#include <algorithm>
#include <cstdint>

#include "hsdp/types.h"

namespace hsdp::testing {

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
