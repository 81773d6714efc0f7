#include "daemon/engine/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace hsdp::cpu {

ThreadPool::ThreadPool(int threads, const char* name, int nice) {
  const size_t workers = threads > 1 ? static_cast<size_t>(threads - 1) : 0;
  tids_.assign(workers, 0);
  for (size_t i = 0; i < workers; ++i) {
    workers_.emplace_back([this, name, nice, i] {
      NameAndNice(name, nice);
      {
        std::lock_guard<std::mutex> l(mu_);
        tids_[i] = static_cast<int>(::syscall(SYS_gettid));
      }
      done_cv_.notify_one();
      WorkerLoop();
    });
  }
  std::unique_lock<std::mutex> l(mu_);
  done_cv_.wait(l, [&] { return std::find(tids_.begin(), tids_.end(), 0) == tids_.end(); });
}

bool ThreadPool::SetIdle(int tid, bool idle) {
  sched_param p{};
  p.sched_priority = 0;
  return ::sched_setscheduler(tid, idle ? SCHED_IDLE : SCHED_OTHER, &p) == 0;
}

bool ThreadPool::CanLeaveIdle() {
  bool ok = false;
  std::thread t([&ok] { ok = SetIdle(0, true) && SetIdle(0, false); });
  t.join();
  return ok;
}

void ThreadPool::SetWorkersIdle(bool idle) {
  for (int tid : tids_) SetIdle(tid, idle);
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
