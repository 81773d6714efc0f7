#include "daemon/engine/cpu/thread_pool.h"

#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace hsdp::cpu {

ThreadPool::ThreadPool(int threads, const char* name, int nice) {
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, name, nice] {
      NameAndNice(name, nice);
      WorkerLoop();
    });
  }
}

void ThreadPool::NameAndNice(const char* name, int nice) {
  if (name != nullptr && name[0] != '\0') pthread_setname_np(pthread_self(), name);
  // Per thread on Linux: PRIO_PROCESS with a thread id. Lowering is always
  // allowed; a failure leaves the thread at the daemon's priority.
  if (nice > 0) {
    const int tid = static_cast<int>(::syscall(SYS_gettid));
    errno = 0;
    const int now = ::getpriority(PRIO_PROCESS, tid);
    if (errno == 0) ::setpriority(PRIO_PROCESS, tid, std::min(19, now + nice));
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::RunChunks(const std::function<void(size_t)>& fn, size_t n) {
  for (size_t i = next_.fetch_add(1); i < n; i = next_.fetch_add(1)) fn(i);
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(size_t)>* fn;
    size_t n;
    {
      std::unique_lock<std::mutex> l(mu_);
      start_cv_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      fn = fn_;
      n = n_;
    }
    RunChunks(*fn, n);
    {
      std::lock_guard<std::mutex> l(mu_);
      ++finished_;
    }
    done_cv_.notify_one();
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (workers_.empty() || n == 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    fn_ = &fn;
    n_ = n;
    finished_ = 0;
    next_.store(0);
    ++generation_;
  }
  start_cv_.notify_all();
  RunChunks(fn, n);
  // Every worker takes part in every generation exactly once, so none can
  // outlive this call with a pointer to `fn`.
  std::unique_lock<std::mutex> l(mu_);
  done_cv_.wait(l, [&] { return finished_ == workers_.size(); });
}

}  // namespace hsdp::cpu
