// The CPU engine: runs collectives among trainers on this node directly on
// their mapped host buffers. All-reduce reads every rank's input once and
// writes every rank's output in the same pass; work is split across a
// thread pool by element ranges.
//
// Threads: one executor thread takes queued tasks in priority order
// (all-gather / reduce-scatter before all-reduce) and runs each on the pool.
// Tasks of at most `inline_max_bytes` per rank run inline in the submitting
// thread, single-threaded, for latency.
#ifndef HSDP_DAEMON_ENGINE_CPU_CPU_ENGINE_H_
#define HSDP_DAEMON_ENGINE_CPU_CPU_ENGINE_H_

#include <condition_variable>
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

  void Submit(EngineTask task, DoneCallback done) override;
  void Shutdown() override;
  std::string name() const override { return "cpu"; }
  int threads() const override { return pool_.threads(); }

  // Runs `task` to completion on `pool` (or single-threaded when null).
  // Exposed for tests and benchmarks.
  static void Run(const EngineTask& task, cpu::ThreadPool* pool);

 private:
  struct Queued {
    int priority;
    uint64_t order;
    std::shared_ptr<EngineTask> task;
    std::shared_ptr<DoneCallback> done;
    bool operator<(const Queued& o) const {  // max-heap: lower priority value first, then FIFO
      return priority != o.priority ? priority > o.priority : order > o.order;
    }
  };
  void ExecutorLoop();

  const uint64_t inline_max_bytes_;
  cpu::ThreadPool pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Queued> queue_;  // guarded by mu_
  uint64_t next_order_ = 0;            // guarded by mu_
  bool stopping_ = false;              // guarded by mu_
  std::thread executor_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CPU_CPU_ENGINE_H_
