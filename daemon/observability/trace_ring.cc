#include "daemon/observability/trace_ring.h"

#include <algorithm>

namespace hsdp {

TraceRing::TraceRing(size_t capacity) : capacity_(capacity) {}

bool TraceRing::Arm(int64_t now_ns, int64_t duration_ns) {
  if (capacity_ == 0 || duration_ns <= 0) return false;
  {
    absl::MutexLock l(&mu_);
    if (ring_.empty()) ring_.resize(capacity_);
  }
  const int64_t until = now_ns + duration_ns;
  int64_t cur = armed_until_ns_.load(std::memory_order_relaxed);
  while (cur < until && !armed_until_ns_.compare_exchange_weak(cur, until)) {
  }
  return true;
}

bool TraceRing::Expire(int64_t until) {
  armed_until_ns_.compare_exchange_strong(until, 0);  // a concurrent Arm wins
  return false;
}

void TraceRing::Append(std::span<const TraceEvent> events) {
  absl::MutexLock l(&mu_);
  if (ring_.empty()) return;
  for (const TraceEvent& e : events) ring_[written_++ % capacity_] = e;
}

void TraceRing::AppendForGroup(std::span<const TraceEvent> events, uint32_t group_id,
                               const std::string& job_id, uint32_t uid, int size) {
  absl::MutexLock l(&mu_);
  if (ring_.empty()) return;
  if (groups_.count(group_id) == 0) NoteGroupLocked(group_id, TraceGroupInfo{job_id, uid, size});
  for (const TraceEvent& e : events) ring_[written_++ % capacity_] = e;
}

void TraceRing::NoteGroup(uint32_t group_id, const TraceGroupInfo& info) {
  absl::MutexLock l(&mu_);
  NoteGroupLocked(group_id, info);
}

void TraceRing::NoteGroupLocked(uint32_t group_id, const TraceGroupInfo& info) {
  if (groups_.count(group_id) > 0) return;
  // Group ids only grow: the smallest belong to the oldest groups.
  while (groups_.size() >= kMaxGroups) groups_.erase(groups_.begin());
  groups_.emplace(group_id, info);
}

TraceSnapshot TraceRing::Window(int64_t from_ns, int64_t to_ns, int64_t only_uid,
                                const std::string& job_id) const {
  TraceSnapshot out;
  absl::MutexLock l(&mu_);
  if (ring_.empty()) return out;
  const uint64_t n = std::min<uint64_t>(written_, capacity_);
  out.overwritten = written_ - n;
  auto visible = [&](uint32_t group_id) {
    auto it = groups_.find(group_id);
    if (it == groups_.end()) return false;
    if (only_uid >= 0 && it->second.uid != static_cast<uint32_t>(only_uid)) return false;
    return job_id.empty() || it->second.job_id == job_id;
  };
  for (uint64_t i = written_ - n; i < written_; ++i) {
    const TraceEvent& e = ring_[i % capacity_];
    if (e.ts_ns < from_ns || e.ts_ns > to_ns || !visible(e.group_id)) continue;
    out.events.push_back(e);
    if (out.groups.count(e.group_id) == 0) out.groups[e.group_id] = groups_.at(e.group_id);
  }
  return out;
}

}  // namespace hsdp
