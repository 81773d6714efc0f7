// The per-job series of Metrics, kept only when /metrics has a password:
// per job (job_id, owner_uid) the operation series, per rank the arrival
// series, and the per-job gauges at scrape time (metrics.h lists them).
//
// Its rules:
// - Slots. At most Metrics::kMaxJobs jobs have series of their own, the jobs
//   of one owner uid at most `max_jobs_per_uid` of them. An owner's further
//   jobs fold into *its own* overflow series (job_id "_other", owner_uid its
//   uid), never another owner's; only once kMaxJobs owners have overflow
//   series do further owners share one with owner_uid "". A job named
//   "_other" always folds. A job keeps the series set it got for as long as
//   it is attached (used or listed by the gauges).
// - Ranks. A job with series of its own keeps at most
//   Metrics::kMaxRanksPerJob rank series (8192 over all jobs); later ranks
//   share rank "_other". Overflow series have no rank series (they would mix
//   jobs' ranks).
// - Retirement. Retire drops the series of jobs and ranks not attached and
//   not used since the given generation began, and frees their slots; the
//   per-group lookup entries of ended groups or removed series go with them.
// - Making a series set calls `on_new_series` (under this object's lock; it
//   must not call back), so a sweeper can retire without scrapes.
//
// Thread-safety: all methods are thread-safe.
#ifndef HSDP_DAEMON_OBSERVABILITY_JOB_METRICS_H_
#define HSDP_DAEMON_OBSERVABILITY_JOB_METRICS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/dataplane/group.h"
#include "daemon/observability/metrics.h"
#include "daemon/observability/metrics_common.h"
#include "daemon/observability/node_totals.h"
#include "daemon/session/job_key.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace hsdp {

class JobMetrics : public JobScrape {
 public:
  // The job_id (and rank) label of shared series.
  static constexpr char kOverflowLabel[] = "_other";

  JobMetrics(uint32_t max_jobs_per_uid, std::function<void()> on_new_series);
  JobMetrics(const JobMetrics&) = delete;
  JobMetrics& operator=(const JobMetrics&) = delete;

  // Observer hooks: arrival lags and the last rank of a matched operation;
  // an operation's outcome.
  void OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals);
  void OnCompleted(const GroupSpec& group, const Arrival& a, const absl::Status& status,
                   uint64_t queued_ns, uint64_t exec_ns);

  // JobScrape.
  uint64_t NextGeneration() override ABSL_LOCKS_EXCLUDED(mu_);
  void Retire(const NodeGauges& g, uint64_t generation) override ABSL_LOCKS_EXCLUDED(mu_);
  // Jobs that share an overflow label set are summed (ring occupancy: the
  // fullest), so no label set appears twice.
  void JobGauges(const NodeGauges& g, std::vector<prometheus::MetricFamily>* out) override
      ABSL_LOCKS_EXCLUDED(mu_);

  // One sweep: a generation, `read` (what is attached), Retire.
  void Sweep(const std::function<NodeGauges()>& read) ABSL_LOCKS_EXCLUDED(mu_);

  MetricsHeld Held() const ABSL_LOCKS_EXCLUDED(mu_);
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

 private:
  // The node totals' operation series, per job, and the job's waits.
  struct JobOpSeries {
    OpSeries op;
    prometheus::Histogram* queue_wait;
    prometheus::Histogram* engine_wait;
  };
  struct RankSeries {
    prometheus::Histogram* lag;
    prometheus::Counter* waited;
    prometheus::Counter* last;
    uint64_t touched = 0;  // sweep generation of its last use
  };
  struct JobSeries {
    std::string label;  // job_id
    std::string owner;  // owner_uid
    bool overflow = false;
    uint64_t touched = 0;  // sweep generation of its last use
    std::set<prometheus::Counter*> completed, bytes, failed;
    std::set<prometheus::Histogram*> duration, queue_wait, engine_wait;
    std::map<int, RankSeries> ranks;
  };
  struct CachedOp {
    JobOpSeries s;
    JobSeries* job;
  };
  struct CachedRank {
    RankSeries* s;
    JobSeries* job;
  };
  struct Folded {
    uint32_t overflow_key;  // into overflow_
    uint64_t touched = 0;
  };

  // The series set of `job`: its own while it holds a slot, else its
  // owner's overflow.
  JobSeries& JobFor(const JobKey& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  JobOpSeries& OpSeriesFor(const GroupSpec& group, const Arrival& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Null for jobs without series of their own (overflow).
  RankSeries* RankSeriesFor(const GroupSpec& group, const Arrival& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveRank(RankSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveJob(JobSeries& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint32_t max_jobs_per_uid_;
  const std::function<void()> on_new_series_;
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& completed_;
  prometheus::Family<prometheus::Counter>& failed_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Histogram>& duration_;
  prometheus::Family<prometheus::Histogram>& queue_wait_;
  prometheus::Family<prometheus::Histogram>& engine_wait_;
  prometheus::Family<prometheus::Histogram>& arrival_lag_;
  prometheus::Family<prometheus::Counter>& waited_for_;
  prometheus::Family<prometheus::Counter>& last_arrivals_;

  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, CachedOp> op_cache_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, CachedRank> rank_cache_ ABSL_GUARDED_BY(mu_);
  std::map<JobKey, JobSeries> jobs_ ABSL_GUARDED_BY(mu_);           // own slots
  std::map<uint32_t, JobSeries> overflow_ ABSL_GUARDED_BY(mu_);     // by owner uid
  std::map<JobKey, Folded> folded_ ABSL_GUARDED_BY(mu_);            // jobs in an overflow
  std::map<uint32_t, uint32_t> slots_of_uid_ ABSL_GUARDED_BY(mu_);  // own slots per owner
  size_t rank_series_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_JOB_METRICS_H_
