// The engine interface: executes matched collectives for the groups of this
// node. It is neutral to memory kind (host buffers now, device buffers under
// a GPU engine) and to transport (members on this node, members on other
// nodes reached through a peer transport). The group lowers every matched
// submission (incl. each phase of the HSDP composite) into an EngineTask.
//
// Life of a task: Launch() -> `launched` (the engine has ordered the task:
// a later task of the same group runs after it; a stream-ordered engine
// calls this as soon as the work is enqueued) -> `completed` (exactly once,
// with the outcome). Abort() asks the engine to end a task early; the task
// still completes exactly once. A task may depend on earlier tickets (the
// composite's second phase on its first): it must not start before they
// finished, and fails if one of them failed.
#ifndef HSDP_DAEMON_ENGINE_ENGINE_H_
#define HSDP_DAEMON_ENGINE_ENGINE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "hsdp/kernels/reduce_spec.h"
#include "hsdp/types.h"

namespace hsdp {

enum class MemoryKind : uint8_t { kHost = 0, kDevice = 1 };

// One rank's buffer as the engine addresses it.
struct BufferView {
  MemoryKind kind = MemoryKind::kHost;
  int device = -1;       // kDevice: device ordinal
  void* data = nullptr;  // host: mapped address; device: address in the daemon's context
  uint64_t bytes = 0;    // bytes of the range the task uses
};

// A group member as the engine sees it, by group rank.
struct EngineMember {
  int global_rank = 0;
  int node = 0;        // node hosting the member (its daemon's node rank)
  bool local = true;   // on this node: `send` and `recv` are valid
  BufferView send;
  BufferView recv;
  // All-to-all with uneven blocks (local members): elements this member
  // sends to / receives from each group rank. Empty: equal blocks of count.
  std::vector<uint64_t> send_counts;
  std::vector<uint64_t> recv_counts;
  // Device members (stream-ordered engines): the member's producer event,
  // which the engine's stream waits on before reading; and an event the
  // engine records when this member's output is ready. Handles of the
  // engine's device::DeviceApi; 0 = none.
  uint64_t wait_event = 0;
  uint64_t done_event = 0;
};

// What an engine needs to set up per group (a Gloo context, an NCCL
// communicator...). The key is the same on every daemon hosting a member.
struct EngineGroupSpec {
  std::string key;
  uint32_t epoch = 1;
  std::vector<int> ranks;  // global ranks by group rank
  std::vector<int> nodes;  // node of each rank
  int this_node = 0;
};

struct EngineTask {
  // kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier or
  // kAllToAll (send/recv are lowered to a two-member broadcast).
  Collective collective = Collective::kInvalid;
  ReduceSpec spec;     // spec.dtype is the element type of every buffer
  uint64_t count = 0;  // as in shm::OpDescriptor
  int root = 0;
  std::string group_key;
  uint32_t epoch = 1;
  uint64_t seq = 0;
  // By group rank. Local members' ranges are validated and stay mapped until
  // `completed` runs.
  std::vector<EngineMember> members;
  // 0 runs first: all-gather and reduce-scatter (they gate compute), then 1.
  int priority = 1;
  // Whose task, for engines that share their time among jobs (the CPU
  // engine's FairQueue): the group's JobKey::Encoded(), and the level of the
  // job's priority class (a lower value is served first, strictly; 4 is the
  // default class's, daemon/config/priority_classes.h).
  std::string job;
  int qos_class = 4;
  // Tickets that must finish (successfully) before this task starts.
  std::vector<uint64_t> depends_on;

  uint64_t BytesPerRank() const;
  bool AllLocal() const;
  bool AllHost() const;
};

struct EngineCallbacks {
  // Ordered: tasks of the same group launched later run after this one.
  // Called once with the task's ticket, before `completed`, possibly before
  // Launch returns.
  std::function<void(uint64_t ticket)> launched;
  // Finished. Called exactly once, possibly before Launch returns.
  std::function<void(absl::Status status, uint64_t exec_ns)> completed;
};

class Engine {
 public:
  virtual ~Engine() = default;

  // Prepares per-group state for (spec.key, spec.epoch). Idempotent. A new
  // epoch replaces the old one's state. Thread-safe.
  virtual absl::Status CreateGroup(const EngineGroupSpec& spec) = 0;
  // Releases the group's state; tasks still running complete first. Thread-safe.
  virtual void DestroyGroup(const std::string& key) = 0;

  // Starts `task`; returns its ticket (> 0). Thread-safe. After Shutdown(),
  // completes every task with UNAVAILABLE.
  virtual uint64_t Launch(EngineTask task, EngineCallbacks callbacks) = 0;
  // Asks the engine to end ticket `ticket` with `why` (a queued task is
  // dropped, a running one interrupted where the transport allows). Unknown
  // or finished tickets are ignored. Thread-safe, never blocks on the task.
  virtual void Abort(uint64_t ticket, const absl::Status& why) = 0;

  // Finishes queued tasks, stops threads. Idempotent.
  virtual void Shutdown() = 0;

  virtual std::string name() const = 0;
  virtual int threads() const = 0;
  // Whether tasks may name buffers of this kind / members on other nodes.
  virtual bool Supports(MemoryKind kind) const = 0;
  virtual bool SupportsRemoteMembers() const = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_ENGINE_H_
