// FakeDeviceApi: DeviceApi in host memory, for tests and CI machines without
// a GPU. Each "device" is a host arena with a first-fit allocator (so a freed
// address is handed out again, as the CUDA caching allocator does); each
// stream is a thread that runs its queue in order; events carry a record
// generation; IPC handles are real bytes (legacy handles, event handles) or
// real memfds (VMM fds) naming the allocation and its generation, so an
// import can be checked against a freed-and-reused address.
//
// The fake is one process: an import maps to the same host bytes. It keeps
// the bookkeeping a test needs (live mappings, imports per allocation, which
// priority each stream has) and lets a test run host functions on a stream
// (EnqueueHostFn) — the fake NCCL runs its collectives that way, and tests
// use it to hold a "producer" stream back.
//
// Like the driver, and unlike a kinder fake: DestroyStream returns at once
// but the stream's queued work still runs — late, once the events it waits
// on fire (cudaStreamDestroy: "resources are released once the device has
// completed all work"). Kernels (copies, scale/cast, reduce, and the fake
// NCCL's work through CheckAccess) check their operands when they run, not
// when they are enqueued: memory freed or unmapped meanwhile is an illegal
// address, which is sticky for the whole context (as cudaErrorIllegalAddress
// is): every later EventDone reports it, and faults() counts it.
//
// Thread-safety: all methods are thread-safe. Lock order: mu_ before a
// stream's lock; no lock is held while a stream runs a function.
#ifndef HSDP_DAEMON_DEVICE_FAKE_DEVICE_API_H_
#define HSDP_DAEMON_DEVICE_FAKE_DEVICE_API_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/device/device_api.h"

namespace hsdp::device {

// The UUID FakeDeviceApi gives ordinal `device` unless set_uuid changed it.
DeviceUuid FakeUuid(int device);

class FakeDeviceApi : public DeviceApi {
 public:
  // `devices` arenas of `arena_bytes` each. `cross_process` (engine.device:
  // fake, TEST ONLY): imports map other processes' fake device memory
  // (fake_shm.h: memfds and named shm objects) instead of this process's
  // arenas, and interprocess events live in shared memory, so a real hsdpd
  // serves trainer processes that own their "device memory".
  explicit FakeDeviceApi(int devices, uint64_t arena_bytes = 64ull << 20,
                         bool cross_process = false);
  ~FakeDeviceApi() override;

  std::string name() const override { return "fake"; }
  int DeviceCount() const override { return static_cast<int>(arenas_.size()); }
  // Default UUIDs: "hsdp-fake-gpu" + 3 bytes of the ordinal; set_uuid changes one.
  absl::StatusOr<DeviceUuid> UuidOf(int device) const override;

  absl::StatusOr<DevicePtr> Allocate(int device, uint64_t bytes,
                                     AllocSharing sharing = AllocSharing::kPrivate) override;
  absl::Status Free(DevicePtr base) override;
  absl::StatusOr<AddressRange> GetAddressRange(DevicePtr ptr) override;
  absl::StatusOr<IpcHandleBytes> ExportLegacy(DevicePtr base) override;
  absl::StatusOr<UniqueFd> ExportFd(DevicePtr base) override;
  absl::StatusOr<Mapping> ImportLegacy(int device, const IpcHandleBytes& handle) override;
  absl::StatusOr<Mapping> ImportFd(int device, int fd, uint64_t bytes) override;
  absl::Status Unmap(const Mapping& mapping) override;

  absl::StatusOr<StreamHandle> CreateStream(int device, StreamPriority priority) override;
  void DestroyStream(StreamHandle stream) override;

  absl::StatusOr<EventHandle> CreateEvent(int device, bool interprocess) override;
  void DestroyEvent(EventHandle event) override;
  absl::StatusOr<IpcHandleBytes> ExportEvent(EventHandle event) override;
  absl::StatusOr<EventHandle> ImportEvent(int device, const IpcHandleBytes& handle) override;
  absl::Status RecordEvent(EventHandle event, StreamHandle stream) override;
  absl::Status StreamWaitEvent(StreamHandle stream, EventHandle event) override;
  absl::StatusOr<bool> EventDone(EventHandle event) override;

  absl::Status MemcpyAsync(DevicePtr dst, DevicePtr src, uint64_t bytes,
                           StreamHandle stream) override;
  absl::Status ScaleCastAsync(DevicePtr src, DataType from, DevicePtr dst, DataType to,
                              uint64_t count, double scale, StreamHandle stream) override;
  absl::Status ReduceAsync(const std::vector<DevicePtr>& srcs, DataType from, DevicePtr dst,
                           DataType to, uint64_t count, ReduceOp op, double scale,
                           bool accumulate, StreamHandle stream) override;
  absl::Status CopyToDevice(DevicePtr dst, const void* src, uint64_t bytes) override;
  absl::Status CopyToHost(void* dst, DevicePtr src, uint64_t bytes) override;

  // --- test hooks ---
  // Like a device (or container) without POSIX-fd handle support:
  // Allocate(kPosixFd) fails, private allocations still work.
  void set_posix_fd_supported(bool supported);
  // Gives device `device` another UUID (a test that numbers GPUs differently
  // in the trainer and the daemon).
  void set_uuid(int device, const DeviceUuid& uuid);
  // Runs `fn` on the stream's thread in order; a non-OK result becomes the
  // stream's error, reported by the next event recorded on it.
  absl::Status EnqueueHostFn(StreamHandle stream, std::function<absl::Status()> fn);
  // Waits until everything enqueued on `stream` so far has run.
  void SyncStream(StreamHandle stream);
  absl::StatusOr<StreamPriority> PriorityOf(StreamHandle stream) const;
  absl::StatusOr<int> DeviceOf(StreamHandle stream) const;
  // Mappings made by Import* and not unmapped yet.
  int live_mappings() const;
  // Import* calls so far (cache hits do not import).
  int imports() const;
  int live_allocations() const;
  int live_streams() const;
  int live_events() const;
  // Whether [ptr, ptr + bytes) lies inside one arena (a pointer a kernel may touch).
  bool InArena(DevicePtr ptr, uint64_t bytes) const;
  // Whether a kernel may touch [ptr, ptr + bytes) now: inside a live
  // allocation of this API or a live mapping.
  bool Accessible(DevicePtr ptr, uint64_t bytes) const;
  // For kernels running on a stream (the fake NCCL's work): OK when the range
  // is accessible, else records a sticky illegal-address fault naming `what`.
  absl::Status CheckAccess(DevicePtr ptr, uint64_t bytes, const std::string& what);
  // Records a sticky device fault (an illegal address, a kernel of a freed
  // communicator): every later EventDone fails with it.
  void ReportFault(const std::string& what);
  // Faults so far, and the first one's message ("" when none).
  int faults() const;
  std::string first_fault() const;
  // Streams destroyed while work was still queued on them (they finish it late).
  int draining_streams() const;

 private:
  struct Arena;
  struct Allocation {
    int device;
    uint64_t bytes;
    uint64_t generation;  // unique per Allocate: a reused address gets a new one
    bool exportable;      // AllocSharing::kPosixFd
  };
  struct Event;
  struct Stream;

  std::shared_ptr<Stream> FindStream(StreamHandle h) const;
  std::shared_ptr<Event> FindEvent(EventHandle h) const;
  absl::StatusOr<Mapping> ImportRecord(int device, const IpcHandleBytes& record,
                                       uint64_t claimed_bytes);
  IpcHandleBytes MemRecord(DevicePtr base, const Allocation& a) const;
  // `vmm`: the fd's position names the allocation (fakeshm::MapVmmHandle).
  absl::StatusOr<Mapping> ImportForeign(int device, int fd, uint64_t bytes, bool vmm);

  const bool cross_process_;
  bool posix_fd_supported_ = true;  // guarded by mu_
  std::map<int, DeviceUuid> uuids_;  // set_uuid overrides; guarded by mu_

  std::vector<std::unique_ptr<Arena>> arenas_;
  mutable std::mutex mu_;
  std::map<DevicePtr, Allocation> allocations_;          // by base; guarded by mu_
  std::map<uint64_t, Mapping> mappings_;                 // by token; guarded by mu_
  std::map<DevicePtr, uint64_t> foreign_;  // cross-process imports: base -> bytes; guarded by mu_
  // Cross-process legacy opens, like cuIpcOpenMemHandle: opening a handle
  // that is open already returns the same pointer and counts a reference;
  // the memory is unmapped with the last Unmap. Keyed by the shm object
  // (name and inode: a name reused for new memory is another allocation).
  struct LegacyOpen {
    DevicePtr ptr;
    uint64_t bytes;
    int refs;
  };
  std::map<std::string, LegacyOpen> legacy_open_;  // guarded by mu_
  std::map<uint64_t, std::string> legacy_tokens_;  // mapping token -> key; guarded by mu_
  std::map<StreamHandle, std::shared_ptr<Stream>> streams_;  // guarded by mu_
  std::map<EventHandle, std::shared_ptr<Event>> events_;     // guarded by mu_
  // Destroyed streams still running their queue; joined by the destructor.
  std::vector<std::shared_ptr<Stream>> destroyed_;            // guarded by mu_
  int faults_ = 0;                // guarded by mu_
  std::string first_fault_;       // guarded by mu_
  uint64_t next_generation_ = 1;  // guarded by mu_
  // Exported VMM fds are open files of this one file (the driver's control
  // device): they share its inode; record k sits at offset 64 k.
  UniqueFd control_;              // guarded by mu_
  uint64_t next_record_ = 0;      // guarded by mu_
  uint64_t next_handle_ = 1;      // guarded by mu_ (streams, events, mapping tokens)
  int imports_ = 0;               // guarded by mu_
};

}  // namespace hsdp::device

#endif  // HSDP_DAEMON_DEVICE_FAKE_DEVICE_API_H_
