// The small-operation arena of one all-local group: a sealed memfd the daemon
// creates with the group and hands to every member over its data connection
// (data_conn.h, ArenaMessage). The members run small collectives in it among
// themselves, without the daemon (client/src/arena.h):
//
//   * operation k (k = 1, 2, ... in the order the member submits them) uses
//     slot (k - 1) % slots;
//   * member r copies its input and the operation's key (ArenaSlotHeader) into
//     its area of that slot, then publishes lanes[r].arrived = k;
//   * it completes the operation once every lane's `arrived` is >= k: checks
//     every member's key against its own, computes its output from all the
//     areas (reductions in rank order: the daemon's results, bit for bit),
//     then publishes lanes[r].consumed = k;
//   * a member writes slot k's area only when every lane's `consumed` is
//     >= k - slots (nobody still reads the slot's previous operation).
//   Every publish rings `bell` (a futex word; a syscall only when someone
//   sleeps).
//
// Settling: every member must reach the same outcome for each operation,
// or their sequences part (one retries what another completed) and the
// group's next operations mismatch. One word decides, `settled`: bits 0-62
// hold the highest operation a member committed, bit 63 says the arena froze
// (broke). A member completes operation k only by committing it (every
// input in, then a CAS raising the committed number to k while not frozen:
// CommitArenaOp); a member fails k only once the arena froze with fewer than
// k committed. Both are read-modify-writes of one word, so every member sees
// them in one order: k succeeds for all (committed before the freeze) or
// fails for all. Whoever breaks the arena (the daemon, a member at a
// deadline, a member leaving it for a new session) writes `broken` and
// then freezes (BreakArena); a member that sees `broken` set but the word not
// yet frozen freezes it itself before failing anything.
//
// Trust: the arena is shared by the members of one group of one job (the
// trust domain its collectives already are), and root may be one of them
// (an operator's process joining a user's job). Every word here can be
// rewritten by any member at any time, so:
//   * the geometry (members, slots, slot_bytes) is checked once, when the
//     arena is mapped, and every address is derived from that snapshot,
//     never from the header again; every index is bounded by it;
//   * a member reads other members' areas only at offsets and sizes it
//     computed itself, and treats a key it does not expect as a mismatch,
//     never as a size;
//   * `broken` and its reason are read and written only through
//     BreakArena / ArenaBrokenStatus below (one definition for the daemon
//     and the members): a value outside the status codes reads as an
//     overwritten arena, the reason as bounded printable text, and a member
//     that grabbed `broken_claim` without breaking cannot stop the daemon's
//     break from reaching the others.
// The daemon never reads the arena except the lanes' `consumed` counters (a
// metric of the group's own job): nothing a member writes here can change
// what the daemon does.
//
// Evolving: kArenaVersion changes with any change here. A member's path for
// an operation must be its peers' path, so a client that is handed an arena
// it cannot use (another version, a size it does not expect) fails NewGroup
// (FAILED_PRECONDITION) rather than run that group's operations elsewhere.
#ifndef HSDP_SHM_ARENA_H_
#define HSDP_SHM_ARENA_H_

#include <atomic>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"
#include "hsdp/shm/layout.h"

namespace hsdp::shm {

inline constexpr char kArenaMagic[8] = {'H', 'S', 'D', 'P', 'A', 'R', 'N', '1'};
// 2: the settle word (an arena of version 1 let one member fail an operation
// another completed).
inline constexpr uint32_t kArenaVersion = 2;
inline constexpr uint32_t kArenaMaxMembers = 64;
inline constexpr uint32_t kArenaMaxSlots = 64;
inline constexpr uint64_t kArenaMaxSlotBytes = uint64_t{1} << 20;

struct alignas(64) ArenaHeader {
  char magic[8];
  uint32_t version;
  uint32_t members;     // the group's size; lane r is group rank r
  uint32_t slots;       // a power of two, <= kArenaMaxSlots
  uint32_t reserved0;
  uint64_t slot_bytes;  // data bytes of one member's area in one slot (multiple of 64)
  uint64_t total_bytes;
  // The settle word (above): the highest committed operation, kArenaFrozen
  // once broken. Zero in a new arena. Only through the functions below.
  std::atomic<uint64_t> settled;
  uint64_t reserved1[3];
  // 0 while the arena may be used, otherwise the absl::StatusCode every
  // operation in it that not every member submitted fails with: the daemon's
  // when the group's epoch failed, or a member's when an operation passed its
  // deadline. Never cleared: the group's next epoch runs through the daemon.
  // Whoever wins `broken_claim` (0 -> 1) writes `reason` (why, for the
  // messages; reason_len bytes, at most sizeof(reason)), then `broken`.
  alignas(64) std::atomic<uint32_t> broken;
  std::atomic<uint32_t> broken_claim;
  uint32_t reason_len;
  char reason[244];
  // Rung by every publish (arrived, consumed) and by `broken`.
  alignas(64) Doorbell bell;
};
static_assert(sizeof(ArenaHeader) == 448);

// One per member, written only by that member.
struct alignas(64) ArenaLane {
  std::atomic<uint64_t> arrived;   // the last operation whose input is in its area
  std::atomic<uint64_t> consumed;  // the last operation it finished reading
  uint8_t pad[48];
};
static_assert(sizeof(ArenaLane) == 64);

// What every member must agree on, at the start of its area in the slot.
struct ArenaSlotHeader {
  uint64_t seq;  // the operation's number k
  uint8_t collective;
  uint8_t dtype;
  uint8_t reduce_op;
  uint8_t reduce_dtype;
  int32_t root;
  uint64_t count;
  double premul_factor;
  double pre_divide;
  double post_divide;
  uint64_t reserved[2];
};
static_assert(sizeof(ArenaSlotHeader) == 64);

struct ArenaLayout {
  uint64_t lanes_offset;
  uint64_t slots_offset;
  uint64_t area_stride;  // ArenaSlotHeader + slot_bytes
  uint64_t total_bytes;
};
constexpr ArenaLayout ComputeArenaLayout(uint32_t members, uint32_t slots, uint64_t slot_bytes) {
  ArenaLayout l{};
  l.lanes_offset = AlignUp(sizeof(ArenaHeader), 64);
  l.slots_offset = AlignUp(l.lanes_offset + uint64_t{members} * sizeof(ArenaLane), 4096);
  l.area_stride = sizeof(ArenaSlotHeader) + AlignUp(slot_bytes, 64);
  l.total_bytes = AlignUp(l.slots_offset + uint64_t{slots} * members * l.area_stride, 4096);
  return l;
}
// Offset of member `m`'s area in slot `s`.
constexpr uint64_t ArenaAreaOffset(const ArenaLayout& l, uint32_t members, uint32_t s,
                                   uint32_t m) {
  return l.slots_offset + (uint64_t{s} * members + m) * l.area_stride;
}
// Whether a geometry is one this build makes and accepts.
constexpr bool ValidArenaGeometry(uint32_t members, uint32_t slots, uint64_t slot_bytes) {
  return members >= 1 && members <= kArenaMaxMembers && slots >= 1 && slots <= kArenaMaxSlots &&
         (slots & (slots - 1)) == 0 && slot_bytes >= 64 && slot_bytes <= kArenaMaxSlotBytes &&
         slot_bytes % 64 == 0;
}

// Reads a word that another process may be writing exactly once: the
// compiler may not load it again later (a snapshot must stay a snapshot).
template <typename T>
inline T ReadOnce(const T& word) {
  return __atomic_load_n(&word, __ATOMIC_RELAXED);
}

inline constexpr uint64_t kArenaFrozen = uint64_t{1} << 63;

// The break protocol. Marks the arena broken with `why`'s code (ABORTED for
// an OK status: a broken arena never reads as healthy) and, when this caller
// is the first to claim it, `why`'s message as the reason; then freezes the
// settle word (FreezeArena) and rings the bell.
// Thread- and process-safe, never blocks.
void BreakArena(ArenaHeader* h, const absl::Status& why);
// Commits operation `seq` (the caller saw every member's input in): true
// when it completes, now or because a member committed it (or a later one)
// already; false when the arena froze before anyone did, so it fails for
// every member. Never blocks.
bool CommitArenaOp(ArenaHeader* h, uint64_t seq);
// Freezes the settle word: nothing commits from now on. Idempotent.
void FreezeArena(ArenaHeader* h);
bool ArenaFrozen(const ArenaHeader& h);
// OK while `broken` is 0; otherwise the code a breaker wrote with its reason
// (printable, at most sizeof(reason) bytes), or UNKNOWN when the word holds
// no status code (a member overwrote it).
absl::Status ArenaBrokenStatus(const ArenaHeader& h);
// The daemon is done with the arena (its group ended) and its memory is
// about to be released even where a member still maps it: breaks it
// (ABORTED) and clears the magic first. A member that finished reading the
// areas checks ArenaRetired afterwards: an operation whose inputs may have
// been released under it fails instead of returning zeros.
void RetireArena(ArenaHeader* h);
bool ArenaRetired(const ArenaHeader& h);

}  // namespace hsdp::shm

#endif  // HSDP_SHM_ARENA_H_
