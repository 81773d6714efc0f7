// Helpers of the cross-node engine's workers. A Sidecar is one helper thread
// that runs a closure (the local stage of the next chunk, a copy-out) while
// its owner waits on the network; Scratch is a worker's reusable staging
// memory.
//
// Thread-safety: a Sidecar is driven by one owner thread (Run then Wait);
// Scratch is not thread-safe (one per worker).
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_SIDECAR_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_SIDECAR_H_

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hsdp {

// One helper thread that runs a closure while its owner waits on the network.
class Sidecar {
 public:
  Sidecar();
  ~Sidecar();
  Sidecar(const Sidecar&) = delete;
  Sidecar& operator=(const Sidecar&) = delete;
  void Run(std::function<void()> fn);  // at most one at a time
  // Until the closure returned; false when it threw (out of memory).
  bool Wait();

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> fn_;  // guarded by mu_
  bool busy_ = false;         // guarded by mu_
  bool threw_ = false;        // guarded by mu_
  bool stop_ = false;         // guarded by mu_
  std::thread thread_;
};

// Reusable staging memory of one worker.
struct Scratch {
  std::vector<char> bufs[4];
  char* Get(int i, size_t bytes) {
    if (bufs[i].size() < bytes) bufs[i].resize(bytes);
    return bufs[i].data();
  }
  // Gives the memory back when more than `max_bytes` are held.
  void Trim(size_t max_bytes) {
    size_t held = 0;
    for (const auto& b : bufs) held += b.capacity();
    if (held <= max_bytes) return;
    for (auto& b : bufs) std::vector<char>().swap(b);
  }
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_SIDECAR_H_
