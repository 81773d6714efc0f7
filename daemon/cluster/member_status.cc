#include "daemon/cluster/member_status.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_format.h"
#include "hsdp/common/logging.h"

namespace hsdp {

std::string NewInstanceId() {
  std::random_device rd;
  return absl::StrFormat("%08x%08x", rd(), rd());
}

bool PermanentJoinError(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kInvalidArgument:
      return true;
    default:
      return false;
  }
}

void FirePeerEvents(const std::vector<PeerEvent>& events, const PeerEvents& sink) {
  for (const PeerEvent& e : events) {
    if (e.kind == PeerEvent::Kind::kLost) {
      HSDP_LOG(Warning) << "cluster: " << e.why;
    } else {
      HSDP_LOG(Info) << "cluster: " << e.why;
    }
    if (sink) sink(e);
  }
}

void MemberStatus::Contact(absl::Time now) {
  state_ = "ok";
  detail_.clear();
  last_contact_ = now;
}

void MemberStatus::Failed(const absl::Status& why) {
  state_ = "failed";
  detail_ = std::string(why.message());
}

void MemberStatus::Degraded(std::string detail) {
  state_ = "degraded";
  detail_ = std::move(detail);
}

void MemberStatus::Stopped() {
  if (state_ != "failed") state_ = "stopped";
}

double MemberStatus::FillView(v1::NodesResponse* r, absl::Time now) const {
  r->set_state(state_);
  r->set_detail(detail_);
  const bool never = last_contact_ == absl::InfinitePast();
  const double since = never ? 0 : absl::ToDoubleSeconds(now - last_contact_);
  r->set_coordinator_contact_age_s(never ? -1 : since);
  return since;
}

void GroupEventOutbox::Push(v1::GroupEvent event) {
  if (events_.size() >= max_) {
    HSDP_LOG_EVERY_N_SEC(Warning, 5) << "cluster: dropping a group event for \""
                                     << events_.front().group_key() << "\": " << sink_
                                     << " has not taken " << max_ << " queued events";
    events_.pop_front();
  }
  events_.push_back(std::move(event));
}

std::vector<v1::GroupEvent> GroupEventOutbox::Front(size_t n) const {
  const size_t k = std::min(n, events_.size());
  return std::vector<v1::GroupEvent>(events_.begin(), events_.begin() + k);
}

void GroupEventOutbox::Pop(size_t n) {
  events_.erase(events_.begin(), events_.begin() + std::min(n, events_.size()));
}

}  // namespace hsdp
