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

// Whether overlapping send [send, +send_bytes) and recv [recv, +recv_bytes)
// ranges (addresses in one space) form the collective's in-place layout:
// the same range for all-reduce / broadcast; this rank's slice of the larger
// buffer for all-gather (send = recv + rank * unit) and reduce-scatter
// (recv = send + rank * unit); never for all-to-all. `unit` = count * element
// size. Any other overlap is refused (host and device buffers alike).
constexpr bool InPlaceLayout(Collective c, uint64_t send, uint64_t recv, uint64_t unit,
                             int group_rank) {
  switch (c) {
    case Collective::kAllGather: return send == recv + uint64_t(group_rank) * unit;
    case Collective::kReduceScatter:
    case Collective::kReduceScatterAllReduce: return recv == send + uint64_t(group_rank) * unit;
    case Collective::kAllToAll: return false;  // blocks move between ranks
    default: return send == recv;
  }
}
inline constexpr char kNotInPlaceMessage[] =
    "send and recv overlap but are not an in-place layout (same range for "
    "all-reduce/broadcast; this rank's slice of the larger buffer for "
    "all-gather/reduce-scatter)";

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
