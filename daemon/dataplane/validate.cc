#include "daemon/dataplane/validate.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace hsdp {
namespace {

constexpr uint64_t kMaxCount = uint64_t{1} << 40;

bool IsReducing(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter ||
         c == Collective::kReduceScatterAllReduce;
}

absl::Status Invalid(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Resolves [offset, offset + bytes) of `ref` to a pointer.
absl::Status Resolve(const char* name, const shm::BufRef& ref, uint64_t bytes,
                     const Session& session, std::shared_ptr<MappedBuffer>* buf, char** ptr) {
  *buf = session.FindBuffer(ref.buffer_id);
  if (*buf == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ".buffer_id: unknown buffer ", ref.buffer_id, " in session ",
                     session.id()));
  }
  const uint64_t size = (*buf)->size();
  if (ref.offset_bytes > size || bytes > size - ref.offset_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ".offset_bytes: range [", ref.offset_bytes, ", +", bytes, ") is outside buffer ",
        ref.buffer_id, " of ", size, " bytes"));
  }
  *ptr = (*buf)->data() + ref.offset_bytes;
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateFields(const shm::OpDescriptor& d) {
  if (d.collective == 0 || d.collective > kMaxCollective) {
    return Invalid("collective", absl::StrCat("unknown value ", d.collective));
  }
  const auto c = static_cast<Collective>(d.collective);
  if (c == Collective::kBarrier) return absl::OkStatus();
  if (d.dtype == 0 || d.dtype > kMaxDataType) {
    return Invalid("dtype", absl::StrCat("unknown value ", d.dtype));
  }
  if (d.count == 0 || d.count > kMaxCount) {
    return Invalid("count", absl::StrCat(d.count, " is outside [1, 2^40]"));
  }
  if (c == Collective::kReduceScatterAllReduce && d.group2_id == 0) {
    return Invalid("group2_id", "a reduce-scatter+all-reduce needs a replicate group");
  }
  if (!IsReducing(c)) return absl::OkStatus();
  const auto dtype = static_cast<DataType>(d.dtype);
  if (d.reduce_op == 0 || d.reduce_op > kMaxReduceOp) {
    return Invalid("reduce_op", absl::StrCat("unknown value ", d.reduce_op));
  }
  const auto op = static_cast<ReduceOp>(d.reduce_op);
  if (d.reduce_dtype > kMaxDataType) {
    return Invalid("reduce_dtype", absl::StrCat("unknown value ", d.reduce_dtype));
  }
  if (d.reduce_dtype != 0 && !IsFloatingPoint(static_cast<DataType>(d.reduce_dtype))) {
    return Invalid("reduce_dtype", "must be a floating-point type");
  }
  if (!std::isfinite(d.pre_divide) || d.pre_divide <= 0) {
    return Invalid("pre_divide", absl::StrCat(d.pre_divide, " must be finite and > 0"));
  }
  if (!std::isfinite(d.post_divide) || d.post_divide <= 0) {
    return Invalid("post_divide", absl::StrCat(d.post_divide, " must be finite and > 0"));
  }
  if (!std::isfinite(d.premul_factor)) {
    return Invalid("premul_factor", absl::StrCat(d.premul_factor, " must be finite"));
  }
  if (!IsFloatingPoint(dtype)) {
    if (d.reduce_dtype != 0) return Invalid("reduce_dtype", "integer buffers reduce in their own type");
    if (op == ReduceOp::kPremulSum) return Invalid("reduce_op", "premul_sum needs a floating-point dtype");
    if (d.pre_divide != 1.0 || d.post_divide != 1.0) {
      return Invalid("pre_divide", "divide factors need a floating-point dtype");
    }
  }
  return absl::OkStatus();
}

absl::Status ResolveBuffers(const shm::OpDescriptor& d, int group_rank, int group_size,
                            const Session& session, Arrival* a) {
  const auto c = static_cast<Collective>(d.collective);
  if (c == Collective::kBarrier) return absl::OkStatus();
  if (c == Collective::kBroadcast && (d.root < 0 || d.root >= group_size)) {
    return Invalid("root", absl::StrCat(d.root, " is not a rank of a group of size ", group_size));
  }
  const uint64_t es = DataTypeSize(static_cast<DataType>(d.dtype));
  const uint64_t unit = d.count * es;  // fits: count <= 2^40, es <= 8
  const shm::OpExtents ext = shm::ComputeOpExtents(c, d.count, es, group_size);
  const uint64_t send_bytes = ext.send_bytes, recv_bytes = ext.recv_bytes;
  char* send = nullptr;
  char* recv = nullptr;
  if (absl::Status s = Resolve("send", d.send, send_bytes, session, &a->send_buf, &send); !s.ok()) return s;
  if (absl::Status s = Resolve("recv", d.recv, recv_bytes, session, &a->recv_buf, &recv); !s.ok()) return s;
  // Overlap: exact in-place layouts only.
  if (send < recv + recv_bytes && recv < send + send_bytes) {
    bool ok = false;
    if (c == Collective::kAllGather) ok = send == recv + uint64_t(group_rank) * unit;
    else if (c == Collective::kReduceScatter || c == Collective::kReduceScatterAllReduce)
      ok = recv == send + uint64_t(group_rank) * unit;
    else ok = send == recv;
    if (!ok) {
      return Invalid("recv.offset_bytes",
                     "send and recv overlap but are not an in-place layout (same range for "
                     "all-reduce/broadcast; this rank's slice of the larger buffer for "
                     "all-gather/reduce-scatter)");
    }
  }
  a->send = send;
  a->recv = recv;
  return absl::OkStatus();
}

}  // namespace hsdp
