// NewGroup calls waiting for their ranks to be placed somewhere in the
// cluster (ClusterDirectory::Resolve). Each wait holds a gRPC thread, so the
// number waiting at once is bounded (so waiting groups cannot take every
// thread of the daemon) and shared per uid (limits.uid_share_percent, root
// exempt), so one user's waits cannot refuse everyone else's groups.
//
// Enter hands out a Slot; the wait ends, and its place is given back, when
// the Slot is destroyed or Leave()s.
//
// Thread-safety: thread-safe (the pool's lock is a leaf); a Slot is used by
// one thread.
#ifndef HSDP_DAEMON_JOBS_PLACEMENT_WAITS_H_
#define HSDP_DAEMON_JOBS_PLACEMENT_WAITS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "daemon/util/uid_share.h"

namespace hsdp {

class PlacementWaits {
 public:
  static constexpr int kMaxPlacementWaits = 16;

  // A place among the waits, held by one uid. Move-only.
  class Slot {
   public:
    Slot(Slot&& other) noexcept : waits_(other.waits_), uid_(other.uid_) {
      other.waits_ = nullptr;
    }
    Slot& operator=(Slot&& other) noexcept;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { Leave(); }
    // Gives the place back now (idempotent).
    void Leave();

   private:
    friend class PlacementWaits;
    Slot(PlacementWaits* waits, uint32_t uid) : waits_(waits), uid_(uid) {}
    PlacementWaits* waits_;
    uint32_t uid_;
  };

  // At most `max` waits at once, `uid_share_percent` of them per uid.
  explicit PlacementWaits(uint32_t uid_share_percent, uint64_t max = kMaxPlacementWaits);

  // A place for a wait of `uid`, or RESOURCE_EXHAUSTED (the NewGroup caller
  // should retry) naming the limit or the uid's share that refused.
  absl::StatusOr<Slot> Enter(uint32_t uid);

  uint64_t waiting() const { return pool_.used(); }
  uint64_t waiting_of(uint32_t uid) const { return pool_.used_by(uid); }

 private:
  UidSharedPool pool_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_JOBS_PLACEMENT_WAITS_H_
