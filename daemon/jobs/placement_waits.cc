// PlacementWaits: a bounded, per-uid shared pool of waits, handed out as slots.
#include "daemon/jobs/placement_waits.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace hsdp {

PlacementWaits::Slot& PlacementWaits::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Leave();
    waits_ = other.waits_;
    uid_ = other.uid_;
    other.waits_ = nullptr;
  }
  return *this;
}

void PlacementWaits::Slot::Leave() {
  if (waits_ != nullptr) waits_->pool_.Give(uid_, 1);
  waits_ = nullptr;
}

PlacementWaits::PlacementWaits(uint32_t uid_share_percent, uint64_t max)
    : pool_("NewGroup calls waiting for placement", "calls", max, uid_share_percent) {}

absl::StatusOr<PlacementWaits::Slot> PlacementWaits::Enter(uint32_t uid) {
  if (absl::Status w = pool_.Take(uid, 1); !w.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("ranks: too many NewGroup calls already wait for their ranks to attach "
                     "somewhere in the cluster (", w.message(), "); retry"));
  }
  return Slot(this, uid);
}

}  // namespace hsdp
