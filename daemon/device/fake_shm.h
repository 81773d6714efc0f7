// Cross-process fake device memory and events (TEST ONLY): what lets a real
// hsdpd started with `engine.device: fake` work on "device memory" that
// trainer processes own, so CI runs the whole GPU path end to end without a
// GPU (docs/gpu.md).
//
// The contents of fake device memory live in a shared-memory file:
//   * VMM handle: an anonymous memfd of the allocation's size, passed over the
//     data connection as a device handle (shm::kFdKindDeviceHandle); the
//     daemon maps the fd.
//   * legacy handle: 64 bytes naming a POSIX shm object ("/hsdp-fakedev-...")
//     that the daemon opens by name. Reusing a name for a new allocation is
//     how a test recreates "the same handle bytes, different memory" — the
//     stale-mapping hazard the registry's generation guards against.
//   * interprocess event: 64 bytes naming a POSIX shm object holding two
//     counters (records so far, records completed); a record increments the
//     first, the work it captures sets the second when done. Waiting on an
//     event waits for the record count seen at wait time.
//
// Used by FakeDeviceApi in cross-process mode (the daemon side) and by
// FakeTrainerDevice (the trainer side: allocate, export, record events).
// Nothing here touches a GPU; none of it is used with engine.device: cuda.
//
// Thread-safety: FakeTrainerDevice is thread-safe; the free functions are.
#ifndef HSDP_DAEMON_DEVICE_FAKE_SHM_H_
#define HSDP_DAEMON_DEVICE_FAKE_SHM_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/device/device_api.h"
#include "hsdp/common/unique_fd.h"

namespace hsdp::device::fakeshm {

inline constexpr uint64_t kLegacyMagic = 0x434745484D485346ull;  // "FSHMHGEC"
inline constexpr uint64_t kEventMagic = 0x544E5645484D5346ull;   // "FSHMEVNT"
inline constexpr size_t kMaxNameBytes = kIpcHandleBytes - 8;     // incl. the NUL

// The shared state of an interprocess fake event.
struct EventBlock {
  std::atomic<uint64_t> recorded;
  std::atomic<uint64_t> completed;
};

// Handle bytes naming shm object `name` (INVALID_ARGUMENT when too long).
absl::StatusOr<IpcHandleBytes> NameHandle(uint64_t magic, const std::string& name);
// The name a handle carries, or INVALID_ARGUMENT (wrong magic, no NUL, a
// name that is not "/hsdp-fake...": the daemon opens nothing else).
absl::StatusOr<std::string> HandleName(uint64_t magic, const IpcHandleBytes& handle);

// Maps a whole shm file (memfd or shm object) read-write. `min_bytes`: the
// file must be at least this large.
struct MappedFile {
  void* data = nullptr;
  uint64_t bytes = 0;
};
absl::StatusOr<MappedFile> MapFile(int fd, uint64_t min_bytes);
// A VMM handle: `bytes` of the file from the open file's position (page
// aligned) — exported VMM fds are open files of one file, like the driver's
// (they share its inode); the position names the allocation. `bytes` 0:
// the rest of the file.
absl::StatusOr<MappedFile> MapVmmHandle(int fd, uint64_t bytes);

// An event block: created (and named) or opened by name, mapped.
class SharedEvent {
 public:
  ~SharedEvent();
  static absl::StatusOr<std::unique_ptr<SharedEvent>> Create();
  static absl::StatusOr<std::unique_ptr<SharedEvent>> Open(const IpcHandleBytes& handle);
  EventBlock* block() const { return block_; }
  const IpcHandleBytes& handle() const { return handle_; }

 private:
  SharedEvent() = default;
  EventBlock* block_ = nullptr;
  IpcHandleBytes handle_{};
  std::string name_;  // unlinked by its creator on destruction
  bool owner_ = false;
};

// The trainer side (tests): fake device memory and producer events.
class FakeTrainerDevice {
 public:
  struct Allocation {
    void* data = nullptr;  // the "device" bytes, directly addressable here
    uint64_t bytes = 0;
    UniqueFd fd;             // VMM: the memfd to pass as a device handle
    IpcHandleBytes handle{}; // legacy: the handle bytes
    std::string name;        // legacy: the shm object
  };
  ~FakeTrainerDevice();

  // A VMM-style allocation: a page-aligned range of this trainer's one
  // "control" memfd; `fd` is a new open file of it positioned at the range,
  // so every VMM fd of a trainer has the same inode, as the driver's do.
  absl::StatusOr<std::unique_ptr<Allocation>> AllocateVmm(uint64_t bytes);
  // A legacy-IPC-style allocation named `slot` (reusing a slot after
  // FreeLegacy gives the same handle bytes for new memory).
  absl::StatusOr<std::unique_ptr<Allocation>> AllocateLegacy(uint64_t bytes, int slot);
  // Unmaps (and unlinks a legacy allocation's name).
  static void Free(std::unique_ptr<Allocation> a);

  // A producer event: Record() before submitting marks a record pending;
  // Complete() marks every record so far done (the producer "kernel"
  // finished). Handle() is what RegisterDeviceEvent takes.
  struct ProducerEvent {
    std::unique_ptr<SharedEvent> shared;
    void Record() { shared->block()->recorded.fetch_add(1); }
    void Complete() {
      shared->block()->completed.store(shared->block()->recorded.load());
    }
  };
  absl::StatusOr<std::unique_ptr<ProducerEvent>> CreateEvent();

  // Waits (CPU, bounded) until the daemon's completion event `handle` has no
  // record pending. DEADLINE_EXCEEDED on timeout.
  static absl::Status WaitEvent(const IpcHandleBytes& handle, absl::Duration timeout);

 private:
  std::mutex mu_;
  UniqueFd control_;      // guarded by mu_
  uint64_t next_off_ = 0; // guarded by mu_
};

}  // namespace hsdp::device::fakeshm

#endif  // HSDP_DAEMON_DEVICE_FAKE_SHM_H_
