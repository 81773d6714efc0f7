#include "daemon/dataplane/validate.h"


#include <cstring>

#include "absl/strings/str_cat.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp {
namespace {

constexpr int kMaxSplitGroupSize = 8192;

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

// Copies an all-to-all's per-rank counts out of shared memory (so the client
// cannot change them after the check) and computes the extents they imply.
absl::Status ReadSplits(const shm::BufRef& ref, int group_size, uint64_t es,
                        const Session& session, Arrival* a, shm::OpExtents* ext) {
  if (group_size > kMaxSplitGroupSize) {
    return Invalid("splits", absl::StrCat("uneven all-to-all is limited to groups of ",
                                          kMaxSplitGroupSize, " ranks"));
  }
  std::shared_ptr<MappedBuffer> buf;
  char* p = nullptr;
  const uint64_t n = static_cast<uint64_t>(group_size);
  if (absl::Status s = Resolve("splits", ref, 2 * n * sizeof(uint64_t), session, &buf, &p); !s.ok()) {
    return s;
  }
  a->send_counts.resize(n);
  a->recv_counts.resize(n);
  std::memcpy(a->send_counts.data(), p, n * sizeof(uint64_t));
  std::memcpy(a->recv_counts.data(), p + n * sizeof(uint64_t), n * sizeof(uint64_t));
  uint64_t send_total = 0, recv_total = 0;
  for (uint64_t i = 0; i < n; ++i) {
    if (a->send_counts[i] > shm::kMaxCount || a->recv_counts[i] > shm::kMaxCount) {
      return Invalid("splits", absl::StrCat("count for rank ", i, " is above 2^40"));
    }
    send_total += a->send_counts[i];  // <= 2^13 * 2^40: no overflow
    recv_total += a->recv_counts[i];
  }
  if (send_total > shm::kMaxCount || recv_total > shm::kMaxCount) {
    return Invalid("splits", "the counts add up to more than 2^40 elements");
  }
  ext->send_bytes = send_total * es;
  ext->recv_bytes = recv_total * es;
  a->splits_send_bytes = ext->send_bytes;
  a->splits_recv_bytes = ext->recv_bytes;
  return absl::OkStatus();
}

// The device side of ResolveBuffers: ranges, producer event and completion
// event from the registry (ResolveDeviceOperands holds the rules).
absl::Status ResolveDevice(const shm::OpDescriptor& d, int group_rank, uint64_t send_bytes,
                           uint64_t recv_bytes, const Session& session,
                           const DeviceBufferRegistry* registry, Arrival* a) {
  const bool negotiated = (session.info().features & shm::kFeatureDeviceMemory) != 0;
  if (registry == nullptr || !negotiated) {
    return Invalid(IsDeviceBufferId(d.send.buffer_id) ? "send.buffer_id" : "recv.buffer_id",
                   registry == nullptr
                       ? "names a device buffer, but this hsdpd runs no device engine"
                       : "device buffers need the device-memory feature, which this session "
                         "did not negotiate");
  }
  const auto c = static_cast<Collective>(d.collective);
  if (c == Collective::kSend || c == Collective::kRecv) {
    return Invalid("collective", "send and recv on device buffers are not supported yet");
  }
  if (d.splits.buffer_id != 0) {
    return Invalid("splits", "uneven all-to-all on device buffers is not supported yet");
  }
  absl::StatusOr<DeviceOperands> ops = ResolveDeviceOperands(
      *registry, session.id(), d, send_bytes, recv_bytes, group_rank, negotiated);
  if (!ops.ok()) return ops.status();
  a->kind = MemoryKind::kDevice;
  a->device = send_bytes > 0 ? ops->send.device : ops->recv.device;
  a->send = reinterpret_cast<const void*>(ops->send.ptr);
  a->recv = reinterpret_cast<void*>(ops->recv.ptr);
  a->send_keep = std::move(ops->send.keep);
  a->recv_keep = std::move(ops->recv.keep);
  a->wait_event = ops->wait_event;
  // The completion event of the op's ring slot, when the client asked for
  // completion events on this device (GetCompletionEvents); else none.
  uint64_t event_id = 0;
  if (absl::StatusOr<device::EventHandle> done =
          registry->CompletionEventFor(session.id(), a->device, d.op_id, &event_id);
      done.ok()) {
    a->done_event = *done;
    a->completion_event_id = event_id;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateFields(const shm::OpDescriptor& d, uint64_t features) {
  return shm::CheckDescriptorFields(d, features);
}

absl::Status ResolveBuffers(const shm::OpDescriptor& d, int group_rank, int group_size,
                            const Session& session, const DeviceBufferRegistry* device_buffers,
                            Arrival* a) {
  const auto c = static_cast<Collective>(d.collective);
  if (c == Collective::kBarrier) {
    if ((d.flags & shm::kFlagWaitEvent) != 0) {
      return Invalid("event_id", "a barrier moves no data and takes no producer event");
    }
    return absl::OkStatus();
  }
  if (c == Collective::kBroadcast && (d.root < 0 || d.root >= group_size)) {
    return Invalid("root", absl::StrCat(d.root, " is not a rank of a group of size ", group_size));
  }
  if (c == Collective::kSend || c == Collective::kRecv) {
    if (d.peer >= group_size || d.peer == group_rank) {
      return Invalid("peer", absl::StrCat(d.peer, " is not another rank of a group of size ",
                                          group_size, " (this rank is ", group_rank, ")"));
    }
  }
  const uint64_t es = DataTypeSize(static_cast<DataType>(d.dtype));
  const uint64_t unit = d.count * es;  // fits: count <= 2^40, es <= 8
  shm::OpExtents ext = shm::ComputeOpExtents(c, d.count, es, group_size);
  if (c == Collective::kAllToAll && (d.splits.buffer_id != 0 || d.splits.offset_bytes != 0)) {
    if (absl::Status s = ReadSplits(d.splits, group_size, es, session, a, &ext); !s.ok()) return s;
  }
  const uint64_t send_bytes = ext.send_bytes, recv_bytes = ext.recv_bytes;
  if (IsDeviceBufferId(d.send.buffer_id) || IsDeviceBufferId(d.recv.buffer_id)) {
    return ResolveDevice(d, group_rank, send_bytes, recv_bytes, session, device_buffers, a);
  }
  if ((d.flags & shm::kFlagWaitEvent) != 0) {
    return Invalid("event_id", "a producer event needs device buffers (these are host buffers)");
  }
  char* send = nullptr;
  char* recv = nullptr;
  // A side that moves no bytes names no buffer (count 0, the other side of send/recv).
  if (send_bytes > 0) {
    if (absl::Status s = Resolve("send", d.send, send_bytes, session, &a->send_buf, &send); !s.ok()) return s;
  }
  if (recv_bytes > 0) {
    if (absl::Status s = Resolve("recv", d.recv, recv_bytes, session, &a->recv_buf, &recv); !s.ok()) return s;
  }
  if (send_bytes == 0 || recv_bytes == 0) {
    a->send = send;
    a->recv = recv;
    return absl::OkStatus();
  }
  const auto s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  if (s < r + recv_bytes && r < s + send_bytes &&
      !shm::InPlaceLayout(c, s, r, unit, group_rank)) {
    return Invalid("recv.offset_bytes", shm::kNotInPlaceMessage);
  }
  a->send = send;
  a->recv = recv;
  return absl::OkStatus();
}

}  // namespace hsdp
