// The engine of a daemon in a cluster: tasks whose members are all on this
// node, and tasks on device memory (the NCCL engine's communicators span the
// daemons), go to the local engine unchanged; host tasks with remote members
// run hierarchically — a local stage over the mapped buffers of this node's
// members, an exchange between the participating daemons over a NodeLink
// (one per group and epoch, connected lazily at the group's first
// cross-node task, cached, replaced in a new epoch), then the local
// copy-out. Reduce-scatter and all-gather move only each node's share
// across the network; results have exactly the layout (and, for the same
// reduce dtype, the accumulation type) of the flat rank-ordered collective.
//
// Ordering: tasks of one group run one after the other in launch order on
// the engine's worker threads; `launched` is reported when a task is queued
// behind its group's previous task. Every daemon must run the tasks of a
// link in the same order (the group's sequence numbers; for point-to-point,
// the matching order), since messages are matched by a per-link counter.
// depends_on is honoured for tickets of both kinds (a composite's phase 2
// may depend on a phase 1 run by the local engine or by this one): the task
// starts only once they finished, and fails when one of them failed.
// Abort() and a task's deadline break the link of its group (the epoch is
// over anyway): peers waiting on this node fail at once.
//
// Links: DestroyGroup(key), and CreateGroup of a newer epoch, also drop the
// links of keys under "<key>/" (the group's point-to-point keys).
//
// Threads: workers are started on demand, one per group with runnable work
// (up to max(threads, 64); they stay until Shutdown), so a group never waits for
// a worker busy with another group; each worker has one helper thread for
// the local stage. Connects run on their own short-lived thread so that
// Abort and Shutdown never wait for them. Shutdown completes everything
// with UNAVAILABLE. All methods are thread-safe; callbacks run without
// locks held.
//
// Files: hierarchical_engine.cc holds launching, each group's queue and its
// scheduling on the workers, Abort and Shutdown; hierarchical_links.cc the
// links (connecting, caching, dropping them) and running one task over its
// link; hierarchical_dependencies.cc depends_on and the forwarding of
// all-local tasks to the local engine; the class they share is declared in
// hierarchical_engine_state.h.
#ifndef HSDP_DAEMON_ENGINE_CROSSNODE_HIERARCHICAL_ENGINE_H_
#define HSDP_DAEMON_ENGINE_CROSSNODE_HIERARCHICAL_ENGINE_H_

#include <memory>

#include "absl/time/time.h"
#include "daemon/engine/crossnode/node_transport.h"
#include "daemon/engine/engine.h"

namespace hsdp {

struct HierarchicalEngineOptions {
  // Worker threads for cross-node tasks (groups run in parallel); more start
  // on demand, up to max(threads, 64), so that every group with runnable work
  // has one.
  int threads = 2;
  // Longest a cross-node task (connecting included) may take before it fails
  // with DEADLINE_EXCEEDED (timeouts.collective_ms).
  absl::Duration timeout = absl::Seconds(60);
  // Bytes per pipelined chunk of the network stage (0: no chunking). Must be
  // the same on every daemon (checked per task).
  size_t chunk_bytes = 4 << 20;
  // All-reduces whose partials total at most this many bytes per node on the
  // wire send whole partials to every node (one round) instead of
  // reduce-scatter + all-gather (two rounds of half the bytes). Must be the
  // same on every daemon (checked per task).
  size_t small_allreduce_bytes = 128 << 10;
  // Threads that share the local stage of one running cross-node task (its
  // reductions and copies; the worker's helper thread counts). 1: the helper
  // alone. Each worker owns its own.
  int local_threads = 1;
};

// `local` runs all-local tasks and is owned; `transport` makes the links.
std::unique_ptr<Engine> MakeHierarchicalEngine(std::unique_ptr<Engine> local,
                                               std::unique_ptr<TransportFactory> transport,
                                               HierarchicalEngineOptions options);

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_CROSSNODE_HIERARCHICAL_ENGINE_H_
