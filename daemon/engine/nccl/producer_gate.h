// ProducerGate: holds the NCCL engine's tasks back until they may be issued.
//
// Why a gate: cudaStreamWaitEvent on a trainer's producer event would queue
// the collective behind work the daemon does not control. If that event never
// fires (a stuck or dead trainer) and the task is aborted, the queued kernels
// either run later — after ncclCommAbort freed the communicator and the
// session unmapped the buffers: a sticky illegal address for every session —
// or NCCL's free blocks on the stuck stream (its device synchronisation). So
// the gate polls the producer events (DeviceApi::EventDone: no blocking) and
// lets a task out only once they completed; until then nothing of it is on
// any stream, and an abort simply drops it.
//
// Rules:
//  - A task is ready once the producer event (EngineMember::wait_event) of
//    every local member that names one is done, and none of the tasks it
//    depends on is still held here or still running (the owner says which
//    run): no stream ever waits on another communicator set's work, since
//    aborting this set would make NCCL's free wait for that work, which may
//    be stuck until the engine thread aborts it (a deadlock).
//  - Per group key, tasks leave in launch order: a task that is not ready
//    keeps its group's later tasks behind it; other groups are not held.
//  - A producer event that reports an error fails its task (naming the
//    member's rank). A task that is not ready fails once the engine is
//    stopping past its grace period (UNAVAILABLE) or once its deadline
//    passed (DEADLINE_EXCEEDED: nothing was issued).
//  - Remove() takes one task out (an abort); its owner completes it.
//
// Thread-safety: none; one thread (the engine thread) owns the gate. The
// hooks Release() calls run on that thread, in launch order per group, and
// must not call back into the gate.
#ifndef HSDP_DAEMON_ENGINE_NCCL_PRODUCER_GATE_H_
#define HSDP_DAEMON_ENGINE_NCCL_PRODUCER_GATE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/device/device_api.h"
#include "daemon/engine/engine.h"

namespace hsdp::nccl {

// A launched task on its way to the device.
struct QueuedTask {
  uint64_t ticket = 0;
  EngineTask task;
  EngineCallbacks cb;
  absl::Time deadline;  // launch + op_timeout
};

class ProducerGate {
 public:
  // What Release() does with the tasks it lets out, and what it asks the owner.
  struct Hooks {
    // Whether the task with this ticket was issued and has not finished.
    std::function<bool(uint64_t ticket)> running;
    // A ready task, to issue now (later tasks see it running at once).
    std::function<void(QueuedTask q)> issue;
    // A task that may never be issued, and why; nothing of it was issued.
    std::function<void(QueuedTask q, absl::Status why)> fail;
  };

  // Polls producer events through `dev` (which must outlive the gate);
  // `op_timeout` names the wait in the deadline error.
  ProducerGate(device::DeviceApi* dev, absl::Duration op_timeout)
      : dev_(dev), op_timeout_(op_timeout) {}

  // Holds `q` behind the earlier tasks of its group.
  void Add(QueuedTask q);
  // Issues, in launch order per group, every task that is ready, and fails
  // those whose producer failed, whose deadline passed (by `now`) or that
  // still wait when `late_stop` (the engine stopping past its grace).
  void Release(absl::Time now, bool late_stop, const Hooks& hooks);
  // Takes the task `ticket` out (nullopt when it is not held here).
  std::optional<QueuedTask> Remove(uint64_t ticket);

  bool Holds(uint64_t ticket) const { return tickets_.count(ticket) != 0; }
  bool empty() const { return groups_.empty(); }
  // Groups with tasks held (the engine thread counts these as in flight).
  size_t groups() const { return groups_.size(); }
  size_t tasks() const { return tickets_.size(); }

 private:
  // The reason `q` must fail now (OK: it is not failed); `ready` says
  // whether it may be issued.
  absl::Status Check(const QueuedTask& q, const Hooks& hooks, bool* ready);

  device::DeviceApi* const dev_;
  const absl::Duration op_timeout_;
  std::map<std::string, std::deque<QueuedTask>> groups_;  // by group key, launch order
  std::set<uint64_t> tickets_;                            // every held ticket
};

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_PRODUCER_GATE_H_
