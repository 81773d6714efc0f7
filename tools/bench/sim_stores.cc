#include "tools/bench/sim_stores.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster_client.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace hsdp::sim {

absl::Status CoordinatorProcess::Start(int nodes, const Flags& flags) {
  if (dir_.path().empty()) return absl::InternalError("mkdtemp failed");
  port_ = FreePort();
  address_ = absl::StrCat("127.0.0.1:", port_);
  const std::string config = dir_.File("node.yaml");
  {
    std::ofstream f(config);
    f << "node:\n"
      << "  name: \"sim-coordinator\"\n"
      << "  socket: \"" << dir_.File("hsdpd.sock") << "\"\n"
      << "engine:\n  threads: 1\n"
      << "log:\n  level: \"warning\"\n"
      << "cluster:\n"
      << "  coordinator: \"" << address_ << "\"\n"
      << "  listen: \"" << address_ << "\"\n"
      << "  nodes: " << nodes << "\n"
      << "  node_rank: 0\n"
      << "  insecure: true\n"
      << "  store: \"embedded\"\n"
      << "  join_timeout_ms: " << flags.phase_timeout_s * 1000 << "\n"
      << "  heartbeat_ms: " << flags.heartbeat_ms << "\n"
      << "  missed_heartbeats: " << flags.missed_heartbeats << "\n";
  }
  pid_ = Spawn({flags.hsdpd, "--node-config", config}, dir_.File("hsdpd.log"));
  if (pid_ < 0) return absl::InternalError("fork failed");
  // Until the Cluster service answers (NOT_FOUND for a key is an answer).
  ClusterClient probe(address_, "");
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (;;) {
    if (Exited(pid_)) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("hsdpd exited:\n", Tail(Logs(), 3000)));
    }
    absl::StatusOr<std::string> r = probe.Get("membership-sim-probe", absl::Milliseconds(500));
    if (r.ok() || (r.status().code() != absl::StatusCode::kUnavailable &&
                   r.status().code() != absl::StatusCode::kDeadlineExceeded)) {
      return absl::OkStatus();
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("hsdpd does not answer: ", r.status().message(), "\n", Tail(Logs(), 3000)));
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

absl::Status EtcdCluster::Start(int, const Flags& flags) {
  if (dir_.path().empty()) return absl::InternalError("mkdtemp failed");
  constexpr int kMembers = 3;
  for (int i = 0; i < kMembers; ++i) {
    client_ports_.push_back(FreePort());
    peer_ports_.push_back(FreePort());
  }
  std::vector<std::string> initial;
  for (int i = 0; i < kMembers; ++i) {
    initial.push_back(absl::StrCat("m", i, "=http://127.0.0.1:", peer_ports_[i]));
  }
  for (int i = 0; i < kMembers; ++i) {
    const std::string client = absl::StrCat("http://127.0.0.1:", client_ports_[i]);
    const std::string peer = absl::StrCat("http://127.0.0.1:", peer_ports_[i]);
    // etcd's default raft timings (heartbeat 100 ms, election 1 s).
    const pid_t pid = Spawn(
        {flags.etcd, "--name", absl::StrCat("m", i), "--data-dir",
         dir_.File(absl::StrCat("m", i, ".etcd")), "--listen-client-urls", client,
         "--advertise-client-urls", client, "--listen-peer-urls", peer,
         "--initial-advertise-peer-urls", peer, "--initial-cluster",
         absl::StrJoin(initial, ","), "--initial-cluster-state", "new",
         "--initial-cluster-token", "hsdp-membership-sim", "--logger", "zap",
         "--log-outputs", "stderr", "--log-level", "warn"},
        dir_.File(absl::StrCat("m", i, ".log")));
    if (pid < 0) return absl::InternalError("fork failed");
    pids_.push_back(pid);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  for (int i = 0; i < kMembers; ++i) {
    etcd::EtcdOptions o;
    o.endpoints = {endpoint(i)};
    absl::Status last;
    for (;;) {
      if (Exited(pids_[i])) {
        return absl::UnavailableError(absl::StrCat("etcd member ", i, " exited:\n", Logs()));
      }
      auto c = etcd::EtcdClient::Connect(o, absl::Seconds(1));
      if (c.ok()) {
        last = (*c)->Range("health", "", absl::Seconds(1)).status();
        if (last.ok()) break;
      } else {
        last = c.status();
      }
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("etcd member ", i, " not healthy: ", last.message(), "\n", Logs()));
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  return absl::OkStatus();
}

int EtcdCluster::Leader(absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    uint64_t leader = 0;
    bool agreed = true;
    std::vector<uint64_t> ids(pids_.size(), 0);
    for (size_t i = 0; i < pids_.size() && agreed; ++i) {
      if (pids_[i] <= 0 || Exited(pids_[i])) continue;  // killed, or gone
      auto stub = etcdserverpb::Maintenance::NewStub(
          grpc::CreateChannel(endpoint(static_cast<int>(i)), grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      etcdserverpb::StatusResponse resp;
      if (!stub->Status(&ctx, etcdserverpb::StatusRequest(), &resp).ok() || resp.leader() == 0 ||
          (leader != 0 && resp.leader() != leader)) {
        agreed = false;
        break;
      }
      leader = resp.leader();
      ids[i] = resp.header().member_id();
    }
    for (size_t i = 0; agreed && leader != 0 && i < ids.size(); ++i) {
      if (ids[i] == leader) return static_cast<int>(i);
    }
    if (absl::Now() >= deadline) return -1;
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void EtcdCluster::Kill(int i) {
  KillChild(pids_[i]);
  pids_[i] = -1;  // reaped: never signalled again
}

std::string EtcdCluster::Logs() const {
  std::string out;
  for (size_t i = 0; i < pids_.size(); ++i) {
    absl::StrAppend(&out, "--- etcd m", i, " ---\n",
                    Tail(ReadFile(dir_.File(absl::StrCat("m", i, ".log"))), 2000), "\n");
  }
  return out;
}

}  // namespace hsdp::sim
