// The NCCL engine's side of the producer gate (ProducerGate,
// producer_gate.h, says why there is one and what its rules are) and the
// draining of failed work (see nccl_engine.h, "Producer events and failure").
//
// Why draining: after an abort, the work a task did enqueue (an aborted NCCL
// kernel ending, a cast-out kernel after it) may still run for a moment; the
// task's callbacks release the mappings it uses, so they run only once its
// completion events (recorded behind all of its work) are done.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "daemon/engine/nccl/nccl_engine_state.h"
#include "hsdp/common/logging.h"

namespace hsdp::nccl {

void NcclEngine::ReleaseGated() {
  const absl::Time now = absl::Now();
  bool late_stop = false;
  {
    std::lock_guard<std::mutex> l(mu_);
    late_stop = stopping_ && now > stop_deadline_;
  }
  ProducerGate::Hooks hooks;
  hooks.running = [this](uint64_t ticket) { return running_.count(ticket) != 0; };
  hooks.issue = [this](Queued q) { Issue(std::move(q)); };
  hooks.fail = [this](Queued q, absl::Status why) { FailUnissued(std::move(q), why); };
  gate_.Release(now, late_stop, hooks);
}

bool NcclEngine::AbortGated(uint64_t ticket, const absl::Status& why) {
  std::optional<Queued> q = gate_.Remove(ticket);
  if (!q.has_value()) return false;
  FailUnissued(*std::move(q), why);
  return true;
}

void NcclEngine::FailUnissued(Queued q, const absl::Status& why) {
  {
    std::lock_guard<std::mutex> l(mu_);
    failed_[q.ticket] = why;
    ++stats_.tasks_failed;
  }
  q.cb.launched(q.ticket);
  q.cb.completed(why, 0);
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
