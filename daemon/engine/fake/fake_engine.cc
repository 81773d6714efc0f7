#include "daemon/engine/fake/fake_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "daemon/engine/cpu/cpu_engine.h"

namespace hsdp {

FakeStreamEngine::FakeStreamEngine(int node, FakeFabric* fabric) : node_(node), fabric_(fabric) {
  if (fabric_ != nullptr) fabric_->Register(this, node);
}

absl::Status FakeStreamEngine::CreateGroup(const EngineGroupSpec& spec) {
  std::lock_guard<std::mutex> l(mu_);
  groups_.insert(absl::StrCat(spec.key, "@", spec.epoch));
  return absl::OkStatus();
}

void FakeStreamEngine::DestroyGroup(const std::string& key) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = groups_.begin(); it != groups_.end();) {
    it = it->rfind(key + "@", 0) == 0 ? groups_.erase(it) : std::next(it);
  }
}

uint64_t FakeStreamEngine::Launch(EngineTask task, EngineCallbacks cb) {
  std::unique_lock<std::mutex> l(mu_);
  const uint64_t ticket = next_ticket_++;
  ++launched_;
  if (shut_down_) {
    l.unlock();
    cb.launched(ticket);
    cb.completed(absl::UnavailableError("engine shut down"), 0);
    return ticket;
  }
  Entry e{ticket, std::move(task), std::move(cb)};
  if (hold_) {
    held_.push_back(std::move(e));
    return ticket;
  }
  std::function<void(uint64_t)> launched = e.cb.launched;
  pending_.push_back(std::move(e));
  l.unlock();
  launched(ticket);  // stream-ordered: enqueued is ordered
  return ticket;
}

void FakeStreamEngine::HoldLaunches(bool hold) {
  std::lock_guard<std::mutex> l(mu_);
  hold_ = hold;
}

bool FakeStreamEngine::LaunchNext() {
  std::unique_lock<std::mutex> l(mu_);
  if (held_.empty()) return false;
  Entry e = std::move(held_.front());
  held_.pop_front();
  const uint64_t ticket = e.ticket;
  std::function<void(uint64_t)> launched = e.cb.launched;
  pending_.push_back(std::move(e));
  l.unlock();
  launched(ticket);
  return true;
}

void FakeStreamEngine::Abort(uint64_t ticket, const absl::Status& why) {
  std::unique_lock<std::mutex> l(mu_);
  aborted_.push_back(ticket);
  for (auto it = held_.begin(); it != held_.end(); ++it) {
    if (it->ticket != ticket) continue;
    Entry e = std::move(*it);
    held_.erase(it);
    done_[ticket] = why;
    l.unlock();
    e.cb.launched(ticket);
    e.cb.completed(why, 0);
    return;
  }
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const Entry& e) { return e.ticket == ticket; });
  if (it == pending_.end()) return;
  (void)CompleteLocked(l, ticket, why, 0);
}

void FakeStreamEngine::Shutdown() {
  std::unique_lock<std::mutex> l(mu_);
  shut_down_ = true;
}

size_t FakeStreamEngine::pending() const {
  std::lock_guard<std::mutex> l(mu_);
  return pending_.size();
}

int FakeStreamEngine::launched() const {
  std::lock_guard<std::mutex> l(mu_);
  return launched_;
}

int FakeStreamEngine::created_groups() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(groups_.size());
}

std::vector<uint64_t> FakeStreamEngine::aborted() const {
  std::lock_guard<std::mutex> l(mu_);
  return aborted_;
}

EngineTask FakeStreamEngine::front() const {
  std::lock_guard<std::mutex> l(mu_);
  return pending_.empty() ? EngineTask{} : pending_.front().task;
}

uint64_t FakeStreamEngine::front_ticket() const {
  std::lock_guard<std::mutex> l(mu_);
  return pending_.empty() ? 0 : pending_.front().ticket;
}

absl::Status FakeStreamEngine::CompleteLocked(std::unique_lock<std::mutex>& l, uint64_t ticket,
                                              absl::Status status, uint64_t exec_ns) {
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [&](const Entry& e) { return e.ticket == ticket; });
  if (it == pending_.end()) {
    return absl::FailedPreconditionError(absl::StrCat("ticket ", ticket, " is not pending"));
  }
  if (status.ok()) {
    for (uint64_t dep : it->task.depends_on) {
      for (const Entry& e : pending_) {
        if (e.ticket == dep) {
          return absl::FailedPreconditionError(absl::StrCat(
              "ticket ", ticket, " cannot finish before ticket ", dep, " it depends on"));
        }
      }
      if (auto d = done_.find(dep); d != done_.end() && !d->second.ok()) {
        status = absl::Status(d->second.code(),
                              absl::StrCat("an operation this one depends on failed: ",
                                           d->second.message()));
      }
    }
  }
  Entry e = std::move(*it);
  pending_.erase(it);
  done_[ticket] = status;
  l.unlock();
  e.cb.completed(std::move(status), exec_ns);
  l.lock();
  return absl::OkStatus();
}

EngineTask FakeStreamEngine::Finish(absl::Status status, uint64_t exec_ns) {
  std::unique_lock<std::mutex> l(mu_);
  if (pending_.empty()) return EngineTask{};
  EngineTask task = pending_.front().task;
  (void)CompleteLocked(l, pending_.front().ticket, std::move(status), exec_ns);
  return task;
}

absl::Status FakeStreamEngine::Complete(uint64_t ticket, absl::Status status, uint64_t exec_ns) {
  std::unique_lock<std::mutex> l(mu_);
  return CompleteLocked(l, ticket, std::move(status), exec_ns);
}

absl::Status FakeStreamEngine::Execute() {
  std::unique_lock<std::mutex> l(mu_);
  if (pending_.empty()) return absl::FailedPreconditionError("nothing pending");
  const Entry& e = pending_.front();
  if (!e.task.AllLocal()) {
    return absl::FailedPreconditionError("members on other nodes: run it through the fabric");
  }
  CpuEngine::Run(e.task, nullptr);
  return CompleteLocked(l, e.ticket, absl::OkStatus(), 1000);
}

void FakeFabric::Register(FakeStreamEngine* engine, int node) {
  std::lock_guard<std::mutex> l(mu_);
  engines_[node] = engine;
}

void FakeFabric::OnNodeLost(std::function<void(int, const std::string&)> listener) {
  std::lock_guard<std::mutex> l(mu_);
  listeners_.push_back(std::move(listener));
}

int FakeFabric::RunReady() {
  int ran = 0;
  for (;;) {
    // Find one cross-node task whose every node has launched its part.
    std::map<int, uint64_t> parts;  // node -> ticket
    EngineTask combined;
    {
      std::lock_guard<std::mutex> l(mu_);
      bool found = false;
      for (auto& [node, engine] : engines_) {
        if (dead_.count(node) > 0) continue;
        std::lock_guard<std::mutex> el(engine->mu_);
        for (const FakeStreamEngine::Entry& e : engine->pending_) {
          if (e.task.AllLocal()) continue;
          std::set<int> nodes;
          for (const EngineMember& m : e.task.members) nodes.insert(m.node);
          combined = e.task;
          parts.clear();
          parts[node] = e.ticket;
          bool all = true;
          for (int other : nodes) {
            if (other == node) continue;
            auto oe = engines_.find(other);
            if (oe == engines_.end() || dead_.count(other) > 0) {
              all = false;
              break;
            }
            std::unique_lock<std::mutex> ol(oe->second->mu_, std::defer_lock);
            if (oe->second != engine) ol.lock();
            bool matched = false;
            for (const FakeStreamEngine::Entry& o : oe->second->pending_) {
              if (o.task.group_key == e.task.group_key && o.task.epoch == e.task.epoch &&
                  o.task.seq == e.task.seq && o.task.collective == e.task.collective) {
                for (size_t r = 0; r < o.task.members.size(); ++r) {
                  if (o.task.members[r].node == other) combined.members[r] = o.task.members[r];
                }
                parts[other] = o.ticket;
                matched = true;
                break;
              }
            }
            if (!matched) {
              all = false;
              break;
            }
          }
          if (all) {
            found = true;
            break;
          }
        }
        if (found) break;
      }
      if (!found) return ran;
    }
    for (EngineMember& m : combined.members) m.local = true;  // all addressable here
    CpuEngine::Run(combined, nullptr);
    for (auto& [node, ticket] : parts) (void)engines_.at(node)->Complete(ticket, absl::OkStatus());
    ++ran;
  }
}

void FakeFabric::KillNode(int node, const std::string& why) {
  std::vector<std::function<void(int, const std::string&)>> listeners;
  std::vector<std::pair<FakeStreamEngine*, uint64_t>> to_fail;
  {
    std::lock_guard<std::mutex> l(mu_);
    dead_.insert(node);
    listeners = listeners_;
    for (auto& [n, engine] : engines_) {
      if (n == node) continue;
      std::lock_guard<std::mutex> el(engine->mu_);
      for (const FakeStreamEngine::Entry& e : engine->pending_) {
        for (const EngineMember& m : e.task.members) {
          if (m.node == node) {
            to_fail.emplace_back(engine, e.ticket);
            break;
          }
        }
      }
    }
  }
  const absl::Status s =
      absl::UnavailableError(absl::StrCat("transport: peer node ", node, " lost (", why, ")"));
  for (auto& [engine, ticket] : to_fail) (void)engine->Complete(ticket, s);
  for (auto& fn : listeners) fn(node, why);
}

}  // namespace hsdp
