// The producer gate of the NCCL engine (see producer_gate.h).
#include "daemon/engine/nccl/producer_gate.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine/nccl/collective_name.h"

namespace hsdp::nccl {

void ProducerGate::Add(QueuedTask q) {
  tickets_.insert(q.ticket);
  groups_[q.task.group_key].push_back(std::move(q));
}

absl::Status ProducerGate::Check(const QueuedTask& q, const Hooks& hooks, bool* ready) {
  *ready = true;
  for (const EngineMember& m : q.task.members) {
    if (!m.local || m.wait_event == 0) continue;
    absl::StatusOr<bool> done = dev_->EventDone(m.wait_event);
    if (!done.ok()) {
      return absl::Status(done.status().code(),
                          absl::StrCat("rank ", m.global_rank, ": the work its producer "
                                       "event captured failed: ", done.status().message()));
    }
    *ready = *ready && *done;
  }
  // A dependency must have finished (or failed: the task then fails when it
  // is issued): a stream never waits on another set's work.
  for (uint64_t dep : q.task.depends_on) {
    *ready = *ready && tickets_.count(dep) == 0 && !hooks.running(dep);
  }
  return absl::OkStatus();
}

void ProducerGate::Release(absl::Time now, bool late_stop, const Hooks& hooks) {
  for (auto g = groups_.begin(); g != groups_.end();) {
    std::deque<QueuedTask>& queue = g->second;
    while (!queue.empty()) {
      QueuedTask& q = queue.front();
      bool ready = true;
      absl::Status failed = Check(q, hooks, &ready);
      if (failed.ok() && !ready) {
        if (late_stop) {
          failed = absl::UnavailableError(absl::StrCat(
              "hsdpd is shutting down: ", CollName(q.task.collective), " in group ",
              q.task.group_key, " was still waiting for its producer events"));
        } else if (now > q.deadline) {
          failed = absl::DeadlineExceededError(absl::StrCat(
              CollName(q.task.collective), " in group ", q.task.group_key,
              ": a member's producer event did not complete within ",
              absl::FormatDuration(op_timeout_), "; nothing was issued"));
        } else {
          break;  // the group's later tasks wait behind it
        }
      }
      QueuedTask next = std::move(q);
      queue.pop_front();
      tickets_.erase(next.ticket);
      if (failed.ok()) {
        hooks.issue(std::move(next));
      } else {
        hooks.fail(std::move(next), std::move(failed));
      }
    }
    g = queue.empty() ? groups_.erase(g) : std::next(g);
  }
}

std::optional<QueuedTask> ProducerGate::Remove(uint64_t ticket) {
  if (tickets_.count(ticket) == 0) return std::nullopt;
  for (auto& [key, queue] : groups_) {
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (it->ticket != ticket) continue;
      QueuedTask q = std::move(*it);
      queue.erase(it);
      tickets_.erase(ticket);
      return q;
    }
  }
  return std::nullopt;
}

}  // namespace hsdp::nccl
