// The engine interface: executes one matched collective over memory that the
// daemon can address directly (mapped host buffers now; device buffers and
// inter-node transports in later engines). The dispatcher lowers every
// submission (incl. the HSDP composite) into these primitive tasks.
#ifndef HSDP_DAEMON_ENGINE_ENGINE_H_
#define HSDP_DAEMON_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/engine/cpu/reduce_kernels.h"
#include "hsdp/types.h"

namespace hsdp {

struct EngineTask {
  // kAllReduce, kAllGather, kReduceScatter, kBroadcast or kBarrier.
  Collective collective = Collective::kInvalid;
  cpu::ReduceSpec spec;  // spec.dtype is the element type of every buffer
  uint64_t count = 0;    // as in shm::OpDescriptor
  int root = 0;
  // By group rank. Already validated: every range lies inside a mapping kept
  // alive by the caller until `done` runs.
  std::vector<const void*> send;
  std::vector<void*> recv;
  // 0 runs first: all-gather and reduce-scatter (they gate compute), then 1.
  int priority = 1;

  uint64_t BytesPerRank() const;
};

class Engine {
 public:
  using DoneCallback = std::function<void(absl::Status status, uint64_t exec_ns)>;
  virtual ~Engine() = default;

  // Runs `task` and then calls `done` exactly once, either before returning
  // (small tasks run inline) or later from an engine thread. Thread-safe.
  // After Shutdown(), fails every task with UNAVAILABLE.
  virtual void Submit(EngineTask task, DoneCallback done) = 0;
  // Finishes queued tasks, stops threads. Idempotent.
  virtual void Shutdown() = 0;

  virtual std::string name() const = 0;
  virtual int threads() const = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_ENGINE_H_
