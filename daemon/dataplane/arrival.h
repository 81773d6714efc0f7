// One member's submission of one operation as the dataplane carries it:
// validated (validate.h), resolved to its buffers, and tagged with the group
// epoch and sequence number it arrives at. Plain data, moved from the
// dispatcher to its group, through the operation matcher (op_matcher.h) and
// the engine task, to the completion written back to the member's session.
// A value type: no thread-safety of its own.
#ifndef HSDP_DAEMON_DATAPLANE_ARRIVAL_H_
#define HSDP_DAEMON_DATAPLANE_ARRIVAL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "daemon/engine/engine.h"
#include "daemon/session/mapped_buffer.h"
#include "daemon/session/session.h"
#include "hsdp/shm/layout.h"

namespace hsdp {

// One member's submission of one operation, validated and resolved.
struct Arrival {
  std::shared_ptr<Session> session;
  shm::OpDescriptor desc{};
  uint32_t epoch = 1;    // epoch of the group it arrives at
  uint64_t seq = 0;      // sequence number in that epoch
  bool phase2 = false;   // second phase of a reduce-scatter+all-reduce
  int shard_size = 0;    // phase 2: size of the member's shard group
  const void* send = nullptr;
  void* recv = nullptr;
  std::shared_ptr<MappedBuffer> send_buf;  // keep the mappings alive
  std::shared_ptr<MappedBuffer> recv_buf;
  int64_t first_ns = 0;   // when the operation first entered the daemon
  int64_t arrived_ns = 0; // when this submission reached this group
  std::vector<uint64_t> depends_on;  // phase 2: the first phase's ticket
  // Uneven all-to-all: elements sent to / received from each group rank
  // (copied out of shared memory); empty for equal blocks.
  std::vector<uint64_t> send_counts;
  std::vector<uint64_t> recv_counts;
  // ... and the bytes they add up to (checked against the buffers).
  uint64_t splits_send_bytes = 0;
  uint64_t splits_recv_bytes = 0;
  absl::Status rejected;  // not OK: this member's submission was invalid
  // Device buffers (kFeatureDeviceMemory): `send` / `recv` are addresses in
  // the daemon's device address space on `device`; the keeps hold their
  // mappings until the operation completes. wait_event: the producer event
  // the engine's stream waits on; done_event: the completion event it
  // records (DeviceApi handles, 0 = none), reported to the client as
  // completion_event_id (ring slot + 1) in the completion record.
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;
  std::shared_ptr<const void> send_keep;
  std::shared_ptr<const void> recv_keep;
  uint64_t wait_event = 0;
  uint64_t done_event = 0;
  uint64_t completion_event_id = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_ARRIVAL_H_
