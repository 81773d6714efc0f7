// Metrics with prometheus-cpp (built when the package is found).
#include "daemon/observability/metrics.h"

#include <algorithm>
#include <climits>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "daemon/observability/op_labels.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/common/version.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace hsdp {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Histogram;

constexpr size_t kMaxJobs = 256;
constexpr char kOverflowJob[] = "_other";
// Where the series of jobs past kMaxJobs go (uid (uid_t)-1 is no one's; its
// owner_uid label is empty).
const JobKey& OverflowKey() {
  static const JobKey kKey{UINT32_MAX, kOverflowJob};
  return kKey;
}
std::string OwnerLabel(const JobKey& job) {
  return job == OverflowKey() ? std::string() : absl::StrCat(job.owner_uid);
}

const Histogram::BucketBoundaries& TimeBuckets() {
  static const Histogram::BucketBoundaries kBuckets = {
      1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025,
      0.05, 0.1,    0.25, 0.5,  1,      2.5,  5,    10,     30,   60};
  return kBuckets;
}

std::string Reason(const absl::Status& s) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(s.code()));
}

prometheus::ClientMetric GaugeValue(double v,
                                    std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  m.gauge.value = v;
  return m;
}

prometheus::MetricFamily GaugeFamily(std::string name, std::string help) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = prometheus::MetricType::Gauge;
  return f;
}

}  // namespace

class Metrics::Impl {
 public:
  explicit Impl(NodeGaugeSource gauges)
      : registry_(std::make_shared<prometheus::Registry>()),
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
                           .Register(*registry_)),
        busy_(prometheus::BuildCounter()
                  .Name("hsdpd_engine_busy_seconds_total")
                  .Help("Sum of the engine time of all operations")
                  .Register(*registry_)
                  .Add({})),
        node_(std::make_shared<NodeCollectable>(this, std::move(gauges))) {}

  ~Impl() { StopServing(); }  // stop scrapes before anything they read goes

  void StopServing() { exposer_.reset(); }

  absl::Status Serve(const std::string& listen, std::string* bound) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics.listen: cannot serve /metrics on \"", listen, "\": ", e.what()));
    }
    exposer_->RegisterCollectable(registry_);
    exposer_->RegisterCollectable(node_);
    const std::vector<int> ports = exposer_->GetListeningPorts();
    const std::string host = listen.substr(0, listen.rfind(':'));
    *bound = absl::StrCat(host, ":", ports.empty() ? 0 : ports[0]);
    return absl::OkStatus();
  }

  std::string Text() const {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    for (auto& f : node_->Collect()) families.push_back(std::move(f));
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    return out.str();
  }

  void OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals) {
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
      RankSeriesFor(group, a).lag->Observe((a.arrived_ns - first) / 1e9);
    }
    RankSeries& s = RankSeriesFor(group, *last_arrival);
    s.last->Increment();
    s.waited->Increment((last - second) / 1e9);
  }

  void OnCompleted(const GroupSpec& group, const std::vector<Arrival>& arrivals,
                   const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns) {
    if (arrivals.empty()) return;
    const Arrival& a = arrivals.front();
    absl::MutexLock l(&mu_);
    if (exec_ns > 0) busy_.Increment(exec_ns / 1e9);
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
    OpSeries& s = OpSeriesFor(group, a);
    s.completed->Increment();
    s.bytes->Increment(static_cast<double>(OpBytes(group, a)));
    s.duration->Observe(exec_ns / 1e9);
    s.queue_wait->Observe(queued_ns / 1e9);
    if (a.first_ns > 0) {
      const int64_t waited =
          shm::NowNanos() - a.first_ns - static_cast<int64_t>(queued_ns + exec_ns);
      s.engine_wait->Observe(waited > 0 ? waited / 1e9 : 0.0);
    }
  }

 private:
  struct OpSeries {
    Counter* completed;
    Counter* bytes;
    Histogram* duration;
    Histogram* queue_wait;
    Histogram* engine_wait;
  };
  struct RankSeries {
    Histogram* lag;
    Counter* waited;
    Counter* last;
  };
  struct JobSeries {
    std::string label;  // job_id
    std::string owner;  // owner_uid
    std::vector<uint64_t> op_keys, rank_keys;  // cache entries to forget
    std::set<Counter*> completed, bytes, failed, waited, last;
    std::set<Histogram*> duration, queue_wait, engine_wait, lag;
    absl::Time absent_since = absl::InfiniteFuture();
  };

  class NodeCollectable : public prometheus::Collectable {
   public:
    NodeCollectable(Impl* impl, NodeGaugeSource source) : impl_(impl), source_(std::move(source)) {}
    std::vector<prometheus::MetricFamily> Collect() const override {
      const NodeGauges g = source_ ? source_() : NodeGauges{};
      impl_->Retire(g);
      std::vector<prometheus::MetricFamily> out;
      auto single = [&](const char* name, const char* help, double v) {
        prometheus::MetricFamily f = GaugeFamily(name, help);
        f.metric.push_back(GaugeValue(v));
        out.push_back(std::move(f));
      };
      single("hsdpd_sessions", "Attached sessions", g.sessions);
      single("hsdpd_jobs", "Jobs with attached sessions", g.jobs.size());
      single("hsdpd_groups", "Communication groups", g.groups);
      single("hsdpd_registered_bytes", "Shared memory registered by all sessions",
             g.registered_bytes);
      single("hsdpd_registered_bytes_limit", "limits.max_node_bytes (resolved)",
             g.registered_bytes_limit);
      prometheus::MetricFamily in_flight =
          GaugeFamily("hsdpd_ops_in_flight", "Operations submitted and not yet completed");
      prometheus::MetricFamily ring =
          GaugeFamily("hsdpd_ring_occupancy_ratio",
                      "Fullest submission ring of the job: operations in flight / ring slots");
      // The class of each job as an info-style series (join on job_id and
      // owner_uid): the other series keep their label sets.
      prometheus::MetricFamily arena = GaugeFamily(
          "hsdpd_arena_ops",
          "Operations the job's live groups completed in their small-operation arenas, "
          "without the daemon (not in the other op series)");
      prometheus::MetricFamily level = GaugeFamily(
          "hsdpd_job_priority_level",
          "The job's class of service (label) and its level (value; lower runs first)");
      for (const NodeGauges::Job& j : g.jobs) {
        const auto [label, owner] = impl_->LabelOf(JobKey{j.owner_uid, j.job_id});
        in_flight.metric.push_back(
            GaugeValue(j.ops_in_flight, {{"job_id", label}, {"owner_uid", owner}}));
        ring.metric.push_back(
            GaugeValue(j.ring_occupancy, {{"job_id", label}, {"owner_uid", owner}}));
        arena.metric.push_back(
            GaugeValue(double(j.arena_ops), {{"job_id", label}, {"owner_uid", owner}}));
        if (!j.priority_class.empty()) {
          level.metric.push_back(GaugeValue(
              j.priority_level,
              {{"job_id", label}, {"owner_uid", owner}, {"priority_class", j.priority_class}}));
        }
      }
      out.push_back(std::move(in_flight));
      out.push_back(std::move(ring));
      out.push_back(std::move(arena));
      out.push_back(std::move(level));
      prometheus::MetricFamily info = GaugeFamily("hsdpd_build_info", "hsdpd's version");
      info.metric.push_back(GaugeValue(1, {{"version", kHsdpVersion}}));
      out.push_back(std::move(info));
      return out;
    }

   private:
    Impl* const impl_;
    const NodeGaugeSource source_;
  };

  static prometheus::Labels OpLabels(const JobSeries& job, const GroupSpec& group,
                                     const Arrival& a) {
    return {{"job_id", job.label},
            {"owner_uid", job.owner},
            {"group", std::string(GroupKind(group, a))},
            {"op", std::string(OpName(a))},
            {"dtype", std::string(DtypeName(a))}};
  }

  // A job is its owner plus its name: two uids' same-named jobs are two
  // series sets (job_id and owner_uid labels).
  static JobKey JobOf(const GroupSpec& group) { return JobKey{group.owner_uid, group.job_id}; }

  JobSeries& JobFor(const JobKey& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = jobs_.find(job);
    if (it == jobs_.end()) {
      const bool overflow = jobs_.size() >= kMaxJobs;
      const JobKey& key = overflow ? OverflowKey() : job;
      it = jobs_.find(key);
      if (it == jobs_.end()) {
        it = jobs_.emplace(key, JobSeries{}).first;
        it->second.label = key.name;
        it->second.owner = OwnerLabel(key);
      }
    }
    it->second.absent_since = absl::InfiniteFuture();
    return it->second;
  }

  // The (job_id, owner_uid) labels of `job`'s series.
  std::pair<std::string, std::string> LabelOf(const JobKey& job) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    const JobKey& key = jobs_.count(job) > 0 || jobs_.size() < kMaxJobs ? job : OverflowKey();
    return {key.name, OwnerLabel(key)};
  }

  OpSeries& OpSeriesFor(const GroupSpec& group, const Arrival& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t key = (uint64_t{group.id} << 32) | (uint64_t{a.desc.collective} << 16) |
                         (uint64_t{a.desc.dtype} << 8) | (a.phase2 ? 1 : 0);
    auto it = op_cache_.find(key);
    if (it != op_cache_.end()) return it->second;
    JobSeries& job = JobFor(JobOf(group));
    const prometheus::Labels labels = OpLabels(job, group, a);
    OpSeries s{&completed_.Add(labels), &bytes_.Add(labels), &duration_.Add(labels, TimeBuckets()),
               &queue_wait_.Add(labels, TimeBuckets()), &engine_wait_.Add(labels, TimeBuckets())};
    job.op_keys.push_back(key);
    job.completed.insert(s.completed);
    job.bytes.insert(s.bytes);
    job.duration.insert(s.duration);
    job.queue_wait.insert(s.queue_wait);
    job.engine_wait.insert(s.engine_wait);
    return op_cache_.emplace(key, s).first->second;
  }

  RankSeries& RankSeriesFor(const GroupSpec& group, const Arrival& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int rank = GlobalRank(a);
    const uint64_t key = (uint64_t{group.id} << 32) | static_cast<uint32_t>(rank);
    auto it = rank_cache_.find(key);
    if (it != rank_cache_.end()) return it->second;
    JobSeries& job = JobFor(JobOf(group));
    const prometheus::Labels labels = {
        {"job_id", job.label}, {"owner_uid", job.owner}, {"rank", absl::StrCat(rank)}};
    RankSeries s{&arrival_lag_.Add(labels, TimeBuckets()), &waited_for_.Add(labels),
                 &last_arrivals_.Add(labels)};
    job.rank_keys.push_back(key);
    job.lag.insert(s.lag);
    job.waited.insert(s.waited);
    job.last.insert(s.last);
    return rank_cache_.emplace(key, s).first->second;
  }

  // Drops the series of jobs gone for longer than kJobRetention.
  void Retire(const NodeGauges& g) ABSL_LOCKS_EXCLUDED(mu_) {
    std::set<JobKey> live;
    for (const NodeGauges::Job& j : g.jobs) live.insert(JobKey{j.owner_uid, j.job_id});
    const absl::Time now = absl::Now();
    absl::MutexLock l(&mu_);
    for (auto it = jobs_.begin(); it != jobs_.end();) {
      JobSeries& job = it->second;
      const bool is_live =
          live.count(it->first) > 0 || (it->first == OverflowKey() && live.size() > kMaxJobs);
      if (is_live) {
        job.absent_since = absl::InfiniteFuture();
      } else if (job.absent_since == absl::InfiniteFuture()) {
        job.absent_since = now;
      }
      if (now - job.absent_since < kJobRetention) {
        ++it;
        continue;
      }
      for (uint64_t k : job.op_keys) op_cache_.erase(k);
      for (uint64_t k : job.rank_keys) rank_cache_.erase(k);
      for (Counter* c : job.completed) completed_.Remove(c);
      for (Counter* c : job.bytes) bytes_.Remove(c);
      for (Counter* c : job.failed) failed_.Remove(c);
      for (Counter* c : job.waited) waited_for_.Remove(c);
      for (Counter* c : job.last) last_arrivals_.Remove(c);
      for (Histogram* h : job.duration) duration_.Remove(h);
      for (Histogram* h : job.queue_wait) queue_wait_.Remove(h);
      for (Histogram* h : job.engine_wait) engine_wait_.Remove(h);
      for (Histogram* h : job.lag) arrival_lag_.Remove(h);
      it = jobs_.erase(it);
    }
  }

  std::shared_ptr<prometheus::Registry> registry_;
  Family<Counter>& completed_;
  Family<Counter>& failed_;
  Family<Counter>& bytes_;
  Family<Histogram>& duration_;
  Family<Histogram>& queue_wait_;
  Family<Histogram>& engine_wait_;
  Family<Histogram>& arrival_lag_;
  Family<Counter>& waited_for_;
  Family<Counter>& last_arrivals_;
  Counter& busy_;
  const std::shared_ptr<NodeCollectable> node_;

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, OpSeries> op_cache_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, RankSeries> rank_cache_ ABSL_GUARDED_BY(mu_);
  std::map<JobKey, JobSeries> jobs_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<prometheus::Exposer> exposer_;  // last: destroyed first
};

bool Metrics::Available() { return true; }

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(NodeGaugeSource gauges) {
  return std::unique_ptr<Metrics>(new Metrics(std::make_unique<Impl>(std::move(gauges))));
}

absl::Status Metrics::Serve(const std::string& listen) { return impl_->Serve(listen, &address_); }

void Metrics::StopServing() { impl_->StopServing(); }

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

std::string Metrics::Text() const { return impl_->Text(); }

void Metrics::OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals) {
  impl_->OnMatched(group, arrivals);
}

void Metrics::OnCompleted(const GroupSpec& group, const std::vector<Arrival>& arrivals,
                          const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns) {
  impl_->OnCompleted(group, arrivals, status, queued_ns, exec_ns);
}

}  // namespace hsdp
