// The hierarchical engine's core (see hierarchical_engine.h): launching a
// task (all-local and device tasks to the local engine, the others into
// their group's queue), scheduling each group's queue on the worker threads,
// the workers themselves, completion, Abort and Shutdown. The links between
// daemons are in hierarchical_links.cc, depends_on and the forwarding of
// all-local tasks in hierarchical_dependencies.cc.
#include "daemon/engine/crossnode/hierarchical_engine.h"

#include <pthread.h>

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/crossnode/hierarchical_engine_state.h"
#include "daemon/engine/cpu/thread_pool.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace hierarchical_internal {
namespace {

// Workers grow on demand up to this many (at least options.threads): a
// group waiting for a worker while its peers wait for it would stall until
// the deadline, so every busy group should get one.
constexpr int kMaxWorkers = 64;
// Staging memory a worker keeps between tasks (4 buffers of a few chunks
// with the default chunk size).
constexpr size_t kMaxIdleScratchBytes = size_t{64} << 20;

absl::Status ShuttingDown() { return absl::UnavailableError("hsdpd is shutting down"); }

}  // namespace

void HierarchicalEngine::ScheduleLocked(const std::string& key, Actions* act) {
  auto git = groups_.find(key);
  if (git == groups_.end()) return;
  GroupQueue& g = git->second;
  blocked_.erase(key);
  if (stopping_) {
    for (auto& xt : g.tasks) {
      if (xt->reported) act->fail.emplace_back(xt, ShuttingDown());
    }
    std::erase_if(g.tasks, [](const std::shared_ptr<XTask>& xt) { return xt->reported; });
  }
  while (!g.busy && !g.listed && !g.tasks.empty()) {
    const std::shared_ptr<XTask>& head = g.tasks.front();
    if (!head->reported) return;
    if (!head->abort.ok()) {
      act->fail.emplace_back(head, head->abort);
      g.tasks.pop_front();
      continue;
    }
    absl::Status failed;
    const Deps d = CheckDepsLocked(head->task.depends_on, false, &failed);
    if (d == Deps::kFailed) {
      act->fail.emplace_back(head, failed);
      g.tasks.pop_front();
      continue;
    }
    if (d == Deps::kWait) {
      blocked_.insert(key);
      return;
    }
    g.listed = true;
    ready_.push_back(key);
    if (static_cast<int>(ready_.size()) > idle_workers_ &&
        static_cast<int>(workers_.size()) < std::max(options_.threads, kMaxWorkers)) {
      workers_.emplace_back([this] { WorkerLoop(); });
    } else {
      work_cv_.notify_one();
    }
  }
  if (g.tasks.empty() && !g.busy && !g.listed) groups_.erase(git);
}
void HierarchicalEngine::Run(Actions act) {
  for (auto& [xt, status] : act.fail) Complete(xt, status, 0, false);
  for (auto& [lt, status] : act.fail_local) {
    {
      std::lock_guard<std::mutex> l(mu_);
      locals_.erase(lt->ticket);
    }
    lt->cb.launched(lt->ticket);
    lt->cb.completed(status, 0);
    Finished(lt->ticket, status, nullptr);
  }
  for (auto& lt : act.forward) ForwardLocal(lt);
}

uint64_t HierarchicalEngine::Launch(EngineTask task, EngineCallbacks cb) {
  std::unique_lock<std::mutex> l(mu_);
  if (stopping_) {
    const uint64_t ticket = next_ticket_++;
    l.unlock();
    cb.launched(ticket);
    cb.completed(ShuttingDown(), 0);
    return ticket;
  }
  const uint64_t ticket = next_ticket_++;
  pending_.insert(ticket);
  // Device memory goes to the inner engine even across nodes: its NCCL
  // communicators span the daemons themselves (no Gloo stage).
  if (task.AllLocal() || !task.AllHost()) {
    auto lt = std::make_shared<LocalTask>();
    lt->ticket = ticket;
    lt->task = std::move(task);
    lt->cb = std::move(cb);
    locals_[ticket] = lt;
    absl::Status failed;
    const Deps d = CheckDepsLocked(lt->task.depends_on, true, &failed);
    if (d == Deps::kWait) {
      lt->parked = true;  // `launched` once the inner engine orders it
      ++parked_;
      return ticket;
    }
    l.unlock();
    Actions act;
    if (d == Deps::kFailed) {
      act.fail_local.emplace_back(lt, failed);
    } else {
      act.forward.push_back(lt);
    }
    Run(std::move(act));
    return ticket;
  }
  auto xt = std::make_shared<XTask>();
  xt->ticket = ticket;
  xt->task = std::move(task);
  xt->cb = std::move(cb);
  xtasks_[ticket] = xt;
  const std::string key = xt->task.group_key;
  groups_[key].tasks.push_back(xt);  // ordered behind the group's previous task
  l.unlock();
  xt->cb.launched(ticket);
  Actions act;
  {
    std::lock_guard<std::mutex> g(mu_);
    xt->reported = true;
    ScheduleLocked(key, &act);
  }
  Run(std::move(act));
  return ticket;
}
void HierarchicalEngine::Complete(const std::shared_ptr<XTask>& xt, const absl::Status& status,
                                  uint64_t exec_ns, bool ran) {
  std::shared_ptr<LinkState> link;  // released outside the lock (may close it)
  {
    std::lock_guard<std::mutex> l(mu_);
    xtasks_.erase(xt->ticket);
    link = std::move(xt->link);
    xt->connecting.reset();
  }
  link.reset();
  xt->cb.completed(status, exec_ns);
  const std::string group = xt->task.group_key;
  Finished(xt->ticket, status, ran ? &group : nullptr);
}

void HierarchicalEngine::Abort(uint64_t ticket, const absl::Status& why) {
  std::shared_ptr<LinkState> link;
  std::shared_ptr<PendingConnect> connecting;
  uint64_t inner_ticket = 0;
  Actions act;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = xtasks_.find(ticket); it != xtasks_.end()) {
      const std::shared_ptr<XTask>& xt = it->second;
      if (xt->abort.ok()) xt->abort = why;
      if (xt->running) {
        link = xt->link;
        connecting = xt->connecting;
      } else if (xt->reported) {
        auto git = groups_.find(xt->task.group_key);
        if (git != groups_.end()) {
          auto& q = git->second.tasks;
          auto pos = std::find(q.begin(), q.end(), xt);
          if (pos != q.end()) {
            act.fail.emplace_back(xt, why);
            q.erase(pos);
          }
          ScheduleLocked(xt->task.group_key, &act);
        }
      }
    } else if (auto lit = locals_.find(ticket); lit != locals_.end()) {
      const std::shared_ptr<LocalTask>& lt = lit->second;
      if (lt->parked) {
        lt->parked = false;
        --parked_;
        act.fail_local.emplace_back(lt, why);
      } else if (lt->inner_ticket != 0) {
        inner_ticket = lt->inner_ticket;
      } else if (lt->abort.ok()) {
        lt->abort = why;
      }
    }
  }
  if (connecting != nullptr) {
    std::lock_guard<std::mutex> l(connecting->mu);
    if (connecting->cancelled.ok()) connecting->cancelled = why;
    connecting->cv.notify_all();
  }
  if (link != nullptr) {
    std::lock_guard<std::mutex> l(link->mu);
    if (link->link != nullptr) link->link->Abort(why);
  }
  if (inner_ticket != 0) inner_->Abort(inner_ticket, why);
  Run(std::move(act));
}
void HierarchicalEngine::WorkerLoop() {
  // Named (and so are its sidecar and pool, which inherit the name), so that
  // `top -H` and the soak test tell this on-demand pool (never more than
  // kMaxWorkers, and it does not shrink) from the daemon's fixed threads.
  pthread_setname_np(pthread_self(), "hsdp-xworker");
  Sidecar sidecar;
  Scratch scratch;
  std::unique_ptr<cpu::ThreadPool> pool;
  if (options_.local_threads > 1) pool = std::make_unique<cpu::ThreadPool>(options_.local_threads);
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    ++idle_workers_;
    work_cv_.wait(l, [&] { return stopping_ || !ready_.empty(); });
    --idle_workers_;
    if (ready_.empty()) return;  // stopping
    const std::string key = ready_.front();
    ready_.pop_front();
    auto git = groups_.find(key);
    if (git == groups_.end()) continue;
    GroupQueue& g = git->second;
    g.listed = false;
    if (g.tasks.empty()) {
      if (!g.busy) groups_.erase(git);
      continue;
    }
    std::shared_ptr<XTask> xt = g.tasks.front();
    g.tasks.pop_front();
    g.busy = true;
    xt->running = true;
    l.unlock();
    const int64_t start = shm::NowNanos();
    absl::Status status = Execute(xt, &sidecar, &scratch, pool.get());
    const uint64_t exec_ns = static_cast<uint64_t>(shm::NowNanos() - start);
    scratch.Trim(kMaxIdleScratchBytes);
    {
      std::lock_guard<std::mutex> g2(mu_);
      // The reason, not the broken link; an operation that completed before
      // the abort took effect succeeded.
      if (!status.ok() && !xt->abort.ok()) status = xt->abort;
    }
    if (!status.ok()) {
      status =
          absl::Status(status.code(), absl::StrCat(std::string(CollectiveName(xt->task.collective)),
                                                   " across nodes: ", status.message()));
    }
    Complete(xt, status, exec_ns, true);
    l.lock();
  }
}

void HierarchicalEngine::Shutdown() {
  Actions act;
  std::vector<std::shared_ptr<XTask>> running;
  std::vector<std::thread> workers;
  std::vector<std::shared_ptr<LinkState>> links;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    for (auto& [key, g] : groups_) {
      for (auto& xt : g.tasks) act.fail.emplace_back(xt, ShuttingDown());
      g.tasks.clear();
    }
    for (auto& [ticket, xt] : xtasks_) {
      if (xt->running) {
        if (xt->abort.ok()) xt->abort = ShuttingDown();
        running.push_back(xt);
      }
    }
    for (auto& [ticket, lt] : locals_) {
      if (lt->parked) {
        lt->parked = false;
        --parked_;
        act.fail_local.emplace_back(lt, ShuttingDown());
      }
    }
    ready_.clear();
    blocked_.clear();
    workers = std::move(workers_);
    workers_.clear();
    for (auto& [k, e] : links_) links.push_back(std::move(e.state));
    links_.clear();
  }
  work_cv_.notify_all();
  for (auto& xt : running) {
    std::shared_ptr<LinkState> link;
    std::shared_ptr<PendingConnect> pc;
    {
      std::lock_guard<std::mutex> l(mu_);
      link = xt->link;
      pc = xt->connecting;
    }
    if (pc != nullptr) {
      std::lock_guard<std::mutex> l(pc->mu);
      if (pc->cancelled.ok()) pc->cancelled = ShuttingDown();
      pc->cv.notify_all();
    }
    if (link != nullptr) {
      std::lock_guard<std::mutex> l(link->mu);
      if (link->link != nullptr) link->link->Abort(ShuttingDown());
    }
  }
  Run(std::move(act));
  for (std::thread& w : workers) w.join();
  links.clear();
  inner_->Shutdown();
}

}  // namespace hierarchical_internal

std::unique_ptr<Engine> MakeHierarchicalEngine(std::unique_ptr<Engine> local,
                                               std::unique_ptr<TransportFactory> transport,
                                               HierarchicalEngineOptions options) {
  options.threads = std::max(1, options.threads);
  options.local_threads = std::clamp(options.local_threads, 1, 64);
  return std::make_unique<hierarchical_internal::HierarchicalEngine>(std::move(local),
                                                                     std::move(transport), options);
}

}  // namespace hsdp
