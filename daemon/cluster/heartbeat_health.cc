#include "daemon/cluster/heartbeat_health.h"

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"

namespace hsdp {

void HeartbeatHealth::Answered() {
  if (degraded_) {
    HSDP_LOG(Info) << "cluster: " << store_ << " answers again; the cluster is no longer degraded";
  }
  failures_ = 0;
  degraded_ = false;
}

std::optional<std::string> HeartbeatHealth::Missed(const absl::Status& why) {
  ++failures_;
  if (failures_ < missed_ || degraded_) return std::nullopt;
  degraded_ = true;
  std::string detail = absl::StrCat(
      store_, " has not answered ", failures_, " heartbeats (", why.message(),
      "); membership is frozen, node losses are not detected, and new cross-node groups and "
      "attaches fail",
      remedy_);
  HSDP_LOG(Error) << "cluster degraded: " << detail;
  return detail;
}

}  // namespace hsdp
