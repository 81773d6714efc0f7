// StragglerStats: per job and global rank, how often and how long the other
// local members of an operation waited for that rank because it arrived
// last — counts, total, a log-bucketed histogram (for percentiles) and the
// last few operations where it happened. Memory is bounded: at most
// kMaxRanksPerJob ranks per job, kMaxJobs jobs (jobs with no activity for
// longest are dropped first), kRecent operations per rank.
//
// Thread-safety: all methods are thread-safe.
#ifndef HSDP_DAEMON_OBSERVABILITY_STRAGGLER_STATS_H_
#define HSDP_DAEMON_OBSERVABILITY_STRAGGLER_STATS_H_

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "daemon/session/job_key.h"

namespace hsdp {

// One operation where a rank arrived last.
struct StragglerEvent {
  uint64_t event_id = 0;  // increases by one per recorded event, daemon-wide
  int64_t mono_ns = 0;    // when the op matched (monotonic)
  uint32_t group_id = 0;
  std::string_view op;  // "all_reduce", ... (static storage)
  uint64_t seq = 0;
  uint32_t epoch = 0;
  int64_t waited_ns = 0;  // last arrival minus the one before it
};

struct StragglerRankReport {
  std::string job_id;
  uint32_t owner_uid = 0;
  int rank = 0;
  uint64_t times_last = 0;
  uint64_t waited_ns_total = 0;
  int64_t p50_ns = 0, p90_ns = 0, p99_ns = 0, max_ns = 0;
  std::vector<StragglerEvent> recent;  // oldest first
};

struct StragglerJobReport {
  std::string job_id;
  uint32_t owner_uid = 0;
  uint64_t ops_matched = 0;                // operations with >= 2 local members that matched
  std::vector<StragglerRankReport> ranks;  // by waited_ns_total, largest first
};

class StragglerStats {
 public:
  static constexpr size_t kRecent = 16;
  static constexpr size_t kMaxJobs = 1024;
  static constexpr size_t kMaxRanksPerJob = 65536;
  // Histogram: bucket b (b >= 1) holds waits in [2^((b-1)/4), 2^(b/4)) ns;
  // bucket 0 holds waits under 1 ns. Percentiles report the bucket's upper
  // bound (at most 19% above the true value), capped at the max seen.
  static constexpr int kBuckets = 4 * 40 + 1;

  // One matched operation of job `job_id` of owner `uid` (jobs are kept
  // per (owner, name): two users' same-named jobs never mix). `last_rank` arrived
  // last and the others waited `waited_ns` for it (< 0: fewer than two local
  // members, counts only as matched).
  void Record(const std::string& job_id, uint32_t uid, int last_rank, int64_t waited_ns,
              StragglerEvent event) ABSL_LOCKS_EXCLUDED(mu_);

  // Jobs owned by `only_uid` (every job if unset), or only `job_id` when
  // non-empty; ranks that never arrived last are left out.
  std::vector<StragglerJobReport> Report(const std::string& job_id,
                                         std::optional<uint32_t> only_uid) const
      ABSL_LOCKS_EXCLUDED(mu_);

  static int BucketOf(int64_t ns);
  static int64_t BucketUpperNs(int bucket);

 private:
  struct RankState {
    uint64_t times_last = 0;
    uint64_t waited_ns = 0;
    int64_t max_ns = 0;
    std::array<uint32_t, kBuckets> buckets{};
    std::array<StragglerEvent, kRecent> recent{};  // a ring: recent_count events end at recent_next
    uint64_t recent_next = 0;
  };
  struct JobState {
    uint64_t ops_matched = 0;
    uint64_t last_touch = 0;  // clock_ value of the latest Record
    std::map<int, RankState> ranks;
  };

  mutable absl::Mutex mu_;
  std::map<JobKey, JobState> jobs_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_event_id_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_STRAGGLER_STATS_H_
