// A private cluster of hsdpd daemons on loopback, for `hsdp-bench --nodes N`:
// N daemons in one temporary directory, each with its own Unix socket, node
// config and log, on distinct free 127.0.0.1 ports, authenticated by a random
// token file (mode 0600) in that directory; node i has cluster.node_rank i and
// node 0 is the coordinator (docs/cluster.md). Data (Gloo) traffic stays on
// 127.0.0.1 too.
#ifndef HSDP_TOOLS_BENCH_BENCH_CLUSTER_H_
#define HSDP_TOOLS_BENCH_BENCH_CLUSTER_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace hsdp::bench {

class LocalCluster {
 public:
  LocalCluster() = default;
  LocalCluster(const LocalCluster&) = delete;
  LocalCluster& operator=(const LocalCluster&) = delete;
  ~LocalCluster() { Stop(); }

  // Starts `nodes` (>= 2) daemons from `bin_dir` and waits (at most
  // `ready_ms`) until every one accepts clients, i.e. has joined the
  // cluster. `extra_yaml` (a node config without a `cluster:` section, or
  // "") is put at the top of every node's config. On failure returns false
  // with *error naming the node and the tail of its log; what started is
  // stopped.
  bool Start(const std::string& bin_dir, int nodes, const std::string& extra_yaml, int ready_ms,
             std::string* error);
  // SIGTERM to every daemon, SIGKILL to those still there after 10 s; removes
  // the directory. Idempotent.
  void Stop();

  const std::vector<std::string>& sockets() const { return sockets_; }

 private:
  std::string LogTail(int node) const;

  std::string dir_;
  std::vector<pid_t> pids_;
  std::vector<std::string> sockets_;
};

// The node config of node `rank` of a loopback cluster.
std::string LoopbackClusterYaml(const std::string& coordinator, const std::string& listen,
                                int nodes, int rank, const std::string& token_file);


}  // namespace hsdp::bench

#endif  // HSDP_TOOLS_BENCH_BENCH_CLUSTER_H_
