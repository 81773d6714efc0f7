// Internal to the cross-node collectives (cross_node_ops.h): the Runner
// that runs one task on this node, whose methods live in cross_node_ops.cc
// (dispatch, the local stage, the network and the header round) and one
// cross_node_<collective>.cc per algorithm; and the chunking arithmetic the
// algorithms share.
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_CROSS_NODE_INTERNAL_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_CROSS_NODE_INTERNAL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "daemon/engine/crossnode/cross_node_ops.h"
#include "daemon/engine/crossnode/cross_node_task.h"
#include "daemon/engine/crossnode/node_transport.h"
#include "daemon/engine/engine.h"

namespace hsdp::cross_node_internal {

// The smallest chunk worth a network round (elements of a step).
constexpr uint64_t kMinChunkElements = 1024;

struct Range {
  uint64_t begin = 0;
  uint64_t len = 0;
};

// Part p of P of `len` elements (balanced; the same on every node).
inline Range Split(uint64_t len, int parts, int p) {
  const uint64_t b = len * p / parts;
  const uint64_t e = len * (p + 1) / parts;
  return {b, e - b};
}

inline uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Elements per pipeline step when one step moves `bytes_per_element` bytes
// per element (the whole message when chunking is off).
inline uint64_t StepElements(uint64_t count, size_t chunk_bytes, uint64_t bytes_per_element) {
  if (chunk_bytes == 0 || count == 0) return std::max<uint64_t>(count, 1);
  const uint64_t k = std::max<uint64_t>(kMinChunkElements, chunk_bytes / bytes_per_element);
  return std::min(k, count);
}

// One task on this node: its algorithm, with the local stage and the
// network helpers the algorithms share. Lives for one RunCrossNode call.
class Runner {
 public:
  Runner(const EngineTask& t, const TaskLayout& lay, const CrossNodeRun& run);

  absl::Status Run();

 private:
  // --- local stage, split across the worker's pool when it has one ----------

  // fn(begin, len) over [0, n) elements.
  void Parallel(uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn);
  // The local members' inputs `ins` (in dtype) into `partial` (compute type).
  void ReducePartial(const std::vector<const void*>& ins, char* partial, uint64_t n);
  // The nodes' partials, in node order, into every output.
  void FinishPartials(const std::vector<const void*>& parts, const std::vector<void*>& outs,
                      uint64_t n);
  void Copy(char* dst, const char* src, uint64_t bytes);

  static absl::Status OutOfMemory() {
    return absl::ResourceExhaustedError("out of memory staging a cross-node operation");
  }
  absl::Status Bad(const std::string& what) const { return absl::InvalidArgumentError(what); }
  uint64_t SendCount(int li, int j) const { return hsdp::SendCount(t_, lay_.local()[li], j); }
  uint64_t RecvCount(int li, int i) const { return hsdp::RecvCount(t_, lay_.local()[li], i); }
  std::string SplitsMismatch(int i, int j, uint64_t sends, uint64_t expects) const {
    return hsdp::SplitsMismatch(t_, i, j, sends, expects);
  }

  // --- network --------------------------------------------------------------

  absl::Status Exchange(std::vector<SendRange>& sends, std::vector<RecvRange>& recvs);
  // Exchange, with `fn` (about `work_bytes` of memory traffic) overlapping
  // it on the sidecar; small work runs inline first (a thread handoff would
  // cost more).
  absl::Status ExchangeWhile(std::vector<SendRange>& sends, std::vector<RecvRange>& recvs,
                             uint64_t work_bytes, const std::function<void()>& fn);
  absl::Status HeaderRound(uint64_t work_bytes, const std::function<void()>& work);

  // --- the algorithms, one file each ------------------------------------------

  absl::Status AllReduceDirect();  // cross_node_all_reduce.cc
  absl::Status AllReduce();        // cross_node_all_reduce.cc
  absl::Status ReduceScatter();    // cross_node_reduce_scatter.cc
  absl::Status AllGather();        // cross_node_all_gather.cc
  absl::Status Broadcast();        // cross_node_broadcast.cc
  absl::Status AllToAll();         // cross_node_all_to_all.cc
  absl::Status SplitsRound();      // cross_node_all_to_all.cc

  const EngineTask& t_;
  const TaskLayout& lay_;
  const CrossNodeRun& run_;
  const size_t es_;
  const int P_;
  const int s_;
  const int G_;
  const bool uneven_;
  std::vector<const char*> in_;
  std::vector<char*> out_;
};

}  // namespace hsdp::cross_node_internal

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_CROSS_NODE_INTERNAL_H_
