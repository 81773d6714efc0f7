// Internal to the NCCL engine (nccl_engine.cc, nccl_engine_issue.cc): the
// state of a communicator set and of a running task, and small helpers.
// Touched only on the engine thread.
#ifndef HSDP_DAEMON_ENGINE_NCCL_NCCL_ENGINE_STATE_H_
#define HSDP_DAEMON_ENGINE_NCCL_NCCL_ENGINE_STATE_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/config/priority_classes.h"
#include "daemon/engine/nccl/collective_name.h"
#include "daemon/engine/nccl/nccl_engine.h"

namespace hsdp::nccl {

inline bool Reduces(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter;
}
// All-gather and reduce-scatter run on the high-priority streams.
// The stream priority of a task: the job's class first (docs/qos.md), then
// the op. A job in a class above the default (level < 4) runs every
// collective on the high-priority stream; one below it (level > 4) never
// does, so a batch job's shards cannot preempt an interactive job; in the
// default class the shard collectives (all-gather, reduce-scatter: they gate
// compute) and ops marked latency-critical (priority < 0) do.
inline bool HighPriority(const EngineTask& t) {
  constexpr int kDefault = static_cast<int>(kDefaultPriorityLevel);
  if (t.qos_class < kDefault) return true;
  if (t.qos_class > kDefault) return false;
  return t.priority < 0 || t.collective == Collective::kAllGather ||
         t.collective == Collective::kReduceScatter;
}

struct NcclEngine::CommSet {
  std::string key;
  std::string group_key;
  uint32_t epoch = 0;
  std::vector<int> ranks;    // global ranks of this node's members
  std::vector<int> devices;  // their devices
  std::vector<CommHandle> comms;  // their communicators
  // Member index -> index in `comms` (its device's communicator); -1 for a
  // member on another node (its daemon owns that NCCL rank).
  std::vector<int> comm_of;
  // Several members share a device: one NCCL rank per device, hsdpd's own
  // kernels within each (nccl_engine_shared.cc); no communicator at all when
  // every member is on one device.
  bool shared = false;
  absl::Status broken;       // set once aborted
  bool retire = false;       // release once nothing runs on it
  std::set<uint64_t> running;
  uint64_t last_ticket = 0;  // the set's latest task: the next one runs after it
  // The set's own streams, (device, high priority?) -> stream: never shared
  // with another set, so two daemons issuing two groups in opposite orders
  // cannot deadlock.
  std::map<std::pair<int, bool>, device::StreamHandle> streams;
  // Scratch buffers by (stream, slot): stream-ordered reuse.
  struct ScratchBuf {
    device::DevicePtr ptr = 0;
    uint64_t bytes = 0;
  };
  std::map<std::pair<device::StreamHandle, int>, ScratchBuf> scratch;
};

struct NcclEngine::Running {
  uint64_t ticket = 0;
  EngineTask task;
  EngineCallbacks cb;
  std::shared_ptr<CommSet> set;
  std::map<int, device::EventHandle> done;  // device -> the engine's completion event
  std::map<int, device::StreamHandle> streams;  // device -> the stream it ran on
  absl::Time deadline;
  int64_t start_ns = 0;
};

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_NCCL_ENGINE_STATE_H_
