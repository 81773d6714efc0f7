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

struct ArenaMemory {
  std::unique_ptr<SharedRegion> region;
  shm::ArenaHeader* header = nullptr;
  const shm::ArenaLane* lanes = nullptr;
  uint32_t members = 0;
  uint32_t owner_uid = 0;
  uint64_t charged = 0;  // bytes taken from budget
  std::shared_ptr<ArenaBudget> budget;
  absl::Time deadline;  // the reaper's: released by then at the latest

  // Every member finished every committed operation. (Members write these
  // words: a member can only make its own group's arena go early or late,
  // never past the grace.)
  bool Settled() const {
    const uint64_t committed =
        header->settled.load(std::memory_order_acquire) & ~shm::kArenaFrozen;
    for (uint32_t m = 0; m < members; ++m) {
      if (lanes[m].consumed.load(std::memory_order_acquire) < committed) return false;
    }
    return true;
  }
  // Members still mapping it learn first; then the region's end releases
  // the pages (SharedRegion punches them out), then the charge goes.
  ~ArenaMemory() {
    if (region == nullptr) return;
    shm::RetireArena(header);
    region.reset();
    if (budget != nullptr) budget->Give(owner_uid, charged);
  }
};

ArenaReaper::ArenaReaper(absl::Duration grace) : grace_(grace) {}

ArenaReaper::~ArenaReaper() {
  absl::MutexLock l(&mu_);
  held_.clear();
}

void ArenaReaper::Hold(std::unique_ptr<ArenaMemory> m) {
  m->deadline = absl::Now() + grace_;
  if (m->Settled()) return;  // released now (m's end)
  absl::MutexLock l(&mu_);
  held_.push_back(std::move(m));
}

void ArenaReaper::Reap() {
  std::vector<std::unique_ptr<ArenaMemory>> due;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = absl::Now();
    for (auto it = held_.begin(); it != held_.end();) {
      if ((*it)->Settled() || now >= (*it)->deadline) {
        due.push_back(std::move(*it));
        it = held_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // (released here, outside the lock)
}

void ArenaReaper::ReapAll(absl::Duration bound) {
  const absl::Time until = absl::Now() + bound;
  for (;;) {
    Reap();
    if (held() == 0 || absl::Now() >= until) break;
    absl::SleepFor(absl::Milliseconds(1));  // members finish in microseconds
  }
  std::vector<std::unique_ptr<ArenaMemory>> rest;
  absl::MutexLock l(&mu_);
  rest.swap(held_);
}

size_t ArenaReaper::held() const {
  absl::MutexLock l(&mu_);
  return held_.size();
}

absl::StatusOr<std::shared_ptr<SmallOpArena>> SmallOpArena::Create(
    uint32_t members, uint32_t slots, uint64_t slot_bytes, uint32_t epoch,
    std::shared_ptr<ArenaBudget> budget, uint32_t owner_uid,
    std::shared_ptr<ArenaReaper> reaper) {
  if (!shm::ValidArenaGeometry(members, slots, slot_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("no arena for ", members, " members, ", slots,
                                                   " slots of ", slot_bytes, " bytes"));
  }
  const shm::ArenaLayout layout = shm::ComputeArenaLayout(members, slots, slot_bytes);
  if (budget == nullptr) return absl::ResourceExhaustedError("no arena memory on this node");
  RETURN_IF_ERROR(budget->Take(owner_uid, layout.total_bytes));
  absl::StatusOr<std::unique_ptr<SharedRegion>> region =
      SharedRegion::Create("hsdp-arena", layout.total_bytes);
  if (!region.ok()) {
    budget->Give(owner_uid, layout.total_bytes);
    return region.status();
  }
  std::shared_ptr<SmallOpArena> a(new SmallOpArena());
  a->reaper_ = std::move(reaper);
  a->epoch_ = epoch;
  auto mem = std::make_unique<ArenaMemory>();
  mem->region = *std::move(region);
  mem->owner_uid = owner_uid;
  mem->charged = layout.total_bytes;
  mem->budget = std::move(budget);
  // The memfd is zero-filled: every lane's arrived/consumed start at 0.
  auto* h = new (mem->region->data()) shm::ArenaHeader();
  std::memcpy(h->magic, shm::kArenaMagic, sizeof(h->magic));
  h->version = shm::kArenaVersion;
  h->members = members;
  h->slots = slots;
  h->slot_bytes = slot_bytes;
  h->total_bytes = layout.total_bytes;
  h->broken.store(0, std::memory_order_release);
  mem->header = h;
  mem->members = members;
  mem->lanes = reinterpret_cast<const shm::ArenaLane*>(
      static_cast<const char*>(mem->region->data()) + layout.lanes_offset);
  a->mem_ = std::move(mem);
  return a;
}

SmallOpArena::SmallOpArena() = default;

SmallOpArena::~SmallOpArena() {
  if (mem_ == nullptr) return;
  // Nothing commits from now on; what was committed, members finish.
  if (!broken()) shm::BreakArena(mem_->header, absl::AbortedError("the group ended"));
  if (reaper_ != nullptr) reaper_->Hold(std::move(mem_));  // else released here
}

int SmallOpArena::fd() const { return mem_->region->fd(); }
uint64_t SmallOpArena::bytes() const { return mem_->region->bytes(); }

void SmallOpArena::MarkBroken(const absl::Status& why) { shm::BreakArena(mem_->header, why); }

uint64_t SmallOpArena::OpsCompleted() const {
  uint64_t least = UINT64_MAX;
  for (uint32_t m = 0; m < mem_->members; ++m) {
    least = std::min(least, mem_->lanes[m].consumed.load(std::memory_order_relaxed));
  }
  return mem_->members == 0 ? 0 : least;
}

bool SmallOpArena::broken() const {
  return mem_->header->broken.load(std::memory_order_acquire) != 0;
}

}  // namespace hsdp
