// A fixed pool for data-parallel loops: ParallelFor splits [0, n) into
// chunks that the pool's threads and the caller take dynamically.
//
// Thread-safety: ParallelFor may be called from one thread at a time (the
// engine's executor); the pool's workers only run the current loop.
#ifndef HSDP_DAEMON_ENGINE_CPU_THREAD_POOL_H_
#define HSDP_DAEMON_ENGINE_CPU_THREAD_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hsdp::cpu {

class ThreadPool {
 public:
  // `threads` >= 1 counts the caller: threads - 1 workers are started.
  // `name` (at most 15 bytes, "" = unnamed) and `nice` (an increment, 0 =
  // none) apply to the worker threads it starts.
  explicit ThreadPool(int threads, const char* name = "", int nice = 0);
  // Names the calling thread and lowers its priority by `nice` (0: unchanged).
  static void NameAndNice(const char* name, int nice);
  ~ThreadPool();

  // Scheduling class of a thread (`tid` 0: the caller): SCHED_IDLE runs only
  // on a core nothing else wants, SCHED_OTHER is the normal one (its nice
  // value is kept). False when the kernel refused.
  static bool SetIdle(int tid, bool idle);
  // Whether this process may leave SCHED_IDLE again once in it (root,
  // CAP_SYS_NICE or RLIMIT_NICE): checked on a throwaway thread.
  static bool CanLeaveIdle();
  // SetIdle for every worker (not the caller).
  void SetWorkersIdle(bool idle);

  // Calls fn(i) for every i in [0, n), on up to threads() threads; returns
  // when all calls returned.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  void WorkerLoop();
  void RunChunks(const std::function<void(size_t)>& fn, size_t n);

  std::vector<std::thread> workers_;
  std::vector<int> tids_;    // the workers' kernel thread ids, set before the constructor returns
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // guarded by mu_
  bool stop_ = false;        // guarded by mu_
  size_t finished_ = 0;      // workers done with the current loop, guarded by mu_
  const std::function<void(size_t)>* fn_ = nullptr;  // guarded by mu_
  size_t n_ = 0;                                     // guarded by mu_
  std::atomic<size_t> next_{0};
};

}  // namespace hsdp::cpu

#endif  // HSDP_DAEMON_ENGINE_CPU_THREAD_POOL_H_
