// Test helpers for the cross-node engine: rank placements over simulated
// nodes, buffers with guard bytes, building one node's part of a task (or
// the flat all-local task), running a task on every node's engine and
// comparing every rank's output with the flat CpuEngine result.
#ifndef HSDP_TESTS_UNIT_ENGINE_CLUSTER_CROSSNODE_TEST_UTIL_H_
#define HSDP_TESTS_UNIT_ENGINE_CLUSTER_CROSSNODE_TEST_UTIL_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/engine/crossnode/node_transport.h"
#include "daemon/engine/engine.h"

namespace hsdp::testing {

// Where every group rank lives.
struct Placement {
  int nodes = 0;
  std::vector<int> node_of;  // per group rank
  int size() const { return static_cast<int>(node_of.size()); }
};
Placement Contiguous(int nodes, int per_node);  // ranks of a node adjacent
Placement RoundRobin(int nodes, int per_node);  // node of rank = rank % nodes

struct Case {
  Collective collective = Collective::kAllReduce;
  ReduceSpec spec;
  uint64_t count = 0;
  int root = 0;
  bool uneven = false;    // all-to-all with splits
  bool in_place = false;  // all-reduce / broadcast: recv == send
  std::string Describe() const;
};

// Elements rank i sends rank j in the uneven all-to-all of a group of n.
uint64_t SplitCount(int i, int j, int n);

// Every rank's buffers, with guard bytes after each that must stay intact.
class RankBuffers {
 public:
  RankBuffers(const Case& c, int group_size, uint32_t fill_seed);
  void* send(int r) { return send_[r].data(); }
  void* recv(int r) { return in_place(r) ? send_[r].data() : recv_[r].data(); }
  uint64_t send_bytes(int r) const { return send_bytes_[r]; }
  uint64_t recv_bytes(int r) const { return recv_bytes_[r]; }
  // Copies with the original inputs, for a reference run.
  RankBuffers CloneInputs() const;
  bool GuardsIntact() const;

 private:
  bool in_place(int r) const;
  Case case_;
  std::vector<std::vector<char>> send_, recv_;
  std::vector<uint64_t> send_bytes_, recv_bytes_;
};

// The part of `c` node `node` runs (node < 0: the flat task, all local).
EngineTask BuildTask(const Case& c, const Placement& p, int node, RankBuffers* bufs,
                     const std::string& key, uint32_t epoch, uint64_t seq);

// Collects the completions of tasks launched on several engines.
class Completions {
 public:
  explicit Completions(int n);
  EngineCallbacks Callbacks(int i);
  // False when not all completed within `timeout`.
  bool Wait(absl::Duration timeout);
  absl::Status status(int i);
  bool launched_before_completed(int i);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
  std::vector<absl::Status> status_;
  std::vector<int> launched_, completed_;
  std::vector<bool> order_ok_;
};

// What one node's transport has been asked to do, counted as each call
// begins: a test waits on these ("node 0 is connecting", "node 0 waits in
// the network stage") instead of sleeping.
struct TransportProbe {
  std::atomic<int> connects{0};   // TransportFactory::Connect calls entered
  std::atomic<int> exchanges{0};  // NodeLink::Exchange calls entered
};

// `inner` with every Connect and every Exchange of its links counted in
// `probe`; otherwise the same transport.
std::unique_ptr<TransportFactory> Probed(std::unique_ptr<TransportFactory> inner,
                                         std::shared_ptr<TransportProbe> probe);

// Runs `c` on engines[n] for every node n (placement p) and compares with
// the flat run; "" when every output matches, else what differs.
std::string RunAndCompare(const std::vector<Engine*>& engines, const Case& c, const Placement& p,
                          const std::string& key, uint32_t epoch, uint64_t seq);

// Compares the outputs of two runs (floats: exact for min/max and data
// movement, relative tolerance of the dtype for arithmetic).
std::string CompareOutputs(const Case& c, const Placement& p, RankBuffers& got,
                           RankBuffers& want);

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_UNIT_ENGINE_CLUSTER_CROSSNODE_TEST_UTIL_H_
