// RetiredGroups: engine keys kept until their time, in retirement order.
#include "daemon/jobs/retired_groups.h"

namespace hsdp {

RetiredGroups::RetiredGroups(int64_t linger_ns, const Clock* clock, size_t capacity)
    : linger_ns_(linger_ns), clock_(clock != nullptr ? clock : Clock::Real()), capacity_(capacity) {}

bool RetiredGroups::Retire(std::string engine_key) {
  if (keys_.size() >= capacity_) return false;
  keys_.emplace_back(std::move(engine_key), clock_->NowNanos() + linger_ns_);
  return true;
}

std::vector<std::string> RetiredGroups::TakeDue() {
  std::vector<std::string> due;
  const int64_t now = clock_->NowNanos();
  while (!keys_.empty() && keys_.front().second <= now) {
    due.push_back(std::move(keys_.front().first));
    keys_.pop_front();
  }
  return due;
}

}  // namespace hsdp
