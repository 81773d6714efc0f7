#include "daemon/dataplane/validate.h"


#include "absl/strings/str_cat.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp {
namespace {

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

absl::Status ValidateFields(const shm::OpDescriptor& d, uint64_t features) {
  return shm::CheckDescriptorFields(d, features);
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
  if (send_bytes == 0 && recv_bytes == 0) return absl::OkStatus();  // count 0: nothing to name
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
