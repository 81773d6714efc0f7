// The CPU engine: runs collectives among trainers on this node directly on
// their mapped host buffers. All-reduce reads every rank's input once and
// writes every rank's output in the same pass; work is split across a
// thread pool by element ranges.
//
// Threads: one executor thread takes queued tasks in priority order
// (all-gather / reduce-scatter before all-reduce) and runs each on the pool.
// Tasks of at most `inline_max_bytes` per rank run inline in the submitting
// thread, single-threaded, for latency.
//
// Ordering: a task is reported `launched` only once it has run (just before
// `completed`), so a group never has two CPU tasks in flight and dependent
// tasks (the composite's second phase) always start after their dependency.
// Only host buffers of members on this node; anything else completes with
// UNIMPLEMENTED naming what is missing.
#ifndef HSDP_DAEMON_ENGINE_CPU_CPU_ENGINE_H_
#define HSDP_DAEMON_ENGINE_CPU_CPU_ENGINE_H_

#include <condition_variable>
#include <map>
#include <cstdint>
#include <memory>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "daemon/engine/cpu/thread_pool.h"
#include "daemon/engine/engine.h"

namespace hsdp {

class CpuEngine : public Engine {
 public:
  // threads: total threads used for large tasks (>= 1).
  CpuEngine(int threads, uint64_t inline_max_bytes);
  ~CpuEngine() override;

  absl::Status CreateGroup(const EngineGroupSpec&) override { return absl::OkStatus(); }
  void DestroyGroup(const std::string&) override {}
  uint64_t Launch(EngineTask task, EngineCallbacks callbacks) override;
  void Abort(uint64_t ticket, const absl::Status& why) override;
  void Shutdown() override;
  std::string name() const override { return "cpu"; }
  int threads() const override { return pool_.threads(); }
  bool Supports(MemoryKind kind) const override { return kind == MemoryKind::kHost; }
  bool SupportsRemoteMembers() const override { return false; }

  // Runs `task` to completion on `pool` (or single-threaded when null).
  // Exposed for tests and benchmarks.
  static void Run(const EngineTask& task, cpu::ThreadPool* pool);

 private:
  struct Queued {
    int priority;
    uint64_t order;  // also the ticket
    std::shared_ptr<EngineTask> task;
    std::shared_ptr<EngineCallbacks> callbacks;
    bool operator<(const Queued& o) const {  // max-heap: lower priority value first, then FIFO
      return priority != o.priority ? priority > o.priority : order > o.order;
    }
  };
  void ExecutorLoop();
  // Non-OK when a dependency of `task` failed (or `ticket` was aborted).
  absl::Status Precondition(const EngineTask& task, uint64_t ticket);
  // Runs the task (or not, on a failed precondition) and reports it.
  void Execute(uint64_t ticket, const EngineTask& task, const EngineCallbacks& cb,
               cpu::ThreadPool* pool);

  const uint64_t inline_max_bytes_;
  cpu::ThreadPool pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Queued> queue_;  // guarded by mu_
  uint64_t next_ticket_ = 1;           // guarded by mu_
  bool stopping_ = false;              // guarded by mu_
  // Aborted tickets not yet run, and recently failed tickets (for tasks
  // that depend on them); both bounded.
  std::map<uint64_t, absl::Status> aborted_;  // guarded by mu_
  std::map<uint64_t, absl::Status> failed_;   // guarded by mu_
  std::thread executor_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CPU_CPU_ENGINE_H_
