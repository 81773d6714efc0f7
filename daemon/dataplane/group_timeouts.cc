// Group timeouts (CheckTimeouts, on the dispatcher's tick): what is past the
// timeout is OpDeadlines' answer (op_deadlines.h); here the group acts on it.
// Partially matched operations, and sends and receives with no counterpart,
// older than spec.timeout_ns fail naming who is missing (across nodes a
// matching timeout ends the epoch everywhere); a sequence number no member
// submitted is failed so the operations queued behind it can run; running
// operations past their deadline are aborted in the engine and end the
// epoch. The rest of Group: group.h lists its files (same class, same locking
// rules).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/dataplane/group.h"

namespace hsdp {

void Group::CheckTimeouts(int64_t now_ns) {
  std::vector<std::pair<std::vector<Arrival>, absl::Status>> fails;
  std::vector<std::shared_ptr<RunningOp>> overdue;
  std::optional<std::pair<uint32_t, absl::Status>> epoch_missing;
  bool skipped = false;
  {
    absl::MutexLock l(&mu_);
    for (const OpKey& key : deadlines_.ExpiredOps(matcher_, now_ns)) {
      const PendingOp& op = *matcher_.Find(key);
      std::vector<int> missing, arrived;
      for (int r : local_ranks_) {
        (op.arrivals.count(local_index_[r]) > 0 ? arrived : missing).push_back(r);
      }
      if (missing.empty()) {  // every local member is in: who has not joined the epoch
        for (int r = 0; r < size(); ++r) {
          if (joined_epoch_[r] < key.first) missing.push_back(r);
        }
      }
      absl::Status s = absl::DeadlineExceededError(
          op.arrived < static_cast<int>(local_ranks_.size())
              ? absl::StrCat(Describe(op), ": timed out after ", deadlines_.timeout_ms(),
                             " ms waiting for rank(s) ", RanksList(missing),
                             "; arrived: ", RanksList(arrived))
              : absl::StrCat(Describe(op), ": timed out after ", deadlines_.timeout_ms(),
                             " ms waiting for rank(s) ", RanksList(missing), " to join epoch ",
                             key.first));
      // Across nodes the others already run this operation: the epoch ends
      // everywhere (and they hear who was missing).
      if (spans_nodes() && key.first == epoch_ && !epoch_missing.has_value()) {
        epoch_missing.emplace(key.first, s);
      }
      fails.emplace_back(FailLocked(key, s), s);
    }
    for (const std::shared_ptr<RunningOp>& run : running_) {
      if (deadlines_.Expired(run->start_ns, now_ns) && !run->finished.load()) {
        overdue.push_back(run);
      }
    }
    for (auto* queues : {&p2p_sends_, &p2p_recvs_}) {
      const bool sends = queues == &p2p_sends_;
      for (auto& [key, q] : *queues) {
        while (!q.empty() && deadlines_.Expired(q.front().arrival.first_ns, now_ns)) {
          const auto [src, dst, tag] = key;
          const std::string peer = sends               ? absl::StrCat("rank ", spec_.ranks[dst])
                                   : src == kAnySource ? std::string("any rank")
                                                       : absl::StrCat("rank ", spec_.ranks[src]);
          absl::Status s = absl::DeadlineExceededError(absl::StrCat(
              sends ? "send to " : "recv from ", peer, " (tag ", tag, ") in group ", spec_.id,
              " (job \"", spec_.job_id, "\"): timed out after ", deadlines_.timeout_ms(),
              " ms waiting for the matching ", sends ? "recv" : "send"));
          std::vector<Arrival> one;
          one.push_back(std::move(q.front().arrival));
          q.pop_front();
          --p2p_queued_;
          ++ops_failed_;
          fails.emplace_back(std::move(one), std::move(s));
        }
      }
    }
    // Complete operations queued behind a sequence number nobody submitted
    // (only a misbehaving client can cause this): fail that number so the
    // queue moves on instead of waiting forever.
    if (!awaiting_launch_ && epoch_failure_.ok() &&
        deadlines_.NextNeverSubmitted(matcher_, now_ns)) {
      matcher_.FailNext(absl::DeadlineExceededError(absl::StrCat(
          "seq ", matcher_.next_seq(), " in group ", spec_.id,
          " was never submitted by any member within ", deadlines_.timeout_ms(),
          " ms; later operations were waiting for it")));
      ++ops_failed_;
      skipped = true;
    }
  }
  for (auto& [arrivals, s] : fails) Notify(std::move(arrivals), s, 0, 0);
  if (epoch_missing.has_value()) {
    FailEpoch(epoch_missing->second, epoch_missing->first, /*report=*/true);
  }
  for (const std::shared_ptr<RunningOp>& run : overdue) {
    const absl::Status s = absl::DeadlineExceededError(
        absl::StrCat(Describe(run->op), ": still running after ", deadlines_.timeout_ms(),
                     " ms (timeouts.collective_ms); aborted, and the group's epoch ended"));
    uint64_t ticket;
    bool forwarded;
    {
      absl::MutexLock l(&mu_);
      if (run->finished.exchange(true)) continue;  // completed meanwhile
      running_.erase(std::remove(running_.begin(), running_.end(), run), running_.end());
      ++ops_failed_;
      ticket = run->ticket;
      forwarded = run->forwarded;
      awaiting_launch_ = false;  // it will never be launched now
    }
    if (ticket != 0) engine_->Abort(ticket, s);
    std::vector<Arrival> arrivals;
    for (auto& [li, a] : run->op.arrivals) arrivals.push_back(std::move(a));
    // A forwarded composite phase reports through its replicate group.
    if (!forwarded) Notify(std::move(arrivals), s, 0, 0);
    FailEpoch(s, run->op.epoch, /*report=*/true);
  }
  if (!fails.empty() || skipped) Pump();
}

}  // namespace hsdp
