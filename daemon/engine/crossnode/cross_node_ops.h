// The collectives of the cross-node engine: one task whose group spans
// nodes, run by this node over a connected NodeLink. Every participating
// daemon runs the same task (same group, epoch and seq) with its own local
// members; together they produce exactly the flat, rank-ordered result.
//
//   all-reduce      local partial (this node's inputs, in the compute type)
//                   -> reduce-scatter of the partials among the P nodes
//                   (node i owns 1/P of every chunk) -> final rounding and
//                   post-division by the owner -> all-gather of the results
//                   in dtype; chunked so that the next chunk's local stage
//                   overlaps the network.
//                   Small ones (small_allreduce_bytes of partials per node,
//                   or up to one chunk between two nodes, where it moves the
//                   same bytes) send every node's whole partial to every node
//                   instead (one round); each node reduces them in the same
//                   node order.
//   reduce-scatter  local partial of every rank's block; node j receives only
//                   the blocks of the ranks it hosts.
//   all-gather      each node sends its members' blocks to every other node.
//   broadcast       the root's node sends to every other node (send/recv is a
//                   two-member broadcast).
//   all-to-all      node A sends node B exactly the blocks from A's ranks to
//                   B's ranks; uneven splits are compared between the two
//                   nodes first and a disagreement fails the task.
//   barrier         the task header exchange below.
//
// Every task starts with a fixed-size header exchanged with every peer (the
// shape: collective, dtype, count, reduce spec, root, members and nodes,
// chunking; cross_node_task.h); a peer running a different shape fails the
// task on both sides before any sized message moves. Every length is checked
// against the local buffers before memory is touched.
//
// Thread-safety: RunCrossNode is reentrant; one call per link at a time.
//
// Files: cross_node_ops.cc holds RunCrossNode, the header round and the
// local-stage and network helpers every algorithm uses; each algorithm has
// its own file: cross_node_all_reduce.cc, cross_node_reduce_scatter.cc,
// cross_node_all_gather.cc, cross_node_broadcast.cc (send/recv included) and
// cross_node_all_to_all.cc. What they share is declared in
// cross_node_internal.h.
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_CROSS_NODE_OPS_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_CROSS_NODE_OPS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/engine/crossnode/cross_node_task.h"
#include "daemon/engine/crossnode/node_transport.h"
#include "daemon/engine/crossnode/sidecar.h"
#include "daemon/engine/engine.h"

namespace hsdp {

namespace cpu {
class ThreadPool;
}

struct CrossNodeRun {
  NodeLink* link = nullptr;
  uint64_t* next_tag = nullptr;  // the link's exchange counter (same on every node)
  absl::Time deadline;
  size_t chunk_bytes = 0;            // must be the same on every node (checked)
  size_t small_allreduce_bytes = 0;  // likewise; see HierarchicalEngineOptions
  Sidecar* sidecar = nullptr;
  Scratch* scratch = nullptr;
  // Splits the local stage (reductions, copies) when set; used by one
  // thread at a time (the sidecar, or the worker after waiting for it).
  cpu::ThreadPool* pool = nullptr;
};

// Runs `task` (validated here) on `layout` over run.link.
absl::Status RunCrossNode(const EngineTask& task, const TaskLayout& layout,
                          const CrossNodeRun& run);

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_CROSS_NODE_OPS_H_
