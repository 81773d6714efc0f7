#include "daemon/engine/cpu/fair_queue.h"

#include <algorithm>
#include <iterator>
#include <vector>

namespace hsdp::cpu {

void FairQueue::Push(const Entry& e) {
  ClassState& c = classes_[e.qos_class];
  auto [it, fresh] = jobs_.try_emplace(JobId{e.qos_class, e.job});
  JobState& s = it->second;
  if (s.queued.empty()) {
    // Becoming busy: no credit for the time it was idle.
    s.vtime = std::max(s.vtime, c.vclock);
    c.busy.insert({s.vtime, e.job});
  }
  s.queued.emplace(std::make_pair(e.priority, e.order), e);
  ++size_;
  if (fresh && jobs_.size() > kMaxIdleJobs * 2) ForgetIdle();
}

std::optional<FairQueue::Entry> FairQueue::Pop() {
  for (auto cit = classes_.begin(); cit != classes_.end(); ++cit) {
    ClassState& c = cit->second;
    if (c.busy.empty()) continue;
    const auto [vtime, job] = *c.busy.begin();
    JobState& s = jobs_.at(JobId{cit->first, job});
    auto first = s.queued.begin();
    Entry e = first->second;
    s.queued.erase(first);
    --size_;
    c.vclock = std::max(c.vclock, vtime);
    if (s.queued.empty()) c.busy.erase(c.busy.begin());
    return e;
  }
  return std::nullopt;
}

void FairQueue::Charge(int qos_class, const std::string& job, uint64_t bytes) {
  auto it = jobs_.find(JobId{qos_class, job});
  if (it == jobs_.end()) return;
  JobState& s = it->second;
  ClassState& c = classes_[qos_class];
  const bool busy = !s.queued.empty();
  if (busy) c.busy.erase({s.vtime, job});
  s.vtime += std::max<uint64_t>(bytes, 1);
  if (busy) c.busy.insert({s.vtime, job});
}

void FairQueue::ForgetIdle() {
  size_t idle = 0;
  for (const auto& [id, s] : jobs_) idle += s.queued.empty() ? 1 : 0;
  if (idle <= kMaxIdleJobs) return;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    const bool forget =
        it->second.queued.empty() && it->second.vtime <= classes_[it->first.first].vclock;
    it = forget ? jobs_.erase(it) : std::next(it);
  }
  // Idle jobs still ahead of the clock (served more than their share): keep
  // the ones furthest ahead within the bound, so the heaviest users cannot
  // shed their debt by going idle; the rest restart at the clock.
  std::vector<std::pair<uint64_t, JobId>> ahead;
  for (const auto& [id, s] : jobs_) {
    if (s.queued.empty()) ahead.push_back({s.vtime, id});
  }
  if (ahead.size() <= kMaxIdleJobs) return;
  std::sort(ahead.begin(), ahead.end());
  for (size_t i = 0; i + kMaxIdleJobs < ahead.size(); ++i) jobs_.erase(ahead[i].second);
}

}  // namespace hsdp::cpu
