#include "arena.h"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "channel.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/kernels/reduce_kernels.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp::internal {
namespace {

// Bytes of input each member puts in its area.
uint64_t InputBytes(Collective c, uint64_t count, DataType dtype, int members) {
  const uint64_t bytes = count * DataTypeSize(dtype);
  switch (c) {
    case Collective::kReduceScatter: return bytes * static_cast<uint64_t>(members);
    case Collective::kBarrier: return 0;
    default: return bytes;
  }
}

shm::ArenaSlotHeader KeyOf(const ArenaOp& op, uint64_t seq) {
  shm::ArenaSlotHeader k{};
  k.seq = seq;
  k.collective = static_cast<uint8_t>(op.collective);
  k.dtype = static_cast<uint8_t>(op.dtype);
  k.count = op.count;
  k.root = op.collective == Collective::kBroadcast ? op.root : 0;
  if (op.collective == Collective::kAllReduce || op.collective == Collective::kReduceScatter) {
    k.reduce_op = static_cast<uint8_t>(op.reduce.op);
    k.reduce_dtype = static_cast<uint8_t>(op.reduce.reduce_dtype);
    k.premul_factor = op.reduce.premul_factor;
    k.pre_divide = op.reduce.pre_divide;
    k.post_divide = op.reduce.post_divide;
  }
  return k;
}

std::string Describe(const shm::ArenaSlotHeader& k) {
  std::string s = std::string(CollectiveName(static_cast<Collective>(k.collective)));
  if (k.collective != static_cast<uint8_t>(Collective::kBarrier)) {
    absl::StrAppend(&s, " of ", k.count, " ", std::string(DataTypeName(static_cast<DataType>(k.dtype))));
  }
  if (k.reduce_op != 0) {
    absl::StrAppend(&s, " (", std::string(ReduceOpName(static_cast<ReduceOp>(k.reduce_op))), ")");
  }
  if (k.collective == static_cast<uint8_t>(Collective::kBroadcast)) {
    absl::StrAppend(&s, " from root ", k.root);
  }
  return s;
}

bool SameKey(const shm::ArenaSlotHeader& a, const shm::ArenaSlotHeader& b) {
  return a.seq == b.seq && a.collective == b.collective && a.dtype == b.dtype &&
         a.reduce_op == b.reduce_op && a.reduce_dtype == b.reduce_dtype && a.root == b.root &&
         a.count == b.count &&
         std::memcmp(&a.premul_factor, &b.premul_factor, sizeof(double)) == 0 &&
         std::memcmp(&a.pre_divide, &b.pre_divide, sizeof(double)) == 0 &&
         std::memcmp(&a.post_divide, &b.post_divide, sizeof(double)) == 0;
}

// The daemon's form (members disagree: <field>: rank a has x, rank b has y),
// global ranks, for the first field that differs.
absl::Status DisagreementOf(const shm::ArenaSlotHeader& a, int rank_a,
                            const shm::ArenaSlotHeader& b, int rank_b) {
  auto say = [&](const char* field, const std::string& x, const std::string& y) {
    return absl::InvalidArgumentError(absl::StrCat("members disagree: ", field, ": rank ", rank_a,
                                                   " has ", x, ", rank ", rank_b, " has ", y));
  };
  auto coll = [](const shm::ArenaSlotHeader& k) {
    return std::string(CollectiveName(static_cast<Collective>(k.collective)));
  };
  auto type = [](uint8_t t) {
    return t == 0 ? std::string("(buffer dtype)") : std::string(DataTypeName(static_cast<DataType>(t)));
  };
  if (a.seq != b.seq) {
    return say("arena operation", absl::StrCat(a.seq), absl::StrCat(b.seq));
  }
  if (a.collective != b.collective) return say("collective", coll(a), coll(b));
  if (a.count != b.count) return say("count", absl::StrCat(a.count), absl::StrCat(b.count));
  if (a.dtype != b.dtype) return say("dtype", type(a.dtype), type(b.dtype));
  if (a.root != b.root) return say("root", absl::StrCat(a.root), absl::StrCat(b.root));
  if (a.reduce_op != b.reduce_op) {
    return say("reduce_op", std::string(ReduceOpName(static_cast<ReduceOp>(a.reduce_op))),
               std::string(ReduceOpName(static_cast<ReduceOp>(b.reduce_op))));
  }
  if (a.reduce_dtype != b.reduce_dtype) {
    return say("reduce_dtype", type(a.reduce_dtype), type(b.reduce_dtype));
  }
  if (std::memcmp(&a.premul_factor, &b.premul_factor, sizeof(double)) != 0) {
    return say("premul_factor", absl::StrCat(a.premul_factor), absl::StrCat(b.premul_factor));
  }
  if (std::memcmp(&a.pre_divide, &b.pre_divide, sizeof(double)) != 0) {
    return say("pre_divide", absl::StrCat(a.pre_divide), absl::StrCat(b.pre_divide));
  }
  return say("post_divide", absl::StrCat(a.post_divide), absl::StrCat(b.post_divide));
}

// hsdpd released the arena's memory (the group ended): its pages now read as
// zeros, `broken` and the settle word included.
absl::Status RetiredStatus() {
  return absl::AbortedError(
      "the group ended (hsdpd released its small-operation arena) before this operation "
      "completed");
}

std::shared_ptr<WorkState> NewState(std::shared_ptr<GroupArena> arena, uint64_t seq) {
  auto w = std::make_shared<WorkState>();
  w->arena = std::move(arena);
  w->arena_seq = seq;
  return w;
}

}  // namespace

absl::StatusOr<std::shared_ptr<GroupArena>> GroupArena::Map(UniqueFd fd, uint64_t bytes,
                                                            std::vector<int> ranks, int rank,
                                                            absl::Duration op_timeout,
                                                            int64_t spin_ns,
                                                            uint32_t spin_mode,
                                                            std::function<absl::Status()> daemon_gone) {
  const int members = static_cast<int>(ranks.size());
  struct stat st;
  SYSCALL_OR_RETURN(::fstat(fd.get(), &st));
  if (members < 1 || rank < 0 || rank >= members || bytes < sizeof(shm::ArenaHeader) ||
      static_cast<uint64_t>(st.st_size) != bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hsdpd sent a group arena of ", st.st_size, " bytes, announced as ", bytes,
        " bytes, for rank ", rank, " of ", members));
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (m == MAP_FAILED) return ErrnoStatus(errno, "mmap(arena)", __FILE__, __LINE__);
  std::shared_ptr<GroupArena> a(new GroupArena());
  a->fd_ = std::move(fd);
  a->map_ = m;
  a->bytes_ = bytes;
  a->header_ = static_cast<shm::ArenaHeader*>(m);
  const shm::ArenaHeader& h = *a->header_;
  if (std::memcmp(h.magic, shm::kArenaMagic, sizeof(h.magic)) != 0 ||
      h.version != shm::kArenaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hsdpd sent a group arena of another version (", h.version, "; this client runs ",
        shm::kArenaVersion, "): use the client library of the daemon's release"));
  }
  // The geometry is read once, here, checked, and kept: every address below
  // comes from this snapshot (a member may rewrite the header at any time).
  const uint32_t h_members = shm::ReadOnce(h.members), h_slots = shm::ReadOnce(h.slots);
  const uint64_t h_slot_bytes = shm::ReadOnce(h.slot_bytes);
  const uint64_t h_total = shm::ReadOnce(h.total_bytes);
  if (h_members != static_cast<uint32_t>(members) ||
      !shm::ValidArenaGeometry(h_members, h_slots, h_slot_bytes) ||
      shm::ComputeArenaLayout(h_members, h_slots, h_slot_bytes).total_bytes != bytes ||
      h_total != bytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hsdpd sent a group arena this client cannot use: ", h_members, " members (group of ",
        members, "), ", h_slots, " slots of ", h_slot_bytes, " bytes, ", h_total, " bytes"));
  }
  a->slots_ = h_slots;
  a->slot_bytes_ = h_slot_bytes;
  a->layout_ = shm::ComputeArenaLayout(h_members, h_slots, h_slot_bytes);
  a->members_ = members;
  a->rank_ = rank;
  a->ranks_ = std::move(ranks);
  a->op_timeout_ns_ = absl::ToInt64Nanoseconds(op_timeout);
  a->spin_ns_ = spin_ns;
  a->spin_mode_ = spin_mode;
  a->daemon_gone_ = std::move(daemon_gone);
  return a;
}

GroupArena::~GroupArena() {
  if (map_ != nullptr) ::munmap(map_, bytes_);
}

shm::ArenaLane* GroupArena::lane(int m) const {
  return reinterpret_cast<shm::ArenaLane*>(static_cast<char*>(map_) + layout_.lanes_offset) + m;
}

unsigned char* GroupArena::area(uint64_t seq, int m) const {
  const uint32_t slot = static_cast<uint32_t>((seq - 1) & (slots_ - 1));
  return static_cast<unsigned char*>(map_) +
         shm::ArenaAreaOffset(layout_, static_cast<uint32_t>(members_), slot,
                              static_cast<uint32_t>(m));
}

bool GroupArena::Takes(Collective c, uint64_t count, DataType dtype) const {
  switch (c) {
    case Collective::kAllReduce:
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kBroadcast:
    case Collective::kBarrier:
      break;
    default:
      return false;
  }
  if (c != Collective::kBarrier && DataTypeSize(dtype) == 0) return false;
  if (count > shm::kArenaMaxSlotBytes) return false;  // no overflow below
  return InputBytes(c, count, dtype, members_) <= slot_bytes_;
}

bool GroupArena::AllArrived(uint64_t seq) const {
  for (int m = 0; m < members_; ++m) {
    if (lane(m)->arrived.load(std::memory_order_acquire) < seq) return false;
  }
  return true;
}

bool GroupArena::AllConsumed(uint64_t seq) const {
  for (int m = 0; m < members_; ++m) {
    if (lane(m)->consumed.load(std::memory_order_acquire) < seq) return false;
  }
  return true;
}

absl::Status GroupArena::Health() const {
  absl::MutexLock l(&mu_);
  return BrokenLocked();
}

absl::Status GroupArena::BrokenLocked() const {
  if (!closed_.ok()) return closed_;
  absl::Status broken;
  if (shm::ArenaRetired(*header_)) {
    // Released: the words below read as zeros now. Why it broke, as this
    // member read it before; else hsdpd's going away (a drained daemon
    // releases its arenas: UNAVAILABLE, reconnect) or the group's end.
    broken = broken_seen_;
    if (broken.ok() && daemon_gone_ != nullptr) broken = daemon_gone_();
    if (broken.ok()) return RetiredStatus();
  } else {
    // Written by the daemon, or by a member (which may write anything).
    broken = shm::ArenaBrokenStatus(*header_);
    if (!broken.ok()) broken_seen_ = broken;
  }
  if (broken.ok() || absl::IsUnavailable(broken)) return broken;  // UNAVAILABLE: reconnect
  const std::string why(broken.message());
  return absl::Status(broken.code(), absl::StrCat(why, why.empty() ? "" : " ",
                                                  "(the group's operations fail until its "
                                                  "members call RejoinGroup)"));
}

void GroupArena::Break(const absl::Status& why) { shm::BreakArena(header_, why); }

std::string GroupArena::RanksAt(uint64_t seq, bool arrived) const {
  std::string out = "[";
  bool first = true;
  for (int m = 0; m < members_; ++m) {
    if ((lane(m)->arrived.load(std::memory_order_acquire) >= seq) != arrived) continue;
    absl::StrAppend(&out, first ? "" : ", ", ranks_[m]);
    first = false;
  }
  return out + "]";
}

void GroupArena::Finish(Pending& p, const absl::Status& status) {
  if (!status.ok() && !BrokenLocked().ok()) break_seen_ = true;
  if (p.work == nullptr) return;
  p.work->status = status;
  p.work->done.store(true, std::memory_order_release);
}

absl::StatusOr<Work> GroupArena::Submit(const ArenaOp& op) {
  absl::MutexLock l(&mu_);
  const uint64_t seq = next_seq_;
  auto failed = [&](const absl::Status& why) -> Work {
    auto w = NewState(shared_from_this(), seq);
    w->status = why;
    w->done.store(true, std::memory_order_release);
    return Work(std::move(w));
  };
  if (absl::Status s = BrokenLocked(); !s.ok()) {
    // hsdpd went away: as on the rings, this member's first operation that
    // the break catches fails (like one in flight); after that a submission
    // error, so Client::Submit reconnects and submits it in the new session.
    if (absl::IsUnavailable(s) && break_seen_) return s;
    break_seen_ = true;
    return failed(s);
  }
  const uint32_t slots = slots_;
  if (seq > slots) {
    // The slot's previous operation: this member's own first, then everyone's.
    const uint64_t prev = seq - slots;
    while (!pending_.empty() && pending_.front().seq <= prev) CompleteFrontLocked(-1);
    const int64_t deadline = shm::NowNanos() + op_timeout_ns_;
    const bool free = AwaitLocked(
        [&] {
          return header_->broken.load(std::memory_order_acquire) != 0 ||
                 shm::ArenaRetired(*header_) || AllConsumed(prev);
        },
        deadline);
    if (absl::Status s = BrokenLocked(); !s.ok()) return failed(s);
    if (!free) {
      std::string late = "[";
      for (int m = 0; m < members_; ++m) {
        if (lane(m)->consumed.load(std::memory_order_acquire) >= prev) continue;
        absl::StrAppend(&late, late.size() > 1 ? ", " : "", ranks_[m]);
      }
      const absl::Status why = absl::DeadlineExceededError(absl::StrCat(
          "small-operation arena: timed out after ", op_timeout_ns_ / 1000000,
          " ms waiting for rank(s) ", late, "] to finish operation ", prev));
      Break(why);
      return failed(why);
    }
  }
  const shm::ArenaSlotHeader key = KeyOf(op, seq);
  unsigned char* mine = area(seq, rank_);
  std::memcpy(mine, &key, sizeof(key));
  const bool sends = op.collective != Collective::kBroadcast || op.root == rank_;
  const uint64_t in_bytes = InputBytes(op.collective, op.count, op.dtype, members_);
  if (sends && in_bytes > 0) std::memcpy(mine + sizeof(key), op.send, in_bytes);
  lane(rank_)->arrived.store(seq, std::memory_order_release);
  shm::RingDoorbell(&header_->bell);
  ++next_seq_;
  auto state = NewState(shared_from_this(), seq);
  pending_.push_back(Pending{seq, key, op.recv, shm::NowNanos() + op_timeout_ns_, state});
  // Every member already there: done now (no waiting).
  while (!pending_.empty() && AllArrived(pending_.front().seq)) CompleteFrontLocked(0);
  return Work(std::move(state));
}

bool GroupArena::AwaitLocked(const std::function<bool()>& ready, int64_t until_ns) {
  // The first slice spins (the session's spin settings), then sleeps; a
  // longer wait looks every kHealthSliceNs at whether hsdpd is still there:
  // when it went away (nobody else may ever break the arena: a peer may be
  // gone with it), this member breaks the arena, UNAVAILABLE, as the rings'
  // operations fail.
  constexpr int64_t kHealthSliceNs = 100'000'000;
  for (bool first = true;; first = false) {
    const int64_t now = shm::NowNanos();
    if (now >= until_ns) return ready();
    const int64_t slice_end = std::min(until_ns, now + kHealthSliceNs);
    if (shm::AwaitDoorbell(&header_->bell, ready, first ? spin_ns_ : 0, slice_end, spin_mode_)) {
      return true;
    }
    if (shm::NowNanos() < until_ns && daemon_gone_ != nullptr) {
      if (absl::Status gone = daemon_gone_(); !gone.ok()) {
        Break(gone);
        return ready();
      }
    }
  }
}

bool GroupArena::CompleteFrontLocked(int64_t deadline_ns) {
  Pending p = std::move(pending_.front());
  pending_.pop_front();
  if (!closed_.ok()) {
    Finish(p, closed_);
    return true;
  }
  const int64_t until = deadline_ns < 0 ? p.deadline_ns : std::min(deadline_ns, p.deadline_ns);
  AwaitLocked(
      [&] {
        return AllArrived(p.seq) || header_->broken.load(std::memory_order_acquire) != 0 ||
               shm::ArenaFrozen(*header_) || shm::ArenaRetired(*header_);
      },
      until);
  if (SettleLocked(p, /*freeze=*/false)) return true;
  if (shm::NowNanos() < p.deadline_ns) {
    pending_.push_front(std::move(p));
    return false;
  }
  // Past the operation's deadline: the same message the daemon gives.
  Break(absl::DeadlineExceededError(absl::StrCat(
      Describe(p.key), ": timed out after ", op_timeout_ns_ / 1000000, " ms waiting for rank(s) ",
      RanksAt(p.seq, false), "; arrived: ", RanksAt(p.seq, true))));
  SettleLocked(p, /*freeze=*/true);
  return true;
}

bool GroupArena::SettleLocked(Pending& p, bool freeze) {
  if (shm::ArenaRetired(*header_)) {
    // Its inputs are gone (nothing in the arena is to be trusted now: not
    // even the settle word, which reads 0).
    Finish(p, BrokenLocked());
    return true;
  }
  auto complete = [&] {
    const absl::Status status = Execute(p);
    lane(rank_)->consumed.store(p.seq, std::memory_order_release);
    shm::RingDoorbell(&header_->bell);
    Finish(p, status);
    return true;
  };
  // Every input is in (a member that left after submitting left it here).
  if (AllArrived(p.seq) && shm::CommitArenaOp(header_, p.seq)) return complete();
  if (!shm::ArenaFrozen(*header_)) {
    // Broken, but its breaker has not frozen the word yet (or a member
    // wrote `broken` alone): freeze it, so that nobody commits from now on.
    if (!freeze && header_->broken.load(std::memory_order_acquire) == 0) return false;
    shm::FreezeArena(header_);
    // A member may have committed it just before the freeze.
    if (AllArrived(p.seq) && shm::CommitArenaOp(header_, p.seq)) return complete();
  }
  absl::Status why = BrokenLocked();
  if (why.ok()) {
    why = absl::AbortedError(
        "the group's small-operation arena was stopped by a member (its settle word is frozen)");
  }
  Finish(p, why);
  return true;
}

absl::Status GroupArena::Disagreement(const shm::ArenaSlotHeader& mine, int my_rank,
                                        const shm::ArenaSlotHeader& theirs, int their_rank) const {
  // Named from the lower rank's side, as the daemon does (its reference is
  // the lowest rank that arrived).
  return my_rank < their_rank ? DisagreementOf(mine, ranks_[my_rank], theirs, ranks_[their_rank])
                              : DisagreementOf(theirs, ranks_[their_rank], mine, ranks_[my_rank]);
}

absl::Status GroupArena::Execute(const Pending& p) const {
  const shm::ArenaSlotHeader& key = p.key;
  if (shm::ArenaRetired(*header_)) return BrokenLocked();
  const unsigned char* data[shm::kArenaMaxMembers];
  for (int m = 0; m < members_; ++m) {
    shm::ArenaSlotHeader theirs;
    std::memcpy(&theirs, area(p.seq, m), sizeof(theirs));
    if (!SameKey(theirs, key)) {
      // (Released under this member: its areas read as zeros.)
      return shm::ArenaRetired(*header_) ? BrokenLocked() : Disagreement(key, rank_, theirs, m);
    }
    data[m] = area(p.seq, m) + sizeof(shm::ArenaSlotHeader);
  }
  const auto c = static_cast<Collective>(key.collective);
  const auto dtype = static_cast<DataType>(key.dtype);
  const uint64_t block = key.count * DataTypeSize(dtype);
  auto* out = static_cast<unsigned char*>(p.recv);
  switch (c) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter: {
      if (key.count == 0) break;
      ReduceSpec spec;
      spec.dtype = dtype;
      spec.op = static_cast<ReduceOp>(key.reduce_op);
      spec.wire_dtype = static_cast<DataType>(key.reduce_dtype);
      spec.premul_factor = key.premul_factor;
      spec.pre_divide = key.pre_divide;
      spec.post_divide = key.post_divide;
      const void* in[shm::kArenaMaxMembers];
      const uint64_t off = c == Collective::kReduceScatter ? uint64_t(rank_) * block : 0;
      for (int m = 0; m < members_; ++m) in[m] = data[m] + off;
      void* outs[1] = {out};
      cpu::Reduce(spec, in, members_, outs, 1, key.count);
      break;
    }
    case Collective::kAllGather:
      for (int m = 0; m < members_; ++m) std::memcpy(out + uint64_t(m) * block, data[m], block);
      break;
    case Collective::kBroadcast:
      // key is this member's own (root checked by the client); bounded anyway.
      if (block > 0 && key.root >= 0 && key.root < members_) std::memcpy(out, data[key.root], block);
      break;
    default:
      break;
  }
  // The inputs were read from memory hsdpd may have released meanwhile (the
  // group ended: released pages read as zeros): then the result is not one.
  if (shm::ArenaRetired(*header_)) return BrokenLocked();
  return absl::OkStatus();
}

bool GroupArena::Poll(WorkState* w) {
  if (w->done.load(std::memory_order_acquire)) return true;
  absl::MutexLock l(&mu_);
  while (!w->done.load(std::memory_order_acquire) && !pending_.empty() &&
         (AllArrived(pending_.front().seq) || !BrokenLocked().ok())) {
    CompleteFrontLocked(0);
  }
  return w->done.load(std::memory_order_acquire);
}

absl::Status GroupArena::Wait(WorkState* w, absl::Duration timeout) {
  const int64_t deadline = timeout == absl::InfiniteDuration()
                               ? -1
                               : shm::NowNanos() + absl::ToInt64Nanoseconds(timeout);
  absl::MutexLock l(&mu_);
  while (!w->done.load(std::memory_order_acquire)) {
    if (pending_.empty()) return absl::InternalError("arena operation lost");  // not reached
    if (!CompleteFrontLocked(deadline)) {
      // The rings' wording (callers such as the torch backend read it).
      return absl::DeadlineExceededError(
          absl::StrCat("arena op ", w->arena_seq, " still pending after ",
                       absl::FormatDuration(timeout), " (it goes on; Wait again)"));
    }
  }
  return w->status;
}

absl::Status GroupArena::Drain() {
  absl::MutexLock l(&mu_);
  absl::Status first;
  while (!pending_.empty()) {
    std::shared_ptr<WorkState> w = pending_.front().work;
    CompleteFrontLocked(-1);
    if (first.ok() && w != nullptr && !w->status.ok()) first = w->status;
  }
  return first;
}

void GroupArena::Fail(const absl::Status& why) {
  absl::MutexLock l(&mu_);
  Break(why);
}

void GroupArena::Close(const absl::Status& why) {
  absl::MutexLock l(&mu_);
  if (!closed_.ok()) return;
  if (shm::ArenaRetired(*header_)) {
    // hsdpd released it (the group ended): nobody else is there to tell,
    // and a write would only fault in pages of an emptied file.
    closed_ = why.ok() ? absl::CancelledError("the arena was closed") : why;
    const absl::Status ended = RetiredStatus();
    while (!pending_.empty()) {
      Finish(pending_.front(), ended);
      pending_.pop_front();
    }
    return;
  }
  // What every member submitted completes (the buffers are still mapped:
  // the callers close before unmapping); then this member leaves, and the
  // arena breaks with `why` for the others, so that what it leaves pending
  // fails for every member alike, not only here.
  while (!pending_.empty() && AllArrived(pending_.front().seq)) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    SettleLocked(p, /*freeze=*/false);  // every input in: always decided
  }
  Break(why.ok() ? absl::CancelledError("a member closed the group's arena") : why);
  while (!pending_.empty()) {
    Pending p = std::move(pending_.front());
    pending_.pop_front();
    SettleLocked(p, /*freeze=*/true);
  }
  closed_ = why.ok() ? absl::CancelledError("the arena was closed") : why;
}

}  // namespace hsdp::internal
