#include "hsdp/shm/op_rules.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace hsdp::shm {
namespace {

absl::Status Invalid(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

}  // namespace

absl::Status CheckCount(uint64_t count) {
  if (count > kMaxCount) return Invalid("count", absl::StrCat(count, " is above 2^40"));
  return absl::OkStatus();
}

absl::Status CheckReduceOptions(DataType dtype, ReduceOp op, DataType reduce_dtype,
                                double premul_factor, double pre_divide, double post_divide) {
  const auto op_value = static_cast<uint8_t>(op);
  if (op_value == 0 || op_value > kMaxReduceOp) {
    return Invalid("reduce_op", absl::StrCat("unknown value ", op_value));
  }
  const auto rd = static_cast<uint8_t>(reduce_dtype);
  if (rd > kMaxDataType) return Invalid("reduce_dtype", absl::StrCat("unknown value ", rd));
  if (rd != 0 && !IsFloatingPoint(reduce_dtype)) {
    return Invalid("reduce_dtype", "must be a floating-point type");
  }
  if (!std::isfinite(pre_divide) || pre_divide <= 0) {
    return Invalid("pre_divide", absl::StrCat(pre_divide, " must be finite and > 0"));
  }
  if (!std::isfinite(post_divide) || post_divide <= 0) {
    return Invalid("post_divide", absl::StrCat(post_divide, " must be finite and > 0"));
  }
  if (!std::isfinite(premul_factor)) {
    return Invalid("premul_factor", absl::StrCat(premul_factor, " must be finite"));
  }
  if (!IsFloatingPoint(dtype)) {
    if (rd != 0) return Invalid("reduce_dtype", "integer buffers reduce in their own type");
    if (op == ReduceOp::kPremulSum) {
      return Invalid("reduce_op", "premul_sum needs a floating-point dtype");
    }
    if (pre_divide != 1.0 || post_divide != 1.0) {
      return Invalid("pre_divide", "divide factors need a floating-point dtype");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckDescriptorFields(const OpDescriptor& d, uint64_t features) {
  if (d.collective == 0 || d.collective > kMaxCollective) {
    return Invalid("collective", absl::StrCat("unknown value ", d.collective));
  }
  if ((d.flags & ~kKnownFlags) != 0) {
    return Invalid("flags", absl::StrCat("unknown bits 0x", absl::Hex(d.flags & ~kKnownFlags)));
  }
  if ((d.flags & kFlagWaitEvent) != 0 && (features & kFeatureDeviceMemory) == 0) {
    return Invalid("flags", "wait-event needs the device-memory feature, not negotiated");
  }
  if ((d.flags & kFlagLatencyCritical) != 0 && (features & kFeatureOpPriority) == 0) {
    return Invalid("flags", "latency-critical needs the op-priority feature, not negotiated");
  }
  if ((d.flags & kFlagWaitEvent) == 0 && d.event_id != 0) {
    return Invalid("event_id", "must be 0 without the wait-event flag");
  }
  if (d.reserved0 != 0) return Invalid("reserved0", "must be 0");
  for (uint64_t r : d.reserved1) {
    if (r != 0) return Invalid("reserved1", "must be 0");
  }
  const auto c = static_cast<Collective>(d.collective);
  const bool p2p = c == Collective::kSend || c == Collective::kRecv;
  const bool has_splits = d.splits.buffer_id != 0 || d.splits.offset_bytes != 0;
  if ((features & kFeaturePointToPoint) == 0 &&
      (p2p || c == Collective::kAllToAll || d.peer != 0 || d.tag != 0 || has_splits)) {
    return Invalid("peer", "send, recv and all-to-all need the point-to-point feature, not negotiated");
  }
  if (!p2p && (d.peer != 0 || d.tag != 0)) {
    return Invalid("peer", "peer and tag are for send and recv only; must be 0");
  }
  if (c != Collective::kAllToAll && has_splits) {
    return Invalid("splits", "only an all-to-all takes splits; must be {0, 0}");
  }
  if (p2p) {
    if (d.seq != 0) return Invalid("seq", "send and recv match in posting order; must be 0");
    if (d.peer < (c == Collective::kRecv ? kAnySource : 0)) {
      return Invalid("peer", "must be a group rank (or -1, any source, for recv)");
    }
  }
  if (c != Collective::kReduceScatterAllReduce && (d.group2_id != 0 || d.seq2 != 0 || d.epoch2 != 0)) {
    return Invalid("group2_id", "only a reduce-scatter+all-reduce names a second group");
  }
  if (c == Collective::kBarrier) return absl::OkStatus();  // no data fields
  if (d.dtype == 0 || d.dtype > kMaxDataType) {
    return Invalid("dtype", absl::StrCat("unknown value ", d.dtype));
  }
  if (absl::Status s = CheckCount(d.count); !s.ok()) return s;
  // Buffers are mapped page-aligned; an offset that is a multiple of the
  // element size keeps every element aligned, which the kernels need (an
  // unaligned float load is undefined behaviour; the dispatcher fuzzer found
  // one). Uneven all-to-all counts are uint64.
  const uint64_t es = DataTypeSize(static_cast<DataType>(d.dtype));
  if (es > 1 && d.send.offset_bytes % es != 0) {
    return Invalid("send.offset_bytes",
                   absl::StrCat(d.send.offset_bytes, " is not a multiple of the element size ", es));
  }
  if (es > 1 && d.recv.offset_bytes % es != 0) {
    return Invalid("recv.offset_bytes",
                   absl::StrCat(d.recv.offset_bytes, " is not a multiple of the element size ", es));
  }
  if (d.splits.offset_bytes % sizeof(uint64_t) != 0) {
    return Invalid("splits.offset_bytes",
                   absl::StrCat(d.splits.offset_bytes, " is not a multiple of 8 (uint64 counts)"));
  }
  if (c == Collective::kReduceScatterAllReduce && d.group2_id == 0) {
    return Invalid("group2_id", "a reduce-scatter+all-reduce needs a replicate group");
  }
  if (!IsReducing(c)) return absl::OkStatus();
  return CheckReduceOptions(static_cast<DataType>(d.dtype), static_cast<ReduceOp>(d.reduce_op),
                            static_cast<DataType>(d.reduce_dtype), d.premul_factor, d.pre_divide,
                            d.post_divide);
}

}  // namespace hsdp::shm
