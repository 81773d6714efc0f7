// Internal to the hierarchical engine (hierarchical_engine.h): the
// HierarchicalEngine class, whose methods live in hierarchical_engine.cc
// (launching, each group's queue, the workers, abort and shutdown),
// hierarchical_links.cc (the links between daemons and running a task over
// one) and hierarchical_dependencies.cc (depends_on, the forwarding of
// all-local tasks); and the state of a link and of a connect in progress.
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_HIERARCHICAL_ENGINE_STATE_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_HIERARCHICAL_ENGINE_STATE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "daemon/engine/crossnode/cross_node_task.h"
#include "daemon/engine/crossnode/hierarchical_engine.h"
#include "daemon/engine/crossnode/node_transport.h"
#include "daemon/engine/crossnode/sidecar.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/peer_instances.h"

namespace hsdp {

namespace cpu {
class ThreadPool;
}

namespace hierarchical_internal {

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

class HierarchicalEngine : public Engine, public PeerInstances {
 public:
  HierarchicalEngine(std::unique_ptr<Engine> local, std::unique_ptr<TransportFactory> transport,
                     HierarchicalEngineOptions options)
      : inner_(std::move(local)), transport_(std::move(transport)), options_(options) {}

  ~HierarchicalEngine() override { Shutdown(); }

  absl::Status CreateGroup(const EngineGroupSpec& spec) override;
  void DestroyGroup(const std::string& key) override;

  uint64_t Launch(EngineTask task, EngineCallbacks cb) override;
  void Abort(uint64_t ticket, const absl::Status& why) override;
  void Shutdown() override;

  std::string name() const override { return absl::StrCat("hierarchical(", inner_->name(), ")"); }
  int threads() const override { return inner_->threads() + options_.threads; }
  bool Supports(MemoryKind kind) const override { return inner_->Supports(kind); }
  bool SupportsRemoteMembers() const override { return true; }

  std::vector<std::string> LinkedInstances(const std::string& key, uint32_t epoch,
                                           int node) const override;

 private:
  // A task with remote members.
  struct XTask {
    uint64_t ticket = 0;
    EngineTask task;
    EngineCallbacks cb;
    bool reported = false;  // `launched` was called; only then may it run
    bool running = false;
    absl::Status abort;                          // guarded by mu_
    std::shared_ptr<LinkState> link;             // while running, guarded by mu_
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

  mutable std::mutex mu_;
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

}  // namespace hierarchical_internal
}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_HIERARCHICAL_ENGINE_STATE_H_
