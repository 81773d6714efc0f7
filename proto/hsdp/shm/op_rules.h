// The validation rules of the data plane, defined once. The daemon applies
// them to every descriptor it pops (untrusted input), the C++ client to every
// descriptor before it pushes one, and the Python binding to the options it
// is given, so all three accept and refuse exactly the same things with the
// same messages ("<field>: <what is wrong>").
#ifndef HSDP_SHM_OP_RULES_H_
#define HSDP_SHM_OP_RULES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "hsdp/shm/layout.h"
#include "hsdp/types.h"

namespace hsdp::shm {

// Largest element count of one operation (bounds every byte computation).
inline constexpr uint64_t kMaxCount = uint64_t{1} << 40;

// Collectives that combine values (and so read the reduction fields).
constexpr bool IsReducing(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter ||
         c == Collective::kReduceScatterAllReduce;
}

// count: 0 (nothing moves; the members still match) to kMaxCount.
absl::Status CheckCount(uint64_t count);

// The reduction options of a reducing collective on buffers of `dtype`:
// op known; pre/post divide finite and > 0; premul factor finite; a reduce
// dtype only for floating-point buffers and only a floating-point one;
// integer buffers take no factors and no premul_sum.
absl::Status CheckReduceOptions(DataType dtype, ReduceOp op, DataType reduce_dtype,
                                double premul_factor, double pre_divide, double post_divide);

// Every descriptor field that can be checked without the group or the
// buffers: collective, dtype, count, reduction options, flags against the
// negotiated `features`, reserved fields zero. INVALID_ARGUMENT naming the
// field.
absl::Status CheckDescriptorFields(const OpDescriptor& d, uint64_t features);

}  // namespace hsdp::shm

#endif  // HSDP_SHM_OP_RULES_H_
