// A small fixed pool of threads for control-plane work that may take a while
// (mapping a registered buffer, ...), so gRPC and data-connection threads
// only hand work off and never wait. FIFO; Post never blocks.
//
// Thread-safety: all methods are thread-safe.
#ifndef HSDP_DAEMON_UTIL_EXECUTOR_H_
#define HSDP_DAEMON_UTIL_EXECUTOR_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hsdp {

class Executor {
 public:
  explicit Executor(int threads);
  ~Executor();  // runs what is queued, then joins
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Queues `fn`. After Shutdown() it runs inline instead (never dropped).
  void Post(std::function<void()> fn);
  void Shutdown();

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_UTIL_EXECUTOR_H_
