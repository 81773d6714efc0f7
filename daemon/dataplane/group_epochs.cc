// Group epochs: a local member joining (again), and remote members and a lost
// node's ranks joining the next epoch, which starts once every member joined it
// (MaybeAdvanceLocked creates its engine group); an epoch failing, with every
// pending and running operation of it, because of something here or because
// another daemon reported it failed; a local member's session ending and a peer
// node lost, each failing the current epoch. The rest of Group: group.h lists
// its files (same class, same locking rules).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/dataplane/group.h"
#include "daemon/engine/peer_instances.h"
#include "hsdp/common/logging.h"

namespace hsdp {

absl::StatusOr<uint32_t> Group::Join(int group_rank, std::shared_ptr<Session> session) {
  uint32_t result;
  {
    absl::MutexLock l(&mu_);
    if (!IsLocal(group_rank)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group rank ", group_rank, " is not a member of group ", spec_.id, " on this node"));
    }
    std::shared_ptr<Session>& slot = members_[group_rank];
    if (slot != nullptr && slot.get() != session.get() && !slot->closed()) {
      return absl::AlreadyExistsError(absl::StrCat("group ", spec_.id, ": rank ",
                                                   spec_.ranks[group_rank],
                                                   " already joined by session ", slot->id()));
    }
    slot = std::move(session);
    if (epoch_failure_.ok()) {
      joined_epoch_[group_rank] = epoch_;
      return epoch_;
    }
    result = epoch_ + 1;
    joined_epoch_[group_rank] = result;
    MaybeAdvanceLocked();
  }
  Pump();  // submissions for the new epoch may already be queued
  return result;
}

void Group::SetArena(std::shared_ptr<SmallOpArena> arena) {
  absl::MutexLock l(&mu_);
  arena_ = std::move(arena);
  if (arena_ != nullptr && (arena_->epoch() != epoch_ || !epoch_failure_.ok())) {
    arena_->MarkBroken(absl::AbortedError("the group's epoch ended before its arena was ready"));
  }
}

std::shared_ptr<SmallOpArena> Group::ArenaFor(uint32_t epoch) const {
  absl::MutexLock l(&mu_);
  if (arena_ == nullptr || arena_->epoch() != epoch || arena_->broken()) return nullptr;
  return arena_;
}

void Group::BreakArena(const absl::Status& why) {
  absl::MutexLock l(&mu_);
  if (arena_ != nullptr) arena_->MarkBroken(why);
}

uint64_t Group::ArenaOpsCompleted() const {
  absl::MutexLock l(&mu_);
  return arena_ == nullptr ? 0 : arena_->OpsCompleted();
}

void Group::RemoteJoined(int group_rank, uint32_t epoch) {
  {
    absl::MutexLock l(&mu_);
    if (group_rank < 0 || group_rank >= size() || IsLocal(group_rank)) return;
    joined_epoch_[group_rank] = std::max(joined_epoch_[group_rank], epoch);
    MaybeAdvanceLocked();
  }
  Pump();
}

void Group::PeerJoined(int node) {
  {
    absl::MutexLock l(&mu_);
    for (int r = 0; r < size(); ++r) {
      if (!IsLocal(r) && !spec_.nodes.empty() && spec_.nodes[r] == node && joined_epoch_[r] == 0) {
        joined_epoch_[r] = epoch_ + 1;
      }
    }
    MaybeAdvanceLocked();
  }
  Pump();
}

void Group::RemoteEpochFailed(uint32_t epoch, const absl::Status& why, uint64_t completed_seq) {
  {
    absl::MutexLock l(&mu_);
    if (epoch < epoch_ || (epoch == epoch_ && !epoch_failure_.ok())) return;  // over already
    if (epoch > epoch_) {
      // Not reached yet (this daemon still waits for members to re-join):
      // fail it on arrival. Bounded: only epochs ahead of the current one.
      if (remote_failed_.size() < 64) remote_failed_.emplace(epoch, why);
      return;
    }
  }
  FailEpoch(why, epoch, /*report=*/false, nullptr, completed_seq);
}

void Group::MaybeAdvanceLocked() {
  if (epoch_failure_.ok()) return;
  for (int r = 0; r < size(); ++r) {
    if (IsLocal(r)) {
      if (joined_epoch_[r] != epoch_ + 1) return;
      if (members_[r] == nullptr || members_[r]->closed()) return;
    } else if (joined_epoch_[r] == 0) {
      return;  // on a lost node: waits for it to join again
    }
  }
  ++epoch_;
  epoch_failure_ = absl::OkStatus();
  completed_seq_ = 0;
  restart_cause_ = absl::OkStatus();
  matcher_.StartEpoch(epoch_);
  p2p_posted_.clear();
  for (auto it = remote_failed_.begin(); it != remote_failed_.end() && it->first < epoch_;) {
    it = remote_failed_.erase(it);
  }
  if (auto it = remote_failed_.find(epoch_); it != remote_failed_.end()) {
    // Another daemon already failed this epoch: so do the submissions that
    // queued for it (Pump tells them), not at their deadline.
    std::vector<Arrival> failed;
    FailEpochLocked(it->second, &failed, &deferred_aborts_);
    for (Arrival& a : failed) deferred_failures_.emplace_back(std::move(a), it->second);
    remote_failed_.erase(it);
  }
  EngineGroupSpec es{spec_.key, epoch_, spec_.ranks, spec_.nodes, spec_.this_node};
  if (es.nodes.empty()) es.nodes.assign(spec_.ranks.size(), spec_.this_node);
  if (absl::Status s = engine_->CreateGroup(es); !s.ok()) {
    epoch_failure_ = s;  // the engine cannot run the new epoch: it stays failed
  }
  HSDP_LOG(Info) << "group " << spec_.id << " (job \"" << spec_.job_id << "\") re-formed in epoch "
                 << epoch_;
}

bool Group::FailEpochLocked(const absl::Status& status, std::vector<Arrival>* to_fail,
                            std::vector<uint64_t>* to_abort, uint64_t spare_through) {
  if (!epoch_failure_.ok()) return false;
  epoch_failure_ = status;
  if (!restart_cause_.ok() && status.code() == absl::StatusCode::kUnavailable) {
    // A connection lost in an epoch during which a peer node restarted: the
    // operations that saw it fail with the transport's error, later
    // submissions hear why (as when the restart is heard after the failure).
    epoch_failure_ = restart_cause_;
  }
  // Members waiting in the arena fail now too, not at their deadline.
  if (arena_ != nullptr && arena_->epoch() == epoch_) arena_->MarkBroken(status);
  size_t failed_ops = 0;
  for (Arrival& a : matcher_.FailEpoch(epoch_, status, &failed_ops)) {
    to_fail->push_back(std::move(a));
  }
  ops_failed_ += failed_ops;
  for (P2POp& p : TakeAllP2PLocked()) to_fail->push_back(std::move(p.arrival));
  for (const std::shared_ptr<RunningOp>& run : running_) {
    // Completed on the node that reported the failure: its part is done, so
    // this one finishes too (aborting it would fail a collective that
    // succeeded everywhere else).
    if (run->op.epoch == epoch_ && run->op.seq <= spare_through) continue;
    if (run->ticket != 0) to_abort->push_back(run->ticket);
  }
  for (const auto& [ticket, epoch] : p2p_running_) {
    if (epoch == epoch_) to_abort->push_back(ticket);
  }
  return true;
}

void Group::FailEpoch(const absl::Status& status, uint32_t epoch, bool report,
                      const absl::Status* cause, uint64_t spare_through) {
  std::vector<Arrival> to_fail;
  std::vector<uint64_t> to_abort;
  uint32_t failed_epoch = 0;
  uint64_t completed_seq = 0;
  {
    absl::MutexLock l(&mu_);
    if (epoch != 0 && epoch != epoch_) return;  // that epoch is over already
    if (FailEpochLocked(status, &to_fail, &to_abort, spare_through)) failed_epoch = epoch_;
    completed_seq = completed_seq_;
  }
  if (report && failed_epoch != 0 && spans_nodes() && spec_.on_epoch_failed) {
    spec_.on_epoch_failed(failed_epoch, cause != nullptr ? *cause : status, completed_seq);
  }
  // Running operations end through the engine (aborted where it can), or at
  // their deadline.
  for (uint64_t t : to_abort) engine_->Abort(t, status);
  if (!to_fail.empty()) Notify(std::move(to_fail), status, 0, 0);
}

void Group::DaemonLeaving(const absl::Status& why) { FailEpoch(why, 0, /*report=*/true); }

void Group::MemberLeft(const Session* session, const std::string& why) {
  absl::Status status;
  std::vector<Arrival> queued;
  absl::Status queued_status;
  {
    absl::MutexLock l(&mu_);
    // Its submissions queued for an epoch that has not started yet: failing
    // the current epoch does not reach them, and a complete set of them
    // waits for the epoch without a timeout, so they end here.
    queued = matcher_.TakeQueued(session);
    if (!queued.empty()) {
      queued_status = absl::AbortedError(absl::StrCat(
          "the member left the job (", why, ") before group ", spec_.id, " (job \"",
          spec_.job_id, "\") entered epoch ", epoch_ + 1));
    }
    int rank = -1;
    for (int r : local_ranks_) {
      if (members_[r].get() == session) rank = r;
    }
    if (rank >= 0) {
      members_[rank].reset();
      joined_epoch_[rank] = 0;
      status = absl::AbortedError(absl::StrCat(
          "rank ", spec_.ranks[rank], " left the job (", why, "); epoch ", epoch_, " of group ",
          spec_.id, " (job \"", spec_.job_id, "\") ended: join the group again to continue"));
    }
  }
  if (!queued.empty()) Notify(std::move(queued), queued_status, 0, 0);
  if (!status.ok()) FailEpoch(status, 0, /*report=*/true);
}

bool Group::LinkedToInstance(uint32_t epoch, int node, const std::string& instance) const {
  const auto* links = dynamic_cast<const PeerInstances*>(engine_);
  if (links == nullptr) return true;  // cannot tell: assume so
  for (const std::string& linked : links->LinkedInstances(spec_.key, epoch, node)) {
    if (linked.empty() || linked == instance) return true;
  }
  return false;
}

void Group::PeerLost(int node, const std::string& why, const std::string& old_instance) {
  std::vector<int> lost;
  for (int r = 0; r < size(); ++r) {
    if (!spec_.nodes.empty() && !IsLocal(r) &&
        (node == kEveryRemoteNode || spec_.nodes[r] == node)) {
      lost.push_back(r);
    }
  }
  if (lost.empty()) return;
  // "ended" first: a completion's message has room for 208 bytes, and the
  // member must learn that the epoch ended even when the cause is cut.
  const std::string whose =
      node == kEveryRemoteNode ? std::string("the nodes") : absl::StrCat("node ", node);
  const absl::Status status = absl::AbortedError(
      absl::StrCat("the epoch of group ", spec_.id, " (job \"", spec_.job_id, "\") ended: ",
                   whose, " hosting rank(s) ", RanksList(lost),
                   node == kEveryRemoteNode ? " were lost (" : " was lost (", why, ")"));
  // A restart may be heard only after the new daemon created the group in
  // this very epoch and ran operations in it with this one (see group.h).
  // The engine is asked without the lock; the epoch must not have moved
  // meanwhile (a few tries, then it counts as a loss).
  for (int attempt = 0; !old_instance.empty() && attempt < 3; ++attempt) {
    uint32_t epoch;
    {
      absl::MutexLock l(&mu_);
      if (!epoch_failure_.ok()) break;
      epoch = epoch_;
    }
    const bool old_link = LinkedToInstance(epoch, node, old_instance);
    absl::MutexLock l(&mu_);
    if (epoch_ != epoch || !epoch_failure_.ok()) continue;
    if (old_link) break;
    restart_cause_ = status;
    HSDP_LOG(Info) << "group " << spec_.id << " (job \"" << spec_.job_id << "\"): " << why
                   << "; epoch " << epoch_ << " goes on (no link of it reaches the old daemon)";
    return;
  }
  {
    absl::MutexLock l(&mu_);
    for (int r : lost) joined_epoch_[r] = 0;
    // Already failed (the engine saw the link break first): later
    // submissions hear the cause instead.
    if (!epoch_failure_.ok()) epoch_failure_ = status;
  }
  // Reported too: the others know already, but the coordinator then records
  // the failed epoch, so a restarted node's new group starts in line.
  FailEpoch(status, 0, /*report=*/true);
}

}  // namespace hsdp
