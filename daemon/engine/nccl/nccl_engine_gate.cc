// The NCCL engine's producer gate and the draining of failed work (see
// nccl_engine.h, "Producer events and failure").
//
// Why a gate: cudaStreamWaitEvent on a trainer's producer event would queue
// the collective behind work the daemon does not control. If that event never
// fires (a stuck or dead trainer) and the task is aborted, the queued kernels
// either run later — after ncclCommAbort freed the communicator and the
// session unmapped the buffers: a sticky illegal address for every session —
// or NCCL's free blocks on the stuck stream (its device synchronisation). So
// the engine thread polls the producer events (cudaEventQuery: no blocking)
// and issues a task only once they completed; until then nothing of it is on
// any stream, and an abort simply drops it.
//
// Dependencies are gated the same way: a task is issued once the tasks it
// depends on finished, so no stream waits on another communicator set's work
// (aborting this set would make NCCL's free wait for that work, which may be
// stuck until this thread aborts it: a deadlock).
//
// Why draining: after an abort, the work a task did enqueue (an aborted NCCL
// kernel ending, a cast-out kernel after it) may still run for a moment; the
// task's callbacks release the mappings it uses, so they run only once its
// completion events (recorded behind all of its work) are done.
#include "absl/strings/str_cat.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "daemon/engine/nccl/nccl_engine_state.h"
#include "hsdp/common/logging.h"

namespace hsdp::nccl {

void NcclEngine::Gate(Queued q) {
  gated_tickets_.insert(q.ticket);
  gated_[q.task.group_key].push_back(std::move(q));
}

void NcclEngine::ReleaseGated() {
  absl::Time now = absl::Now();
  bool late_stop = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    late_stop = stopping_ && now > stop_deadline_;
  }
  for (auto g = gated_.begin(); g != gated_.end();) {
    std::deque<Queued>& queue = g->second;
    while (!queue.empty()) {
      Queued& q = queue.front();
      absl::Status failed;
      bool ready = true;
      for (const EngineMember& m : q.task.members) {
        if (!m.local || m.wait_event == 0) continue;
        absl::StatusOr<bool> done = dev_->EventDone(m.wait_event);
        if (!done.ok()) {
          failed = absl::Status(done.status().code(),
                                absl::StrCat("rank ", m.global_rank, ": the work its producer "
                                             "event captured failed: ", done.status().message()));
          break;
        }
        ready = ready && *done;
      }
      // A dependency must have finished (or failed: the task then fails at
      // once): a stream never waits on another set's work either, because
      // NCCL's abort of this task's communicators would wait (its device
      // synchronisation) for that work, which may be stuck until this very
      // thread aborts it.
      for (uint64_t dep : q.task.depends_on) {
        ready = ready && gated_tickets_.count(dep) == 0 && running_.count(dep) == 0;
      }
      if (failed.ok() && !ready) {
        if (late_stop) {
          failed = absl::UnavailableError(absl::StrCat(
              "hsdpd is shutting down: ", CollName(q.task.collective), " in group ",
              q.task.group_key, " was still waiting for its producer events"));
        } else if (now > q.deadline) {
          failed = absl::DeadlineExceededError(absl::StrCat(
              CollName(q.task.collective), " in group ", q.task.group_key,
              ": a member's producer event did not complete within ",
              absl::FormatDuration(options_.op_timeout), "; nothing was issued"));
        } else {
          break;  // the group's later tasks wait behind it
        }
      }
      Queued next = std::move(q);
      queue.pop_front();
      gated_tickets_.erase(next.ticket);
      if (failed.ok()) {
        Issue(std::move(next));
        continue;
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        failed_[next.ticket] = failed;
        ++stats_.tasks_failed;
      }
      next.cb.launched(next.ticket);
      next.cb.completed(failed, 0);
    }
    g = queue.empty() ? gated_.erase(g) : std::next(g);
  }
}

bool NcclEngine::AbortGated(uint64_t ticket, const absl::Status& why) {
  if (gated_tickets_.count(ticket) == 0) return false;
  for (auto& [key, queue] : gated_) {
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if (it->ticket != ticket) continue;
      Queued q = std::move(*it);
      queue.erase(it);
      gated_tickets_.erase(ticket);
      {
        std::lock_guard<std::mutex> l(mu_);
        failed_[ticket] = why;
        ++stats_.tasks_failed;
      }
      q.cb.launched(ticket);
      q.cb.completed(why, 0);
      return true;
    }
  }
  return false;
}

void NcclEngine::Drain(std::unique_ptr<Running> run, absl::Status status) {
  if (status.ok() || run->done.empty()) {
    Finish(std::move(run), std::move(status));
    return;
  }
  // Dependents issued from now on see the failure at once.
  {
    std::lock_guard<std::mutex> l(mu_);
    failed_[run->ticket] = status;
  }
  if (run->set != nullptr) run->set->running.erase(run->ticket);
  draining_.push_back(Draining{std::move(run), std::move(status),
                               absl::Now() + options_.shutdown_grace});
}

void NcclEngine::PollDraining() {
  const absl::Time now = absl::Now();
  for (auto it = draining_.begin(); it != draining_.end();) {
    bool passed = true;
    for (auto& [d, e] : it->run->done) {
      absl::StatusOr<bool> done = dev_->EventDone(e);
      passed = passed && (!done.ok() || *done);  // failed work is over too
    }
    if (!passed && now <= it->deadline) {
      ++it;
      continue;
    }
    if (!passed) {
      HSDP_LOG(Warning) << CollName(it->run->task.collective) << " in group "
                        << it->run->task.group_key
                        << ": device work of a failed task did not finish within "
                        << absl::FormatDuration(options_.shutdown_grace)
                        << "; completing it anyway";
    }
    std::unique_ptr<Running> run = std::move(it->run);
    absl::Status status = std::move(it->status);
    it = draining_.erase(it);
    Finish(std::move(run), std::move(status));
  }
}

}  // namespace hsdp::nccl
