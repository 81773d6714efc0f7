// What one node settles about a cross-node task before anything moves:
// which nodes and ranks take part (MakeTaskLayout); whether this node's
// members describe a valid operation on their buffers (ValidateCrossNode,
// every length checked against the local buffers); and the fixed-size
// header of the task's shape that every participating node sends every
// other one first (TaskHeader), so that nodes running different shapes fail
// on both sides before any sized message moves. Stateless and thread-safe.
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_CROSS_NODE_TASK_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_CROSS_NODE_TASK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/engine/engine.h"

namespace hsdp {

inline constexpr uint64_t kMaxElements = uint64_t{1} << 40;  // shm::kMaxCount
// Message parts of an all-to-all are i * G + j: G^2 must fit in 32 bits.
inline constexpr int kMaxGroupSize = 65535;
inline constexpr uint32_t kHeaderMagic = 0x4e584853;  // "SHXN"
inline constexpr uint32_t kHeaderVersion = 1;

// Who takes part in a task: the nodes hosting its members and which ranks
// each of them hosts.
struct TaskLayout {
  int group_size = 0;
  int this_node = 0;
  std::vector<int> nodes;                  // ascending, unique
  int self = 0;                            // index of this_node in nodes
  std::vector<int> link_index;             // per group rank: index into nodes
  std::vector<std::vector<int>> ranks_of;  // per node index: its group ranks, ascending
  const std::vector<int>& local() const { return ranks_of[self]; }
};

// INVALID_ARGUMENT when the members do not describe one local node and at
// least one other.
absl::StatusOr<TaskLayout> MakeTaskLayout(const EngineTask& task);

// Checks the task against this node's buffers; touches no memory.
// INVALID_ARGUMENT / UNIMPLEMENTED naming the problem.
absl::Status ValidateCrossNode(const EngineTask& task, const TaskLayout& layout);

// Whether an all-to-all's local members give splits.
bool UnevenAllToAll(const EngineTask& task);
// Elements group rank `rank` (local) sends to `to` / receives from `from` in
// an all-to-all (count when it gives no splits).
uint64_t SendCount(const EngineTask& task, int rank, int to);
uint64_t RecvCount(const EngineTask& task, int rank, int from);
// "splits disagree: rank I sends N elements to rank J, which expects M".
std::string SplitsMismatch(const EngineTask& task, int i, int j, uint64_t sends,
                           uint64_t expects);

// The shape of a task; every node must run the same one. Sent as raw bytes
// between daemons of the same version (magic and version first).
struct TaskHeader {
  uint32_t magic = kHeaderMagic;
  uint32_t version = kHeaderVersion;
  uint8_t collective = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t wire = 0;
  int32_t root = 0;
  uint32_t group_size = 0;
  uint32_t uneven = 0;
  uint64_t count = 0;
  uint64_t seq = 0;
  uint64_t members_hash = 0;  // global rank and node of every member
  uint64_t spec_hash = 0;     // premul_factor, pre_divide, post_divide
  uint64_t chunk_bytes = 0;
  uint64_t small_allreduce_bytes = 0;
};
static_assert(sizeof(TaskHeader) == 72);

TaskHeader MakeTaskHeader(const EngineTask& task, size_t chunk_bytes,
                          size_t small_allreduce_bytes);
// "" when equal, else what differs (theirs vs ours).
std::string CompareTaskHeaders(const TaskHeader& theirs, const TaskHeader& ours);

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_CROSS_NODE_TASK_H_
