#include "tools/bench/sim_nodes.h"

#include <utility>

#include "absl/time/time.h"

namespace hsdp::sim {
namespace {

class EmbeddedNode : public SimNode {
 public:
  explicit EmbeddedNode(ClusterMember::Options o) : m_(std::move(o), nullptr) {}
  Membership& member() override { return m_; }
  uint64_t rpcs() const override { return m_.rpcs(); }

 private:
  ClusterMember m_;
};

class EtcdNode : public SimNode {
 public:
  EtcdNode(std::unique_ptr<etcd::EtcdClient> client, EtcdMember::Options o)
      : client_(std::move(client)), store_(client_.get(), kEtcdPrefix),
        m_(client_.get(), &store_, std::move(o), nullptr) {}
  Membership& member() override { return m_; }
  uint64_t rpcs() const override { return m_.rpcs(); }
  bool sweeping() const override { return m_.sweeping(); }

 private:
  std::unique_ptr<etcd::EtcdClient> client_;
  EtcdStore store_;
  EtcdMember m_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<SimNode>> MakeNode(const NodeStore& store, const std::string& name,
                                                  const std::string& address, const Flags& flags) {
  // What both stores' members take alike (their Options share these names).
  auto common = [&](auto& o) {
    o.address = address;
    o.data_address = "127.0.0.1";
    o.name = name;
    o.nodes = store.cluster_nodes;
    o.join_timeout = absl::Seconds(flags.phase_timeout_s);
    o.heartbeat = absl::Milliseconds(flags.heartbeat_ms);
    o.missed_heartbeats = flags.missed_heartbeats;
  };
  if (store.embedded) {
    ClusterMember::Options o;
    common(o);
    o.coordinator = store.coordinator;
    return std::make_unique<EmbeddedNode>(std::move(o));
  }
  etcd::EtcdOptions eo;
  eo.endpoints = store.etcd_endpoints;
  eo.keepalives_on_leader = flags.etcd_keepalives_on_leader;
  absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client =
      etcd::EtcdClient::Connect(eo, absl::Seconds(5));
  if (!client.ok()) return client.status();
  EtcdMember::Options o;
  common(o);
  o.prefix = kEtcdPrefix;
  o.revoke_on_stop = false;
  return std::make_unique<EtcdNode>(std::move(*client), std::move(o));
}

}  // namespace hsdp::sim
