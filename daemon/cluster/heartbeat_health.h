// Whether a member's store answers its heartbeats, the same way for both
// memberships: after missed_heartbeats failures in a row the cluster is
// "degraded" (logged once, as an error, with what it means and what to do);
// the first answer after that ends it (logged). The member shows the result
// in its MemberStatus.
//
// Not thread-safe: owned by the member's heartbeat thread.
#ifndef HSDP_DAEMON_CLUSTER_HEARTBEAT_HEALTH_H_
#define HSDP_DAEMON_CLUSTER_HEARTBEAT_HEALTH_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace hsdp {

class HeartbeatHealth {
 public:
  // `store` names it in messages ("the coordinator HOST:PORT", "etcd (...)");
  // `remedy` ends the degraded message (" until ..." or "; restart ...").
  HeartbeatHealth(std::string store, uint32_t missed_heartbeats, std::string remedy)
      : store_(std::move(store)), missed_(missed_heartbeats), remedy_(std::move(remedy)) {}

  // The store answered.
  void Answered();
  // A heartbeat failed with `why`. Returns the detail for
  // MemberStatus::Degraded when this failure made the cluster degraded,
  // nullopt otherwise (still healthy, or already degraded).
  std::optional<std::string> Missed(const absl::Status& why);

  bool degraded() const { return degraded_; }
  uint32_t failures() const { return failures_; }

 private:
  const std::string store_;
  const uint32_t missed_;
  const std::string remedy_;
  uint32_t failures_ = 0;
  bool degraded_ = false;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_HEARTBEAT_HEALTH_H_
