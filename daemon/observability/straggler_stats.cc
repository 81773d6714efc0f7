#include "daemon/observability/straggler_stats.h"

#include <algorithm>
#include <cmath>

namespace hsdp {

int StragglerStats::BucketOf(int64_t ns) {
  if (ns < 1) return 0;
  // Smallest b with ns < 2^(b/4).
  const int b = static_cast<int>(std::floor(4.0 * std::log2(static_cast<double>(ns)))) + 1;
  return std::clamp(b, 1, kBuckets - 1);
}

int64_t StragglerStats::BucketUpperNs(int bucket) {
  if (bucket <= 0) return 1;
  return static_cast<int64_t>(std::ceil(std::exp2(bucket / 4.0)));
}

void StragglerStats::Record(const std::string& job_id, uint32_t uid, int last_rank,
                            int64_t waited_ns, StragglerEvent event) {
  absl::MutexLock l(&mu_);
  const JobKey key{uid, job_id};
  auto it = jobs_.find(key);
  if (it == jobs_.end()) {
    if (jobs_.size() >= kMaxJobs) {
      auto oldest = std::min_element(jobs_.begin(), jobs_.end(), [](const auto& a, const auto& b) {
        return a.second.last_touch < b.second.last_touch;
      });
      jobs_.erase(oldest);
    }
    it = jobs_.emplace(key, JobState{}).first;
  }
  JobState& job = it->second;
  job.last_touch = ++clock_;
  ++job.ops_matched;
  if (waited_ns < 0) return;
  if (job.ranks.count(last_rank) == 0 && job.ranks.size() >= kMaxRanksPerJob) return;
  RankState& r = job.ranks[last_rank];
  ++r.times_last;
  r.waited_ns += static_cast<uint64_t>(waited_ns);
  r.max_ns = std::max(r.max_ns, waited_ns);
  ++r.buckets[BucketOf(waited_ns)];
  event.event_id = next_event_id_++;
  event.waited_ns = waited_ns;
  r.recent[r.recent_next++ % kRecent] = event;
}

std::vector<StragglerJobReport> StragglerStats::Report(const std::string& job_id,
                                                       std::optional<uint32_t> only_uid) const {
  std::vector<StragglerJobReport> out;
  absl::MutexLock l(&mu_);
  for (const auto& [key, job] : jobs_) {
    if (!job_id.empty() && key.name != job_id) continue;
    if (only_uid.has_value() && key.owner_uid != *only_uid) continue;
    StragglerJobReport jr;
    jr.job_id = key.name;
    jr.owner_uid = key.owner_uid;
    jr.ops_matched = job.ops_matched;
    for (const auto& [rank, r] : job.ranks) {
      StragglerRankReport rr;
      rr.job_id = key.name;
      rr.owner_uid = key.owner_uid;
      rr.rank = rank;
      rr.times_last = r.times_last;
      rr.waited_ns_total = r.waited_ns;
      rr.max_ns = r.max_ns;
      // r by an init-capture: clang before 16 cannot capture a structured binding.
      auto percentile = [&r = r](double p) -> int64_t {
        const uint64_t target = static_cast<uint64_t>(std::ceil(p * r.times_last));
        uint64_t seen = 0;
        for (int b = 0; b < kBuckets; ++b) {
          seen += r.buckets[b];
          if (seen >= std::max<uint64_t>(target, 1)) return std::min(BucketUpperNs(b), r.max_ns);
        }
        return r.max_ns;
      };
      rr.p50_ns = percentile(0.50);
      rr.p90_ns = percentile(0.90);
      rr.p99_ns = percentile(0.99);
      for (uint64_t i = r.recent_next - std::min<uint64_t>(r.recent_next, kRecent);
           i < r.recent_next; ++i) {
        rr.recent.push_back(r.recent[i % kRecent]);
      }
      jr.ranks.push_back(std::move(rr));
    }
    std::sort(jr.ranks.begin(), jr.ranks.end(), [](const auto& a, const auto& b) {
      return a.waited_ns_total != b.waited_ns_total ? a.waited_ns_total > b.waited_ns_total
                                                    : a.rank < b.rank;
    });
    out.push_back(std::move(jr));
  }
  return out;
}

}  // namespace hsdp
