// The stores hsdp-membership-sim runs its nodes against: the project's hsdpd
// as the coordinator (cluster.store embedded) or a 3-member etcd cluster on
// 127.0.0.1 (etcd), each a set of child processes (sim_process.h), and the
// simulator's flags.
#ifndef HSDP_TOOLS_BENCH_SIM_STORES_H_
#define HSDP_TOOLS_BENCH_SIM_STORES_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "tools/bench/sim_process.h"

namespace hsdp::sim {

// The simulator's flags (membership_sim.cc parses them).
struct Flags {
  std::vector<int> nodes = {64, 256, 1024};
  std::vector<std::string> stores = {"embedded", "etcd"};
  int window_s = 10;
  int heartbeat_ms = 1000;
  int missed_heartbeats = 5;
  int phase_timeout_s = 120;
  std::string hsdpd;
  std::string etcd = HSDP_SIM_ETCD_BIN;
  std::string etcd_data;  // "" = /tmp
  std::string log_level = "error";
  bool light = false;    // --members=light (sim_light.h)
  int sim_threads = 64;  // light members' worker threads (their calls block)
  int channels = 4;      // light members' ClusterClients
  // --etcd-keepalive=leader|any: the etcd clients' keep-alive streams on the
  // raft leader (EtcdOptions::keepalives_on_leader), or where calls go.
  bool etcd_keepalives_on_leader = true;
  // --etcd-member-loss: etcd light cases lose the raft leader after the
  // steady window and see the crash with two members left.
  bool etcd_member_loss = false;
};

// A store the simulated nodes join: child processes started by Start.
class Store {
 public:
  virtual ~Store() = default;
  virtual absl::Status Start(int nodes, const Flags& flags) = 0;
  virtual std::vector<pid_t> pids() const = 0;
  virtual std::string Logs() const = 0;
};

// hsdpd as the coordinator (cluster.store embedded), on a free loopback port.
class CoordinatorProcess : public Store {
 public:
  ~CoordinatorProcess() override { KillChild(pid_); }
  absl::Status Start(int nodes, const Flags& flags) override;
  std::vector<pid_t> pids() const override { return {pid_}; }
  std::string Logs() const override { return ReadFile(dir_.File("hsdpd.log")); }
  const std::string& address() const { return address_; }

 private:
  TempDir dir_;
  int port_ = 0;
  std::string address_;
  pid_t pid_ = -1;
};

// A 3-member etcd cluster on loopback, its data under `data` (default /tmp).
class EtcdCluster : public Store {
 public:
  explicit EtcdCluster(const std::string& data) : dir_(data.empty() ? "/tmp" : data) {}
  ~EtcdCluster() override {
    for (pid_t p : pids_) KillChild(p);
  }
  absl::Status Start(int, const Flags& flags) override;
  std::vector<pid_t> pids() const override { return pids_; }
  std::string Logs() const override;
  std::string endpoint(int i) const { return "127.0.0.1:" + std::to_string(client_ports_[i]); }
  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < client_ports_.size(); ++i) out.push_back(endpoint(i));
    return out;
  }
  const std::vector<int>& client_ports() const { return client_ports_; }
  // The member every live member names as the raft leader, polled until
  // `timeout`; -1 when they do not agree by then.
  int Leader(absl::Duration timeout) const;
  // SIGKILLs member i (a lost machine); it stays down.
  void Kill(int i);

 private:
  TempDir dir_;
  std::vector<int> client_ports_, peer_ports_;
  std::vector<pid_t> pids_;
};

}  // namespace hsdp::sim

#endif  // HSDP_TOOLS_BENCH_SIM_STORES_H_
