// Device buffers and device events the trainers share with the daemon, per
// session, with a mapping cache.
//
// A client registers a range of one of its device allocations: a VMM
// allocation exported as a POSIX fd (passed over the data connection like a
// memfd), or a legacy IPC handle of the allocation base plus an offset
// (PyTorch's caching allocator). Many buffers usually live in one
// allocation, so the allocation is mapped once and shared by reference count.
//
// Cache key = the allocation's identity, never its address: the legacy
// handle bytes; for a VMM fd the allocation id the client sends (checked:
// the fd must be the open file registered under that id, kcmp(2)) or, with
// no id, the open file itself (kcmp against the fds the daemon keeps) —
// never the inode, which is the driver control device's for every exported
// cuMem fd — plus the client's allocation generation (the client bumps it whenever its
// allocator hands out an address again). A freed-and-reused address
// therefore always misses and is mapped afresh; the stale mapping stays
// only as long as buffers registered on it do. A mapping is unmapped when
// its last buffer is freed, and every mapping of a session when the session
// ends (a client that dies leaks nothing).
//
// Events: a client registers interprocess events (producer events it
// records before submitting). The daemon opens them once; descriptors name
// them by id (OpDescriptor::event_id with kFlagWaitEvent).
//
// Limits are checked before anything is imported: buffers and mappings per
// session, mapped bytes per session, events per session, and mappings on the
// node. Everything a client sends is validated (kind, device ordinal,
// sizes, offset + size inside the allocation).
//
// Ids: device buffer ids have kDeviceBufferIdBit set so a descriptor's
// buffer id says which registry holds it.
//
// Thread-safety: all methods are thread-safe (one mutex; imports run under
// it — they are rare, control-plane calls).
#ifndef HSDP_DAEMON_SESSION_DEVICE_BUFFERS_H_
#define HSDP_DAEMON_SESSION_DEVICE_BUFFERS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/device/device_api.h"
#include "hsdp/common/unique_fd.h"
#include "hsdp/shm/layout.h"

namespace hsdp {

using shm::kDeviceBufferIdBit;  // defined with the descriptor layout
using shm::IsDeviceBufferId;

struct DeviceBufferLimits {
  uint32_t max_buffers_per_session = 4096;
  uint32_t max_mappings_per_session = 1024;
  uint64_t max_mapped_bytes_per_session = 1ull << 40;
  uint32_t max_events_per_session = 1024;
  uint32_t max_node_mappings = 16384;
};

// What a client asks to register (already read off the wire / socket).
struct DeviceBufferRequest {
  device::HandleKind kind = device::HandleKind::kInvalid;
  int device = -1;
  device::IpcHandleBytes handle{};  // kLegacyIpc
  UniqueFd fd;                      // kVmmFd
  uint64_t allocation_bytes = 0;    // kVmmFd: size of the exported allocation
  uint64_t offset = 0;              // of the buffer in the allocation
  uint64_t size_bytes = 0;
  uint64_t generation = 0;          // client's allocation generation
  // kVmmFd: the client's name for the exported allocation (0: none). Buffers
  // with one id share a mapping; checked against the open file (kcmp).
  uint64_t allocation_id = 0;
  std::string name;                 // for status output
};

// A resolved range of a device buffer, in the daemon's address space.
// `keep` holds the buffer's mapping (or daemon-owned range): a buffer freed,
// or a session ended, while an operation still uses the range is unmapped
// only when that operation drops its DeviceRange.
struct DeviceRange {
  int device = -1;
  device::DevicePtr ptr = 0;
  uint64_t bytes = 0;
  std::shared_ptr<const void> keep;
};

struct DeviceBufferStats {
  uint32_t buffers = 0;
  uint32_t mappings = 0;
  uint64_t mapped_bytes = 0;
  uint32_t events = 0;
};

class DeviceBufferRegistry {
 public:
  // `dev` must outlive the registry.
  DeviceBufferRegistry(device::DeviceApi* dev, DeviceBufferLimits limits = {});
  ~DeviceBufferRegistry();

  // Returns the new buffer id (with kDeviceBufferIdBit). INVALID_ARGUMENT
  // naming the field, RESOURCE_EXHAUSTED naming the limit, or the import's
  // error.
  absl::StatusOr<uint64_t> Register(uint64_t session_id, DeviceBufferRequest request);
  // A buffer over daemon-owned device memory (a DevicePool range): nothing
  // is imported; `release` runs once when the buffer is freed or the session
  // ends (outside the registry's lock). Counts against the buffer limit.
  absl::StatusOr<uint64_t> RegisterOwned(uint64_t session_id, int device, device::DevicePtr ptr,
                                         uint64_t bytes, std::function<void()> release);
  // NOT_FOUND for an unknown id. Unmaps the allocation with its last buffer.
  absl::Status Free(uint64_t session_id, uint64_t buffer_id);
  // [offset, offset + bytes) of buffer `buffer_id`; INVALID_ARGUMENT naming
  // `field` when unknown or out of range.
  absl::StatusOr<DeviceRange> Resolve(uint64_t session_id, uint64_t buffer_id, uint64_t offset,
                                      uint64_t bytes, const char* field) const;

  // Opens a client's interprocess event; returns its id (> 0).
  absl::StatusOr<uint64_t> RegisterEvent(uint64_t session_id, int device,
                                         const device::IpcHandleBytes& handle);
  absl::Status FreeEvent(uint64_t session_id, uint64_t event_id);
  // The opened event (a DeviceApi handle), or INVALID_ARGUMENT ("event_id: ...").
  absl::StatusOr<device::EventHandle> FindEvent(uint64_t session_id, uint64_t event_id,
                                                int device) const;

  // Completion events: daemon-owned interprocess events, one per ring slot
  // of the session, per device. The engine records slot op_id % slots when op
  // op_id finishes (Completion::event_id = slot + 1) and the client's stream
  // waits on it; a slot is reused only after the client consumed its
  // completion, so a client never waits on a later op's record. Created on
  // the first call (RESOURCE_EXHAUSTED above 4096 slots); returns the
  // exported handles in slot order.
  absl::StatusOr<std::vector<device::IpcHandleBytes>> CompletionEvents(uint64_t session_id,
                                                                      int device, uint32_t slots);
  // The event to record when op `op_id` of the session finishes on `device`
  // (FAILED_PRECONDITION when CompletionEvents was not called for it);
  // `event_id` (optional) gets the id the completion record carries (slot + 1).
  absl::StatusOr<device::EventHandle> CompletionEventFor(uint64_t session_id, int device,
                                                         uint64_t op_id,
                                                         uint64_t* event_id = nullptr) const;

  // Frees every buffer, mapping and event of the session. Idempotent.
  void EndSession(uint64_t session_id);

  DeviceBufferStats Stats(uint64_t session_id) const;
  const device::DeviceApi& device_api() const { return *dev_; }
  // Whether this kernel lets the daemon compare two open files (kcmp(2)
  // KCMP_FILE on itself); without it VMM buffers share a mapping only
  // through a client-sent allocation id.
  static bool CanCompareOpenFiles();
  uint32_t node_mappings() const;

 private:
  // Allocation identity: kind, device, identity bytes, generation. Identity:
  // legacy handle bytes; VMM "id:" + the client's allocation id, or "file:" +
  // a per-session number for one open file (never the inode).
  using MappingKey = std::tuple<int, int, std::string, uint64_t>;
  // Unmaps (and closes the VMM fd) when the last holder lets go: the
  // registry's entry, and operations in flight (DeviceRange::keep).
  struct MappingHold;
  struct MappingEntry {
    device::Mapping mapping;
    std::shared_ptr<MappingHold> hold;
    int refs = 0;
  };
  struct Buffer {
    MappingKey key;         // empty kind (0) for daemon-owned ranges
    int device;
    device::DevicePtr ptr;  // start of the buffer in the daemon's space
    uint64_t bytes;
    // The mapping's hold, or for daemon-owned ranges one that gives the range
    // back when the last holder lets go.
    std::shared_ptr<const void> keep;
  };
  struct PerSession {
    std::map<MappingKey, MappingEntry> mappings;
    std::map<uint64_t, Buffer> buffers;
    std::map<uint64_t, std::pair<int, device::EventHandle>> events;
    std::map<int, std::vector<device::EventHandle>> completion;  // by device, slot order
    uint64_t mapped_bytes = 0;
    uint64_t next_buffer = 1;
    uint64_t next_event = 1;
    uint64_t next_file_key = 1;
  };

  absl::StatusOr<MappingKey> KeyOf(PerSession& s, const DeviceBufferRequest& r) const;
  void Unmap(PerSession& s, std::map<MappingKey, MappingEntry>::iterator it);

  device::DeviceApi* const dev_;
  const DeviceBufferLimits limits_;
  mutable std::mutex mu_;
  std::map<uint64_t, PerSession> sessions_;  // guarded by mu_
  uint32_t node_mappings_ = 0;               // guarded by mu_
};

// What a descriptor that names device buffers resolves to.
struct DeviceOperands {
  DeviceRange send;  // bytes 0 when the side moves nothing
  DeviceRange recv;
  device::EventHandle wait_event = 0;  // kFlagWaitEvent: the producer event
};

// Resolves a descriptor's device buffers (send and/or recv ids with
// kDeviceBufferIdBit) and its producer event for session `session_id`.
// `send_bytes` / `recv_bytes` as shm::ComputeOpExtents gives them;
// `device_memory`: kFeatureDeviceMemory was negotiated. Checks: the feature,
// both sides on device memory of one device, ranges inside their buffers,
// an in-place layout when the ranges overlap, the event on the same device.
// INVALID_ARGUMENT naming the descriptor field.
absl::StatusOr<DeviceOperands> ResolveDeviceOperands(const DeviceBufferRegistry& registry,
                                                     uint64_t session_id,
                                                     const shm::OpDescriptor& d,
                                                     uint64_t send_bytes, uint64_t recv_bytes,
                                                     int group_rank, bool device_memory);

}  // namespace hsdp

#endif  // HSDP_DAEMON_SESSION_DEVICE_BUFFERS_H_
