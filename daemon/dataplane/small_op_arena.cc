#include "daemon/dataplane/small_op_arena.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {

bool ArenaBudget::TryTake(uint64_t bytes) {
  uint64_t left = left_.load(std::memory_order_relaxed);
  do {
    if (left < bytes) return false;
  } while (!left_.compare_exchange_weak(left, left - bytes, std::memory_order_relaxed));
  return true;
}

absl::StatusOr<std::shared_ptr<SmallOpArena>> SmallOpArena::Create(
    uint32_t members, uint32_t slots, uint64_t slot_bytes, uint32_t epoch,
    std::shared_ptr<ArenaBudget> budget) {
  if (!shm::ValidArenaGeometry(members, slots, slot_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("no arena for ", members, " members, ", slots,
                                                   " slots of ", slot_bytes, " bytes"));
  }
  const shm::ArenaLayout layout = shm::ComputeArenaLayout(members, slots, slot_bytes);
  if (budget == nullptr || !budget->TryTake(layout.total_bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the node's small-operation arena memory (data_plane.small_op_arena_mib) "
                     "has less than ", layout.total_bytes, " bytes left"));
  }
  std::shared_ptr<SmallOpArena> a(new SmallOpArena());
  a->budget_ = std::move(budget);
  a->epoch_ = epoch;
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      SharedRegion::Create("hsdp-arena", layout.total_bytes);
  if (!region.ok()) {
    a->budget_->Give(layout.total_bytes);
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
  if (budget_ != nullptr && region_ != nullptr) budget_->Give(region_->bytes());
}

void SmallOpArena::MarkBroken(const absl::Status& why) {
  uint32_t unclaimed = 0;
  if (header_->broken_claim.compare_exchange_strong(unclaimed, 1, std::memory_order_acq_rel)) {
    const size_t n = std::min(why.message().size(), sizeof(header_->reason));
    std::memcpy(header_->reason, why.message().data(), n);
    header_->reason_len = static_cast<uint32_t>(n);
    const uint32_t code = why.ok() ? uint32_t(absl::StatusCode::kAborted)
                                   : static_cast<uint32_t>(why.code());
    header_->broken.store(code, std::memory_order_release);
  }
  shm::RingDoorbell(&header_->bell);
}

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
