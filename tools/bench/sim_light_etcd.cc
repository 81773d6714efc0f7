#include "tools/bench/sim_light_etcd.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace hsdp::sim {

EtcdFleet::EtcdFleet(EtcdOptions etcd, Options options)
    : LightFleet(std::move(options)), etcd_(std::move(etcd)),
      leases_(new int64_t[this->options().count]()) {}

absl::StatusOr<std::unique_ptr<EtcdFleet>> EtcdFleet::Make(EtcdOptions etcd, Options options) {
  std::unique_ptr<EtcdFleet> fleet(new EtcdFleet(std::move(etcd), std::move(options)));
  for (int c = 0; c < std::max(1, fleet->options().channels); ++c) {
    etcd::EtcdOptions eo;
    eo.endpoints = fleet->etcd_.endpoints;
    eo.keepalives_on_leader = fleet->etcd_.keepalives_on_leader;
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> client =
        etcd::EtcdClient::Connect(eo, absl::Seconds(5));
    if (!client.ok()) return client.status();
    fleet->clients_.push_back(std::move(*client));
  }
  return fleet;
}

uint64_t EtcdFleet::keepalive_streams() const {
  uint64_t n = 0;
  for (const auto& c : clients_) n += c->keepalive_streams_opened();
  return n;
}

std::string EtcdFleet::JoinStats() const {
  const uint64_t claims = claims_.load(), keys = keys_read_.load();
  return absl::StrCat(claims, " claims, ", races_lost_.load(), " lost a race for their rank, ",
                      claims == 0 ? 0 : keys / claims, " rank keys read per claim");
}

absl::Status EtcdFleet::JoinOnce(int i, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  Member& m = member(i);
  std::atomic<uint64_t> calls{0};  // EtcdJoin's, added to the fleet's count
  etcd::EtcdJoin join(&ClientOf(i),
                      {.prefix = etcd_.prefix, .address = address(i),
                       .nodes = options().cluster_nodes, .node_rank = -1},
                      &calls);
  auto count = [&] { CountCall(calls.load()); };
  absl::Status checked = join.CheckNodes(deadline);
  if (!checked.ok()) {
    count();
    return checked;
  }
  if (leases_[i] == 0) {
    CountCall();
    absl::StatusOr<int64_t> granted = ClientOf(i).LeaseGrant(
        options().heartbeat * static_cast<int64_t>(etcd_.missed_heartbeats),
        std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!granted.ok()) {
      count();
      return granted.status();
    }
    leases_[i] = *granted;
  }
  v1::ClusterNode me;
  me.set_data_address("127.0.0.1");
  me.set_name(absl::StrCat("light", i));
  me.set_instance(m.instance);
  absl::StatusOr<etcd::EtcdJoin::Claimed> claimed = join.Claim(me, leases_[i], deadline);
  count();
  claims_.fetch_add(1, std::memory_order_relaxed);
  races_lost_.fetch_add(join.races_lost(), std::memory_order_relaxed);
  keys_read_.fetch_add(join.keys_read(), std::memory_order_relaxed);
  if (!claimed.ok()) {
    if (claimed.status().code() == absl::StatusCode::kNotFound) leases_[i] = 0;
    return claimed.status();
  }
  m.rank = claimed->rank;
  return absl::OkStatus();
}

bool EtcdFleet::BeatOnce(int i, absl::Duration timeout) {
  CountCall();
  absl::StatusOr<absl::Duration> ttl = ClientOf(i).LeaseKeepAlive(leases_[i], timeout);
  if (ttl.ok()) return true;
  if (ttl.status().code() == absl::StatusCode::kNotFound) {
    // The lease ran out: its keys went with it; join again with a new one.
    CountRejoin();
    leases_[i] = 0;
    (void)JoinOnce(i, timeout);
  }
  return false;
}

}  // namespace hsdp::sim
