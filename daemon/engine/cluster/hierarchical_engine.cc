#include "daemon/engine/cluster/hierarchical_engine.h"

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/engine/cluster/cross_node_ops.h"
#include "daemon/engine/cpu/thread_pool.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

constexpr size_t kMaxRememberedFailures = 4096;

// Transport errors name the node ("connection to node 2 lost"); the user
// thinks in ranks: append the ranks of this task hosted by each node named.
absl::Status NameRanksOfNodes(const absl::Status& status, const EngineTask& task) {
  const std::string msg(status.message());
  std::map<int, std::vector<int>> ranks_of;  // remote node -> global ranks
  for (const EngineMember& m : task.members) {
    if (!m.local) ranks_of[m.node].push_back(m.global_rank);
  }
  std::string extra;
  for (const auto& [node, ranks] : ranks_of) {
    const std::string needle = absl::StrCat("node ", node);
    size_t at = msg.find(needle);
    while (at != std::string::npos) {
      const size_t end = at + needle.size();
      if (end >= msg.size() || !std::isdigit(static_cast<unsigned char>(msg[end]))) break;
      at = msg.find(needle, end);
    }
    if (at == std::string::npos) continue;
    constexpr size_t kMaxNamed = 8;
    std::vector<int> shown(ranks.begin(), ranks.begin() + std::min(ranks.size(), kMaxNamed));
    absl::StrAppend(&extra, extra.empty() ? " (" : "; ", "node ", node, " hosts rank",
                    ranks.size() == 1 ? " " : "s ", absl::StrJoin(shown, ", "),
                    ranks.size() > kMaxNamed ? ", ..." : "");
  }
  if (extra.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(msg, extra, ")"));
}
// Workers grow on demand up to this many (at least options.threads): a
// group waiting for a worker while its peers wait for it would stall until
// the deadline, so every busy group should get one.
constexpr int kMaxWorkers = 64;
// Staging memory a worker keeps between tasks (4 buffers of a few chunks
// with the default chunk size).
constexpr size_t kMaxIdleScratchBytes = size_t{64} << 20;

absl::Status ShuttingDown() { return absl::UnavailableError("hsdpd is shutting down"); }

// The result of one Connect, shared with the thread that makes it (a connect
// cannot be interrupted; an abandoned one finishes on its own).
struct PendingConnect {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::StatusOr<std::unique_ptr<NodeLink>> result = absl::UnknownError("not connected");
  absl::Status cancelled;  // set by Abort/Shutdown
};

// The link of one (group key, nodes) in one epoch.
struct LinkState {
  std::mutex mu;
  std::unique_ptr<NodeLink> link;  // guarded by mu; set once
  absl::Status failed;             // guarded by mu; sticky connect failure
  uint64_t next_tag = 0;           // used by the group's running task only
};

class HierarchicalEngine : public Engine {
 public:
  HierarchicalEngine(std::unique_ptr<Engine> local, std::unique_ptr<TransportFactory> transport,
                     HierarchicalEngineOptions options)
      : inner_(std::move(local)), transport_(std::move(transport)), options_(options) {}

  ~HierarchicalEngine() override { Shutdown(); }

  absl::Status CreateGroup(const EngineGroupSpec& spec) override {
    std::vector<std::shared_ptr<LinkState>> dropped;
    {
      std::lock_guard<std::mutex> l(mu_);
      uint32_t& e = epochs_[spec.key];
      e = std::max(e, spec.epoch);
      DropLinksLocked(spec.key, spec.epoch, &dropped);
    }
    return inner_->CreateGroup(spec);
  }

  void DestroyGroup(const std::string& key) override {
    std::vector<std::shared_ptr<LinkState>> dropped;
    {
      std::lock_guard<std::mutex> l(mu_);
      DropLinksLocked(key, UINT32_MAX, &dropped);
      const std::string sub = key + "/";
      for (auto it = epochs_.begin(); it != epochs_.end();) {
        if (it->first == key || it->first.compare(0, sub.size(), sub) == 0) {
          it = epochs_.erase(it);
        } else {
          ++it;
        }
      }
    }
    inner_->DestroyGroup(key);
  }

  uint64_t Launch(EngineTask task, EngineCallbacks cb) override;
  void Abort(uint64_t ticket, const absl::Status& why) override;
  void Shutdown() override;

  std::string name() const override { return absl::StrCat("hierarchical(", inner_->name(), ")"); }
  int threads() const override { return inner_->threads() + options_.threads; }
  bool Supports(MemoryKind kind) const override { return inner_->Supports(kind); }
  bool SupportsRemoteMembers() const override { return true; }

 private:
  // A task with remote members.
  struct XTask {
    uint64_t ticket = 0;
    EngineTask task;
    EngineCallbacks cb;
    bool reported = false;  // `launched` was called; only then may it run
    bool running = false;
    absl::Status abort;                        // guarded by mu_
    std::shared_ptr<LinkState> link;           // while running, guarded by mu_
    std::shared_ptr<PendingConnect> connecting;  // while connecting, guarded by mu_
  };
  // An all-local task, for the inner engine.
  struct LocalTask {
    uint64_t ticket = 0;
    EngineTask task;
    EngineCallbacks cb;
    bool parked = false;        // waiting for a dependency
    uint64_t inner_ticket = 0;  // once forwarded and known
    absl::Status abort;         // asked before the inner ticket was known
  };
  struct GroupQueue {
    std::deque<std::shared_ptr<XTask>> tasks;
    bool busy = false;    // its head runs on a worker
    bool listed = false;  // in ready_
  };
  struct LinkEntry {
    uint32_t epoch = 0;
    std::shared_ptr<LinkState> state;
  };
  using LinkKey = std::pair<std::string, std::vector<int>>;
  enum class Deps { kReady, kWait, kFailed };
  // Work decided under the lock, done after it.
  struct Actions {
    std::vector<std::pair<std::shared_ptr<XTask>, absl::Status>> fail;
    std::vector<std::pair<std::shared_ptr<LocalTask>, absl::Status>> fail_local;
    std::vector<std::shared_ptr<LocalTask>> forward;
  };

  Deps CheckDepsLocked(const std::vector<uint64_t>& deps, bool local, absl::Status* failed);
  void ScheduleLocked(const std::string& key, Actions* act);
  void RecheckLocked(Actions* act);
  void Run(Actions act);
  void ForwardLocal(const std::shared_ptr<LocalTask>& lt);
  // Records the end of `ticket` (after its `completed` ran) and starts what waited on it.
  void Finished(uint64_t ticket, const absl::Status& status, const std::string* group);
  void Complete(const std::shared_ptr<XTask>& xt, const absl::Status& status, uint64_t exec_ns,
                bool ran);
  void WorkerLoop();
  absl::Status Execute(const std::shared_ptr<XTask>& xt, Sidecar* sidecar, Scratch* scratch,
                       cpu::ThreadPool* pool);
  absl::StatusOr<std::shared_ptr<LinkState>> AcquireLink(const std::shared_ptr<XTask>& xt,
                                                         const TaskLayout& layout,
                                                         absl::Time deadline);
  void DropLinksLocked(const std::string& key, uint32_t below_epoch,
                       std::vector<std::shared_ptr<LinkState>>* dropped);

  const std::unique_ptr<Engine> inner_;
  const std::shared_ptr<TransportFactory> transport_;
  const HierarchicalEngineOptions options_;

  std::mutex mu_;
  std::condition_variable work_cv_;
  bool stopping_ = false;
  uint64_t next_ticket_ = 1;
  std::set<uint64_t> pending_;                 // tickets not finished
  std::map<uint64_t, absl::Status> failures_;  // recently failed tickets (bounded)
  std::map<uint64_t, std::shared_ptr<XTask>> xtasks_;
  std::map<uint64_t, std::shared_ptr<LocalTask>> locals_;
  int parked_ = 0;  // locals_ waiting for a dependency
  std::map<std::string, GroupQueue> groups_;
  std::set<std::string> blocked_;  // groups whose head waits for a dependency
  std::deque<std::string> ready_;
  std::map<std::string, uint32_t> epochs_;
  std::map<LinkKey, LinkEntry> links_;
  std::vector<std::thread> workers_;
  int idle_workers_ = 0;
};

HierarchicalEngine::Deps HierarchicalEngine::CheckDepsLocked(const std::vector<uint64_t>& deps,
                                                             bool local, absl::Status* failed) {
  Deps d = Deps::kReady;
  for (uint64_t dep : deps) {
    if (auto it = failures_.find(dep); it != failures_.end()) {
      *failed = absl::Status(it->second.code(),
                             absl::StrCat("an operation this one depends on failed: ",
                                          it->second.message()));
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

void HierarchicalEngine::DropLinksLocked(const std::string& key, uint32_t below_epoch,
                                         std::vector<std::shared_ptr<LinkState>>* dropped) {
  // The group's own links and those of its point-to-point keys ("<key>/...").
  const std::string sub = key + "/";
  for (auto it = links_.begin(); it != links_.end();) {
    const std::string& k = it->first.first;
    if ((k == key || k.compare(0, sub.size(), sub) == 0) && it->second.epoch < below_epoch) {
      dropped->push_back(std::move(it->second.state));
      it = links_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::StatusOr<std::shared_ptr<LinkState>> HierarchicalEngine::AcquireLink(
    const std::shared_ptr<XTask>& xt, const TaskLayout& layout, absl::Time deadline) {
  const EngineTask& t = xt->task;
  std::shared_ptr<LinkState> ls;
  std::shared_ptr<LinkState> replaced;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = epochs_.find(t.group_key); it != epochs_.end() && it->second > t.epoch) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch ", t.epoch, " of the group is over (now ", it->second, ")"));
    }
    LinkEntry& e = links_[LinkKey{t.group_key, layout.nodes}];
    if (e.state != nullptr && e.epoch > t.epoch) {
      return absl::FailedPreconditionError(
          absl::StrCat("epoch ", t.epoch, " of the group is over (now ", e.epoch, ")"));
    }
    if (e.state == nullptr || e.epoch < t.epoch) {
      replaced = std::move(e.state);
      e.state = std::make_shared<LinkState>();
      e.epoch = t.epoch;
    }
    ls = e.state;
    xt->link = ls;
  }
  replaced.reset();  // closes the old epoch's link (outside the engine lock)
  {
    std::lock_guard<std::mutex> l(ls->mu);
    if (!ls->failed.ok()) return ls->failed;
    if (ls->link != nullptr) return ls;
  }
  // Connect on a thread of its own, so that Abort and Shutdown need not wait.
  auto pc = std::make_shared<PendingConnect>();
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!xt->abort.ok()) return xt->abort;
    xt->connecting = pc;
  }
  const std::string key = absl::StrCat(t.group_key, "|", absl::StrJoin(layout.nodes, ","));
  std::thread([transport = transport_, pc, key, epoch = t.epoch, nodes = layout.nodes,
               this_node = layout.this_node, deadline] {
    auto result = transport->Connect(key, epoch, nodes, this_node, deadline);
    std::lock_guard<std::mutex> l(pc->mu);
    pc->result = std::move(result);
    pc->done = true;
    pc->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> l(pc->mu);
  pc->cv.wait(l, [&] { return pc->done || !pc->cancelled.ok(); });
  absl::Status status;
  if (!pc->cancelled.ok()) {
    status = pc->cancelled;
  } else if (!pc->result.ok()) {
    status = absl::Status(pc->result.status().code(),
                          absl::StrCat("connecting to nodes [", absl::StrJoin(layout.nodes, ", "),
                                       "]: ", pc->result.status().message()));
  }
  std::unique_ptr<NodeLink> link;
  if (status.ok()) link = std::move(pc->result).value();
  l.unlock();
  std::lock_guard<std::mutex> ll(ls->mu);
  if (!status.ok()) {
    ls->failed = status;
    return status;
  }
  ls->link = std::move(link);
  return ls;
}

absl::Status HierarchicalEngine::Execute(const std::shared_ptr<XTask>& xt, Sidecar* sidecar,
                                         Scratch* scratch, cpu::ThreadPool* pool) {
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::StatusOr<TaskLayout> layout = MakeTaskLayout(xt->task);
  if (!layout.ok()) return layout.status();
  if (absl::Status s = ValidateCrossNode(xt->task, *layout); !s.ok()) {
    // Not worth a connect; a link already there is broken so that the peers
    // running their part fail now rather than at their deadline.
    std::shared_ptr<LinkState> cached;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = links_.find(LinkKey{xt->task.group_key, layout->nodes});
      if (it != links_.end() && it->second.epoch == xt->task.epoch) cached = it->second.state;
    }
    if (cached != nullptr) {
      std::lock_guard<std::mutex> l(cached->mu);
      if (cached->link != nullptr) cached->link->Abort(s);
    }
    return s;
  }
  absl::StatusOr<std::shared_ptr<LinkState>> ls = AcquireLink(xt, *layout, deadline);
  if (!ls.ok()) return ls.status();
  NodeLink* link;
  {
    std::lock_guard<std::mutex> l((*ls)->mu);
    link = (*ls)->link.get();
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!xt->abort.ok()) {
      link->Abort(xt->abort);
      return xt->abort;
    }
  }
  CrossNodeRun run;
  run.link = link;
  run.next_tag = &(*ls)->next_tag;
  run.deadline = deadline;
  run.chunk_bytes = options_.chunk_bytes;
  run.small_allreduce_bytes = options_.small_allreduce_bytes;
  run.sidecar = sidecar;
  run.scratch = scratch;
  run.pool = pool;
  absl::Status status = RunCrossNode(xt->task, *layout, run);
  if (!status.ok()) {
    status = NameRanksOfNodes(status, xt->task);
    link->Abort(status);  // peers must not wait for what will not come
  }
  return status;
}

void HierarchicalEngine::WorkerLoop() {
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
      if (!xt->abort.ok()) status = xt->abort;  // the reason, not the broken link
    }
    if (!status.ok()) {
      status = absl::Status(status.code(), absl::StrCat(std::string(CollectiveName(xt->task.collective)),
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

}  // namespace

std::unique_ptr<Engine> MakeHierarchicalEngine(std::unique_ptr<Engine> local,
                                               std::unique_ptr<TransportFactory> transport,
                                               HierarchicalEngineOptions options) {
  options.threads = std::max(1, options.threads);
  options.local_threads = std::clamp(options.local_threads, 1, 64);
  return std::make_unique<HierarchicalEngine>(std::move(local), std::move(transport), options);
}

}  // namespace hsdp
