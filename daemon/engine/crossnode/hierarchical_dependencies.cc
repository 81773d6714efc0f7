// The hierarchical engine's dependencies between tasks (see
// hierarchical_engine.h): depends_on checked against the tickets of both
// kinds (a composite's phase 2 may depend on a phase 1 run by the local
// engine or by this one), the failures remembered for it, the all-local
// tasks parked until their dependencies finished and then forwarded to the
// local engine, and starting what waited once a task finished.
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/crossnode/hierarchical_engine_state.h"

namespace hsdp {
namespace hierarchical_internal {
namespace {

constexpr size_t kMaxRememberedFailures = 4096;

}  // namespace

HierarchicalEngine::Deps HierarchicalEngine::CheckDepsLocked(const std::vector<uint64_t>& deps,
                                                             bool local, absl::Status* failed) {
  Deps d = Deps::kReady;
  for (uint64_t dep : deps) {
    if (auto it = failures_.find(dep); it != failures_.end()) {
      *failed = absl::Status(
          it->second.code(),
          absl::StrCat("an operation this one depends on failed: ", it->second.message()));
      return Deps::kFailed;
    }
    if (pending_.count(dep) == 0) continue;  // finished (or not ours)
    // The inner engine orders a local task after a forwarded local one itself.
    auto lt = locals_.find(dep);
    if (local && lt != locals_.end() && !lt->second->parked && lt->second->inner_ticket != 0) {
      continue;
    }
    d = Deps::kWait;
  }
  return d;
}
void HierarchicalEngine::RecheckLocked(Actions* act) {
  const std::vector<std::string> blocked(blocked_.begin(), blocked_.end());
  for (const std::string& key : blocked) ScheduleLocked(key, act);
  if (parked_ == 0) return;
  for (auto& [ticket, lt] : locals_) {
    if (!lt->parked) continue;
    absl::Status failed;
    const Deps d = CheckDepsLocked(lt->task.depends_on, true, &failed);
    if (d == Deps::kWait) continue;
    lt->parked = false;
    --parked_;
    if (d == Deps::kFailed) {
      act->fail_local.emplace_back(lt, failed);
    } else {
      act->forward.push_back(lt);
    }
  }
}
void HierarchicalEngine::ForwardLocal(const std::shared_ptr<LocalTask>& lt) {
  EngineTask task = std::move(lt->task);  // not read again once forwarded
  {
    // Dependencies still pending are forwarded local tasks: the inner
    // engine's own tickets order them.
    std::lock_guard<std::mutex> l(mu_);
    std::vector<uint64_t> inner_deps;
    for (uint64_t dep : task.depends_on) {
      auto it = locals_.find(dep);
      if (pending_.count(dep) > 0 && it != locals_.end() && it->second->inner_ticket != 0) {
        inner_deps.push_back(it->second->inner_ticket);
      }
    }
    task.depends_on = std::move(inner_deps);
  }
  EngineCallbacks cb;
  cb.launched = [this, lt](uint64_t inner_ticket) {
    {
      std::lock_guard<std::mutex> l(mu_);
      lt->inner_ticket = inner_ticket;
    }
    lt->cb.launched(lt->ticket);
  };
  cb.completed = [this, lt](absl::Status status, uint64_t exec_ns) {
    {
      std::lock_guard<std::mutex> l(mu_);
      locals_.erase(lt->ticket);
    }
    lt->cb.completed(status, exec_ns);
    Finished(lt->ticket, status, nullptr);
  };
  const uint64_t inner_ticket = inner_->Launch(std::move(task), std::move(cb));
  absl::Status abort;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (lt->inner_ticket == 0) lt->inner_ticket = inner_ticket;
    abort = lt->abort;
  }
  if (!abort.ok()) inner_->Abort(inner_ticket, abort);
}

void HierarchicalEngine::Finished(uint64_t ticket, const absl::Status& status,
                                  const std::string* group) {
  Actions act;
  {
    std::lock_guard<std::mutex> l(mu_);
    pending_.erase(ticket);
    if (!status.ok()) {
      failures_[ticket] = status;
      while (failures_.size() > kMaxRememberedFailures) failures_.erase(failures_.begin());
    }
    if (group != nullptr) {
      auto git = groups_.find(*group);
      if (git != groups_.end()) {
        git->second.busy = false;
        ScheduleLocked(*group, &act);
      }
    }
    RecheckLocked(&act);
  }
  Run(std::move(act));
}

}  // namespace hierarchical_internal
}  // namespace hsdp
