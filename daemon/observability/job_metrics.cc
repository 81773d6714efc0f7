#include "daemon/observability/job_metrics.h"

#include <algorithm>
#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "daemon/observability/metrics_common.h"
#include "daemon/observability/op_labels.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

using prometheus::Counter;
using prometheus::Histogram;

// The owner key of the last-resort overflow, shared by owners once kMaxJobs
// owners have overflow series of their own: (uid_t)-1 is no one's uid, and
// its owner_uid label is empty.
constexpr uint32_t kNoOwner = UINT32_MAX;
// Rank series of a job past kMaxRanksPerJob, and over all jobs past this,
// share the job's rank "_other".
constexpr size_t kMaxRankSeries = 8192;
constexpr int kOverflowRank = INT_MIN;
// Per-group lookup entries (a cache: dropping it only costs lookups).
constexpr size_t kMaxCached = 65536;

// A job is its owner plus its name: two uids' same-named jobs are two
// series sets (job_id and owner_uid labels).
JobKey JobOf(const GroupSpec& group) { return JobKey{group.owner_uid, group.job_id}; }

}  // namespace

JobMetrics::JobMetrics(uint32_t max_jobs_per_uid, std::function<void()> on_new_series)
    : max_jobs_per_uid_(max_jobs_per_uid),
      on_new_series_(std::move(on_new_series)),
      registry_(std::make_shared<prometheus::Registry>()),
      completed_(prometheus::BuildCounter()
                     .Name("hsdpd_ops_completed_total")
                     .Help("Operations that completed successfully")
                     .Register(*registry_)),
      failed_(prometheus::BuildCounter()
                  .Name("hsdpd_ops_failed_total")
                  .Help("Operations (or refused submissions) that failed, by status code")
                  .Register(*registry_)),
      bytes_(prometheus::BuildCounter()
                 .Name("hsdpd_op_bytes_total")
                 .Help("Per-rank buffer bytes of completed operations (nccl-tests size)")
                 .Register(*registry_)),
      duration_(prometheus::BuildHistogram()
                    .Name("hsdpd_op_duration_seconds")
                    .Help("Engine time of completed operations")
                    .Register(*registry_)),
      queue_wait_(prometheus::BuildHistogram()
                      .Name("hsdpd_op_queue_wait_seconds")
                      .Help("From an operation's first arrival to its hand-off to the engine "
                            "(waiting for peers and for earlier operations)")
                      .Register(*registry_)),
      engine_wait_(prometheus::BuildHistogram()
                       .Name("hsdpd_op_engine_wait_seconds")
                       .Help("Time a completed operation waited inside the engine, handed off "
                             "but not running (behind other jobs' work or between slices)")
                       .Register(*registry_)),
      arrival_lag_(prometheus::BuildHistogram()
                       .Name("hsdpd_rank_arrival_lag_seconds")
                       .Help("How long after an operation's first local arrival this rank "
                             "arrived")
                       .Register(*registry_)),
      waited_for_(prometheus::BuildCounter()
                      .Name("hsdpd_rank_waited_for_seconds_total")
                      .Help("Time the other local members waited for this rank when it "
                            "arrived last")
                      .Register(*registry_)),
      last_arrivals_(prometheus::BuildCounter()
                         .Name("hsdpd_rank_last_arrivals_total")
                         .Help("Operations where this rank arrived last")
                         .Register(*registry_)) {}

void JobMetrics::OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals) {
  if (arrivals.size() < 2) return;
  int64_t first = INT64_MAX, last = INT64_MIN, second = INT64_MIN;
  const Arrival* last_arrival = nullptr;
  for (const auto& [li, a] : arrivals) {
    first = std::min(first, a.arrived_ns);
    if (a.arrived_ns > last) {
      second = last;
      last = a.arrived_ns;
      last_arrival = &a;
    } else if (a.arrived_ns > second) {
      second = a.arrived_ns;
    }
  }
  absl::MutexLock l(&mu_);
  for (const auto& [li, a] : arrivals) {
    if (RankSeries* s = RankSeriesFor(group, a)) s->lag->Observe((a.arrived_ns - first) / 1e9);
  }
  if (RankSeries* s = RankSeriesFor(group, *last_arrival)) {
    s->last->Increment();
    s->waited->Increment((last - second) / 1e9);
  }
}

void JobMetrics::OnCompleted(const GroupSpec& group, const Arrival& a, const absl::Status& status,
                             uint64_t queued_ns, uint64_t exec_ns) {
  absl::MutexLock l(&mu_);
  if (!status.ok()) {
    JobSeries& job = JobFor(JobOf(group));
    Counter& c = failed_.Add({{"job_id", job.label},
                              {"owner_uid", job.owner},
                              {"group", std::string(GroupKind(group, a))},
                              {"op", std::string(OpName(a))},
                              {"dtype", std::string(DtypeName(a))},
                              {"reason", Reason(status)}});
    c.Increment();
    job.failed.insert(&c);
    return;
  }
  JobOpSeries& s = OpSeriesFor(group, a);
  s.op.Count(group, a, exec_ns);
  s.queue_wait->Observe(queued_ns / 1e9);
  if (a.first_ns > 0) {
    const int64_t waited =
        shm::NowNanos() - a.first_ns - static_cast<int64_t>(queued_ns + exec_ns);
    s.engine_wait->Observe(waited > 0 ? waited / 1e9 : 0.0);
  }
}

// A job gets a slot of its own while its owner holds fewer than
// max_jobs_per_uid and fewer than kMaxJobs are taken, and keeps the set it
// got for as long as it is attached.
JobMetrics::JobSeries& JobMetrics::JobFor(const JobKey& job) {
  if (auto it = jobs_.find(job); it != jobs_.end()) {
    it->second.touched = generation_;
    return it->second;
  }
  auto folded = folded_.find(job);
  if (folded == folded_.end()) {
    uint32_t& held = slots_of_uid_[job.owner_uid];
    // A job named like the overflow label shares it (its series would
    // otherwise be the same label set as its owner's overflow).
    if (held < max_jobs_per_uid_ && jobs_.size() < Metrics::kMaxJobs &&
        job.name != kOverflowLabel) {
      ++held;
      JobSeries& s = jobs_[job];
      s.label = job.name;
      s.owner = absl::StrCat(job.owner_uid);
      s.touched = generation_;
      on_new_series_();
      return s;
    }
    if (held == 0) slots_of_uid_.erase(job.owner_uid);
    const uint32_t key =
        overflow_.count(job.owner_uid) > 0 || overflow_.size() < Metrics::kMaxJobs
            ? job.owner_uid
            : kNoOwner;
    folded = folded_.emplace(job, Folded{key}).first;
  }
  folded->second.touched = generation_;
  auto [it, fresh] = overflow_.try_emplace(folded->second.overflow_key);
  JobSeries& s = it->second;
  if (fresh) {
    s.label = kOverflowLabel;
    s.owner = it->first == kNoOwner ? std::string() : absl::StrCat(it->first);
    s.overflow = true;
    on_new_series_();
  }
  s.touched = generation_;
  return s;
}

JobMetrics::JobOpSeries& JobMetrics::OpSeriesFor(const GroupSpec& group, const Arrival& a) {
  const uint64_t key = (uint64_t{group.id} << 32) | (uint64_t{a.desc.collective} << 16) |
                       (uint64_t{a.desc.dtype} << 8) | (a.phase2 ? 1 : 0);
  auto it = op_cache_.find(key);
  if (it != op_cache_.end()) {
    it->second.job->touched = generation_;
    return it->second.s;
  }
  JobSeries& job = JobFor(JobOf(group));
  const prometheus::Labels labels = {{"job_id", job.label},
                                     {"owner_uid", job.owner},
                                     {"group", std::string(GroupKind(group, a))},
                                     {"op", std::string(OpName(a))},
                                     {"dtype", std::string(DtypeName(a))}};
  JobOpSeries s{
      {&completed_.Add(labels), &bytes_.Add(labels), &duration_.Add(labels, TimeBuckets())},
      &queue_wait_.Add(labels, TimeBuckets()),
      &engine_wait_.Add(labels, TimeBuckets())};
  job.completed.insert(s.op.completed);
  job.bytes.insert(s.op.bytes);
  job.duration.insert(s.op.duration);
  job.queue_wait.insert(s.queue_wait);
  job.engine_wait.insert(s.engine_wait);
  if (op_cache_.size() >= kMaxCached) op_cache_.clear();
  return op_cache_.emplace(key, CachedOp{s, &job}).first->second.s;
}

JobMetrics::RankSeries* JobMetrics::RankSeriesFor(const GroupSpec& group, const Arrival& a) {
  const int global_rank = GlobalRank(a);
  const uint64_t key = (uint64_t{group.id} << 32) | static_cast<uint32_t>(global_rank);
  auto it = rank_cache_.find(key);
  if (it != rank_cache_.end()) {
    it->second.job->touched = generation_;
    it->second.s->touched = generation_;
    return it->second.s;
  }
  JobSeries& job = JobFor(JobOf(group));
  // An overflow's ranks are different jobs' ranks.
  if (job.overflow) return nullptr;
  int rank = global_rank;
  if (job.ranks.count(rank) == 0 &&
      (job.ranks.size() >= Metrics::kMaxRanksPerJob || rank_series_ >= kMaxRankSeries)) {
    rank = kOverflowRank;
  }
  auto [rit, fresh] = job.ranks.try_emplace(rank);
  RankSeries& s = rit->second;
  if (fresh) {
    const prometheus::Labels labels = {
        {"job_id", job.label},
        {"owner_uid", job.owner},
        {"rank", rank == kOverflowRank ? std::string(kOverflowLabel) : absl::StrCat(rank)}};
    s.lag = &arrival_lag_.Add(labels, TimeBuckets());
    s.waited = &waited_for_.Add(labels);
    s.last = &last_arrivals_.Add(labels);
    ++rank_series_;
    on_new_series_();
  }
  s.touched = generation_;
  if (rank_cache_.size() >= kMaxCached) rank_cache_.clear();
  rank_cache_.emplace(key, CachedRank{&s, &job});
  return &s;
}

void JobMetrics::RemoveRank(RankSeries& s) {
  arrival_lag_.Remove(s.lag);
  waited_for_.Remove(s.waited);
  last_arrivals_.Remove(s.last);
  --rank_series_;
}

void JobMetrics::RemoveJob(JobSeries& job) {
  for (Counter* c : job.completed) completed_.Remove(c);
  for (Counter* c : job.bytes) bytes_.Remove(c);
  for (Counter* c : job.failed) failed_.Remove(c);
  for (Histogram* h : job.duration) duration_.Remove(h);
  for (Histogram* h : job.queue_wait) queue_wait_.Remove(h);
  for (Histogram* h : job.engine_wait) engine_wait_.Remove(h);
  for (auto& [rank, s] : job.ranks) RemoveRank(s);
  job.ranks.clear();
}

uint64_t JobMetrics::NextGeneration() {
  absl::MutexLock l(&mu_);
  return ++generation_;
}

// `g` is what is attached, read after `generation` began: a job or rank that
// attached after `g` was read has used its series in this generation.
void JobMetrics::Retire(const NodeGauges& g, uint64_t generation) {
  std::map<JobKey, std::set<int>> live;
  for (const NodeGauges::Job& j : g.jobs) {
    live[JobKey{j.owner_uid, j.job_id}].insert(j.ranks.begin(), j.ranks.end());
  }
  const std::set<uint32_t> groups(g.group_ids.begin(), g.group_ids.end());
  absl::MutexLock l(&mu_);
  std::set<const JobSeries*> gone;
  std::set<const RankSeries*> gone_ranks;
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    JobSeries& job = it->second;
    auto attached = live.find(it->first);
    if (attached == live.end() && job.touched < generation) {
      RemoveJob(job);
      gone.insert(&job);
      auto held = slots_of_uid_.find(it->first.owner_uid);
      if (held != slots_of_uid_.end() && --held->second == 0) slots_of_uid_.erase(held);
      it = jobs_.erase(it);
      continue;
    }
    for (auto r = job.ranks.begin(); r != job.ranks.end();) {
      const bool rank_attached = attached != live.end() && attached->second.count(r->first) > 0;
      if (!rank_attached && r->second.touched < generation) {
        RemoveRank(r->second);
        gone_ranks.insert(&r->second);
        r = job.ranks.erase(r);
      } else {
        ++r;
      }
    }
    ++it;
  }
  std::set<uint32_t> overflow_used;
  for (auto it = folded_.begin(); it != folded_.end();) {
    if (live.count(it->first) == 0 && it->second.touched < generation) {
      it = folded_.erase(it);
    } else {
      overflow_used.insert(it->second.overflow_key);
      ++it;
    }
  }
  for (auto it = overflow_.begin(); it != overflow_.end();) {
    if (overflow_used.count(it->first) == 0 && it->second.touched < generation) {
      RemoveJob(it->second);
      gone.insert(&it->second);
      it = overflow_.erase(it);
    } else {
      ++it;
    }
  }
  // Lookup entries of groups that ended, or pointing at what was removed.
  for (auto it = op_cache_.begin(); it != op_cache_.end();) {
    const bool drop = groups.count(static_cast<uint32_t>(it->first >> 32)) == 0 ||
                      gone.count(it->second.job) > 0;
    if (drop) {
      op_cache_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto it = rank_cache_.begin(); it != rank_cache_.end();) {
    const bool drop = groups.count(static_cast<uint32_t>(it->first >> 32)) == 0 ||
                      gone.count(it->second.job) > 0 || gone_ranks.count(it->second.s) > 0;
    if (drop) {
      rank_cache_.erase(it++);
    } else {
      ++it;
    }
  }
}

void JobMetrics::Sweep(const std::function<NodeGauges()>& read) {
  const uint64_t generation = NextGeneration();
  const NodeGauges g = read();
  Retire(g, generation);
}

void JobMetrics::JobGauges(const NodeGauges& g, std::vector<prometheus::MetricFamily>* out) {
  struct Row {
    double in_flight = 0, ring = 0, arena = 0;
    std::string priority_class;
    uint32_t level = 0;
    bool shared = false;
  };
  std::map<std::pair<std::string, std::string>, Row> rows;
  {
    absl::MutexLock l(&mu_);
    for (const NodeGauges::Job& j : g.jobs) {
      const JobSeries& s = JobFor(JobKey{j.owner_uid, j.job_id});
      auto [it, fresh] = rows.try_emplace({s.label, s.owner});
      Row& r = it->second;
      r.shared = !fresh || s.overflow;
      r.in_flight += j.ops_in_flight;
      r.ring = std::max(r.ring, j.ring_occupancy);
      r.arena += j.arena_ops;
      r.priority_class = j.priority_class;
      r.level = j.priority_level;
    }
  }
  prometheus::MetricFamily in_flight =
      GaugeFamily("hsdpd_ops_in_flight", "Operations submitted and not yet completed");
  prometheus::MetricFamily ring =
      GaugeFamily("hsdpd_ring_occupancy_ratio",
                  "Fullest submission ring of the job: operations in flight / ring slots");
  prometheus::MetricFamily arena = GaugeFamily(
      "hsdpd_arena_ops",
      "Operations the job's live groups completed in their small-operation arenas, "
      "without the daemon (not in the other op series)");
  // The class of each job as an info-style series (join on job_id and
  // owner_uid): the other series keep their label sets.
  prometheus::MetricFamily level = GaugeFamily(
      "hsdpd_job_priority_level",
      "The job's class of service (label) and its level (value; lower runs first)");
  for (const auto& [labels, r] : rows) {
    const std::vector<prometheus::ClientMetric::Label> l = {{"job_id", labels.first},
                                                            {"owner_uid", labels.second}};
    in_flight.metric.push_back(GaugeValue(r.in_flight, l));
    ring.metric.push_back(GaugeValue(r.ring, l));
    arena.metric.push_back(GaugeValue(r.arena, l));
    if (!r.shared && !r.priority_class.empty()) {
      level.metric.push_back(GaugeValue(r.level, {{"job_id", labels.first},
                                                  {"owner_uid", labels.second},
                                                  {"priority_class", r.priority_class}}));
    }
  }
  out->push_back(std::move(in_flight));
  out->push_back(std::move(ring));
  out->push_back(std::move(arena));
  out->push_back(std::move(level));
}

MetricsHeld JobMetrics::Held() const {
  absl::MutexLock l(&mu_);
  MetricsHeld h;
  h.jobs = jobs_.size();
  h.overflows = overflow_.size();
  for (const auto& [k, j] : jobs_) h.ranks += j.ranks.size();
  for (const auto& [k, j] : overflow_) h.ranks += j.ranks.size();
  h.cached = op_cache_.size() + rank_cache_.size();
  return h;
}

}  // namespace hsdp
