#include "daemon/dataplane/small_op_arena.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {

std::shared_ptr<ArenaBudget> NewArenaBudget(uint64_t bytes, uint32_t uid_share_percent) {
  return std::make_shared<ArenaBudget>("small-operation arena memory (data_plane.small_op_arena_mib)",
                                       "bytes", bytes, uid_share_percent);
}

absl::StatusOr<std::shared_ptr<SmallOpArena>> SmallOpArena::Create(
    uint32_t members, uint32_t slots, uint64_t slot_bytes, uint32_t epoch,
    std::shared_ptr<ArenaBudget> budget, uint32_t owner_uid) {
  if (!shm::ValidArenaGeometry(members, slots, slot_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("no arena for ", members, " members, ", slots,
                                                   " slots of ", slot_bytes, " bytes"));
  }
  const shm::ArenaLayout layout = shm::ComputeArenaLayout(members, slots, slot_bytes);
  if (budget == nullptr) return absl::ResourceExhaustedError("no arena memory on this node");
  RETURN_IF_ERROR(budget->Take(owner_uid, layout.total_bytes));
  std::shared_ptr<SmallOpArena> a(new SmallOpArena());
  a->budget_ = std::move(budget);
  a->owner_uid_ = owner_uid;
  a->charged_ = layout.total_bytes;
  a->epoch_ = epoch;
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      SharedRegion::Create("hsdp-arena", layout.total_bytes);
  if (!region.ok()) {
    a->budget_->Give(owner_uid, layout.total_bytes);
    a->budget_ = nullptr;
    return region.status();
  }
  a->region_ = *std::move(region);
  // The memfd is zero-filled: every lane's arrived/consumed start at 0.
  auto* h = new (a->region_->data()) shm::ArenaHeader();
  std::memcpy(h->magic, shm::kArenaMagic, sizeof(h->magic));
  h->version = shm::kArenaVersion;
  h->members = members;
  h->slots = slots;
  h->slot_bytes = slot_bytes;
  h->total_bytes = layout.total_bytes;
  h->broken.store(0, std::memory_order_release);
  a->header_ = h;
  a->members_ = members;
  a->lanes_ = reinterpret_cast<const shm::ArenaLane*>(
      static_cast<const char*>(a->region_->data()) + layout.lanes_offset);
  return a;
}

SmallOpArena::~SmallOpArena() {
  if (region_ == nullptr) return;
  // Members still mapping it learn first; then the region's end releases
  // the pages (SharedRegion punches them out), then the charge goes.
  shm::RetireArena(header_);
  region_.reset();
  if (budget_ != nullptr) budget_->Give(owner_uid_, charged_);
}

void SmallOpArena::MarkBroken(const absl::Status& why) { shm::BreakArena(header_, why); }

uint64_t SmallOpArena::OpsCompleted() const {
  uint64_t least = UINT64_MAX;
  for (uint32_t m = 0; m < members_; ++m) {
    least = std::min(least, lanes_[m].consumed.load(std::memory_order_relaxed));
  }
  return members_ == 0 ? 0 : least;
}

bool SmallOpArena::broken() const {
  return header_->broken.load(std::memory_order_acquire) != 0;
}

}  // namespace hsdp
