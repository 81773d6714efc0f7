// What both memberships (ClusterMember through the coordinator, EtcdMember
// in etcd) keep the same way, one definition each:
//   MemberStatus      this node's state for `hsdpctl nodes` ("joining", "ok",
//                     "degraded", "failed", "stopped"), why, and when the
//                     store last answered;
//   GroupEventOutbox  group events waiting to go to the other nodes:
//                     bounded, the oldest dropped with a log line, sent in
//                     batches, held back after a failed send until the next
//                     heartbeat;
//   NewInstanceId, PermanentJoinError, FirePeerEvents.
// Not thread-safe: each member guards them with its own mutex.
#ifndef HSDP_DAEMON_CLUSTER_MEMBER_STATUS_H_
#define HSDP_DAEMON_CLUSTER_MEMBER_STATUS_H_

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "daemon/cluster/membership.h"
#include "hsdp/v1/admin.pb.h"
#include "hsdp/v1/cluster.pb.h"

namespace hsdp {

// A random id per daemon start (what the other nodes' views show).
std::string NewInstanceId();

// Join errors that retrying cannot fix (credentials, a rank conflict, a full
// cluster, a bad request): the join ends at once.
bool PermanentJoinError(const absl::Status& s);

// Logs each event (a loss as a warning) and hands it to `sink` (may be null).
void FirePeerEvents(const std::vector<PeerEvent>& events, const PeerEvents& sink);

class MemberStatus {
 public:
  const std::string& state() const { return state_; }
  const std::string& detail() const { return detail_; }

  // The store answered at `now`: "ok".
  void Contact(absl::Time now);
  // The join failed for good, or the store stopped answering.
  void Failed(const absl::Status& why);
  void Degraded(std::string detail);
  // Stop: "stopped", unless it had failed (the reason stays visible).
  void Stopped();

  // Sets state, detail and the contact age of `r` (-1: never); returns the
  // seconds since the last contact (0: never), which the members add to
  // their nodes' ages so that they keep growing while the store is silent.
  double FillView(v1::NodesResponse* r, absl::Time now) const;

 private:
  std::string state_ = "joining";
  std::string detail_;
  absl::Time last_contact_ = absl::InfinitePast();
};

class GroupEventOutbox {
 public:
  // `sink` names where the events go, for the log line when one is dropped.
  GroupEventOutbox(size_t max_events, std::string sink)
      : max_(max_events), sink_(std::move(sink)) {}

  // Queues `event`; beyond max_events the oldest is dropped (logged).
  void Push(v1::GroupEvent event);
  // Up to `n` of the oldest events, still queued.
  std::vector<v1::GroupEvent> Front(size_t n) const;
  // Removes the `n` oldest (those Front gave and the store took).
  void Pop(size_t n);
  bool empty() const { return events_.empty(); }
  size_t size() const { return events_.size(); }
  // Held back after a failed send: the heartbeat, not every new event,
  // triggers the next try.
  void set_held_back(bool held) { held_back_ = held; }
  // Something to send now.
  bool ready() const { return !held_back_ && !events_.empty(); }

 private:
  const size_t max_;
  const std::string sink_;
  std::deque<v1::GroupEvent> events_;
  bool held_back_ = false;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_MEMBER_STATUS_H_
