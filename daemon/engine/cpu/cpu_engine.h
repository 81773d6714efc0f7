// The CPU engine: runs collectives among trainers on this node directly on
// their mapped host buffers. All-reduce reads every rank's input once and
// writes every rank's output in the same pass; work is split across a
// thread pool by element ranges.
//
// Threads: one executor thread serves queued tasks in the order of a
// FairQueue (fair_queue.h): a lower qos_class first, jobs of one class
// sharing the engine by bytes served, and within a job all-gather /
// reduce-scatter before all-reduce. A task larger than `slice_bytes` per
// rank runs in slices of that many bytes per rank and goes back to the
// queue after each, so another job's (or a higher class's) task waits for
// at most one slice. Tasks of at most `inline_max_bytes` per rank run inline
// in the submitting thread, single-threaded, for latency.
//
// CPU between classes (idle_lower_classes): while a task of a higher class
// (a lower qos_class value) was launched within kSharedWindowNs, a lower
// class's slice first waits for a gap of kQuietGapNs in the higher class's
// launches (at most kMaxYieldNs, so it is never starved), then computes; the
// engine's threads are in SCHED_IDLE for both. The higher class's inline ops,
// its trainers and the dispatcher then find a core free the moment they want
// one (a core busy with SCHED_IDLE work does not pull spinning threads over;
// an idle one does). The executor is back in SCHED_OTHER before it takes any
// lock others share (the queue, the groups' and the metrics' locks in the
// completion), so a demoted thread never holds up a better class.
//
// Ordering: a task is reported `launched` only once it has run (just before
// `completed`), so a group never has two CPU tasks in flight and dependent
// tasks (the composite's second phase) always start after their dependency.
// An abort of a task that started ends it at its next slice boundary (its
// outputs are then partly written, as for any failed operation).
// Only host buffers of members on this node; anything else completes with
// UNIMPLEMENTED naming what is missing.
#ifndef HSDP_DAEMON_ENGINE_CPU_CPU_ENGINE_H_
#define HSDP_DAEMON_ENGINE_CPU_CPU_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <string>
#include <utility>
#include <map>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/engine/cpu/fair_queue.h"
#include "daemon/engine/cpu/thread_pool.h"
#include "daemon/engine/engine.h"
#include "daemon/util/clock.h"

namespace hsdp {

class CpuEngine : public Engine {
 public:
  // threads: total threads used for large tasks (>= 1). slice_bytes: bytes
  // per rank a queued task runs before the queue is consulted again.
  static constexpr uint64_t kDefaultSliceBytes = 4ull << 20;
  // While the engine is shared (a task of another job or class ran within
  // kSharedWindowNs), slices are slice_bytes / kSharedSliceDivisor (at least
  // 64 KiB per rank): another job's op, or a higher class's, then waits for
  // a short slice; a job alone keeps the long ones and their lower overhead.
  static constexpr uint64_t kSharedSliceDivisor = 32;
  static constexpr int64_t kSharedWindowNs = 20'000'000;
  static constexpr int64_t kQuietGapNs = 200'000;
  static constexpr int64_t kMaxYieldNs = 5'000'000;
  // bulk_nice: nice increment (0..19) of the executor and pool threads, which
  // run queued work; tasks run inline keep the caller's priority.
  // idle_lower_classes: see above; off when the process could not leave
  // SCHED_IDLE again (not root, no CAP_SYS_NICE), with a log line.
  // clock: what the windows and gaps above are measured on (tests pass a
  // FakeClock; null = Clock::Real()); task durations use it too.
  CpuEngine(int threads, uint64_t inline_max_bytes, uint64_t slice_bytes = kDefaultSliceBytes,
            int bulk_nice = 0, bool idle_lower_classes = false, const Clock* clock = nullptr);
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
  // Runs elements [begin, end) of `task` (of `count` per rank; the whole
  // task for all-to-all and barrier, which take begin 0 only).
  static void RunRange(const EngineTask& task, cpu::ThreadPool* pool, uint64_t begin,
                       uint64_t end);
  // Whether RunRange can split `task` (all but all-to-all and barrier).
  static bool Sliceable(const EngineTask& task);

 private:
  // A task taken by the queue: what is left of it and what it cost so far.
  struct Queued {
    std::shared_ptr<EngineTask> task;
    std::shared_ptr<EngineCallbacks> callbacks;
    uint64_t next = 0;     // elements done (sliced tasks)
    uint64_t exec_ns = 0;  // time in its slices so far
    bool started = false;  // its precondition was checked
  };
  void ExecutorLoop();
  // Non-OK when a dependency of `task` failed (or `ticket` was aborted).
  absl::Status Precondition(const EngineTask& task, uint64_t ticket);
  // Runs the task (or not, on a failed precondition) and reports it.
  void Execute(uint64_t ticket, const EngineTask& task, const EngineCallbacks& cb,
               cpu::ThreadPool* pool);
  // Reports a finished task (records a failure for its dependents first).
  void Finish(uint64_t ticket, absl::Status status, uint64_t exec_ns, const EngineCallbacks& cb);
  // Runs one slice of queued task `ticket`; true when the task is finished.
  bool RunSlice(uint64_t ticket, Queued& q);

 public:
  // Slices run so far (tests: slices shrink while the engine is shared).
  uint64_t slices_run() const { return slices_run_.load(std::memory_order_relaxed); }
  // Of those, the ones computed in SCHED_IDLE (idle_lower_classes), and the
  // ones that first waited for a quiet gap in a higher class's traffic.
  uint64_t idle_slices() const { return idle_slices_.load(std::memory_order_relaxed); }
  uint64_t yield_waits() const { return yield_waits_.load(std::memory_order_relaxed); }
  bool idle_lower_classes() const { return idle_lower_classes_; }
  static constexpr int kClassLevels = 8;  // qos_class 0..7

 private:
  // Whether a class better than `qos_class` launched a task within
  // kSharedWindowNs of `now`.
  bool BetterClassActive(int qos_class, int64_t now, int64_t window_ns) const;
  // Waits (the executor) until a better class than `qos_class` launched
  // nothing for kQuietGapNs, or for kMaxYieldNs: true. False at once when
  // a better class's task is queued (it runs first).
  bool AwaitQuietGap(int qos_class, int64_t now);

  const Clock* const clock_;
  const uint64_t inline_max_bytes_;
  const uint64_t slice_bytes_;
  const bool idle_lower_classes_;
  // When each class level last launched a task (inline or queued).
  std::atomic<int64_t> class_active_ns_[kClassLevels] = {};
  // Tasks in queue_ per class level, read without mu_ while waiting.
  std::atomic<int> queued_by_class_[kClassLevels] = {};
  std::atomic<uint64_t> next_ticket_{1};
  cpu::ThreadPool pool_;
  std::mutex mu_;
  std::condition_variable cv_;
  cpu::FairQueue queue_;                // guarded by mu_
  std::map<uint64_t, Queued> queued_;   // by ticket; guarded by mu_
  bool stopping_ = false;              // guarded by mu_
  // Aborted tickets not yet run, and recently failed tickets (for tasks
  // that depend on them); both bounded.
  std::map<uint64_t, absl::Status> aborted_;  // guarded by mu_
  std::map<uint64_t, absl::Status> failed_;   // guarded by mu_
  // The executor thread's own: the (class, job) it served last, and when
  // it last switched between two of them.
  std::pair<int, std::string> last_served_;
  int64_t last_switch_ns_ = 0;
  std::atomic<uint64_t> slices_run_{0};
  std::atomic<uint64_t> idle_slices_{0};
  std::atomic<uint64_t> yield_waits_{0};
  std::thread executor_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CPU_CPU_ENGINE_H_
