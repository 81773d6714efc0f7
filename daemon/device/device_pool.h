// DevicePool: the daemon-owned device memory that clients allocate
// communication buffers from — the zero-copy fast path. Per device, one
// exportable allocation made by the daemon, exported to a client once (a
// VMM fd, mapped once by the client), then carved into ranges: allocating
// a buffer is bookkeeping only, on both sides (no export, no import, no
// mapping per buffer). Ranges are 512-byte aligned (the seeds' alignment for
// fused buffer views) and owned by one session; a range is resolved to the
// daemon's address only for its owner.
//
// Limits: a session may hold at most `max_session_fraction` of a device's
// pool; requests are checked before anything changes. Session end frees all
// of its ranges.
//
// Thread-safety: all methods are thread-safe (one mutex).
#ifndef HSDP_DAEMON_DEVICE_DEVICE_POOL_H_
#define HSDP_DAEMON_DEVICE_DEVICE_POOL_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/device/device_api.h"

namespace hsdp::device {

struct PoolRange {
  int device = -1;
  uint64_t offset = 0;  // from the pool's base (what the client adds to its mapping)
  uint64_t bytes = 0;   // rounded up to the alignment
  DevicePtr ptr = 0;    // in the daemon's address space
};

class DevicePool {
 public:
  static constexpr uint64_t kAlign = 512;

  // Allocates `bytes_per_device` on each of `devices` through `dev` (which
  // must outlive the pool). Fails with the allocation's error.
  static absl::StatusOr<std::unique_ptr<DevicePool>> Create(DeviceApi* dev,
                                                            const std::vector<int>& devices,
                                                            uint64_t bytes_per_device,
                                                            double max_session_fraction = 0.5);
  ~DevicePool();

  // The pool of `device` as an fd for a client to map (a new fd per call;
  // the allocation is the same). NOT_FOUND for a device without a pool.
  absl::StatusOr<UniqueFd> Export(int device) const;
  uint64_t pool_bytes(int device) const;

  // A range of `bytes` for `session` on `device`. RESOURCE_EXHAUSTED naming
  // the limit when the pool or the session's share is used up.
  absl::StatusOr<PoolRange> Allocate(uint64_t session, int device, uint64_t bytes);
  // NOT_FOUND unless `offset` is the start of one of the session's ranges.
  absl::Status Free(uint64_t session, int device, uint64_t offset);
  // [offset, offset + bytes) inside one of the session's ranges.
  absl::StatusOr<PoolRange> Resolve(uint64_t session, int device, uint64_t offset,
                                    uint64_t bytes) const;
  void EndSession(uint64_t session);

  uint64_t used_bytes(int device) const;
  uint64_t session_bytes(uint64_t session) const;

 private:
  struct Pool {
    DevicePtr base = 0;
    uint64_t bytes = 0;
    std::map<uint64_t, uint64_t> free;                            // offset -> length
    std::map<uint64_t, std::pair<uint64_t, uint64_t>> used;       // offset -> (length, session)
    uint64_t used_bytes = 0;
  };
  DevicePool(DeviceApi* dev, double fraction) : dev_(dev), fraction_(fraction) {}
  void Release(Pool& p, uint64_t offset);

  DeviceApi* const dev_;
  const double fraction_;
  mutable std::mutex mu_;
  std::map<int, Pool> pools_;                         // by device; guarded by mu_
  std::map<uint64_t, uint64_t> session_bytes_;        // guarded by mu_
};

}  // namespace hsdp::device

#endif  // HSDP_DAEMON_DEVICE_DEVICE_POOL_H_
