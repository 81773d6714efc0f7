// Metrics with prometheus-cpp (built when the package is found).
#include "daemon/observability/metrics.h"

#include <algorithm>
#include <climits>
#include <set>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
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

constexpr char kOverflowLabel[] = "_other";
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

// Compares over the longer length so the time does not tell where the first
// difference is, nor (beyond its length) what the secret is.
bool SameSecret(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// GroupKind's answers, numbered.
uint32_t KindIndex(std::string_view kind) {
  if (kind == "world") return 0;
  if (kind == "sub") return 1;
  if (kind == "shard") return 2;
  return 3;
}

}  // namespace

class Metrics::Impl {
 public:
  Impl(NodeGaugeSource gauges, MetricsOptions options)
      : options_(std::move(options)),
        registry_(std::make_shared<prometheus::Registry>()),
        node_registry_(std::make_shared<prometheus::Registry>()),
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
        node_completed_(prometheus::BuildCounter()
                            .Name("hsdpd_node_ops_completed_total")
                            .Help("Operations of all jobs that completed successfully")
                            .Register(*node_registry_)),
        node_failed_(prometheus::BuildCounter()
                         .Name("hsdpd_node_ops_failed_total")
                         .Help("Operations of all jobs (or refused submissions) that failed, by "
                               "status code")
                         .Register(*node_registry_)),
        node_bytes_(prometheus::BuildCounter()
                        .Name("hsdpd_node_op_bytes_total")
                        .Help("Per-rank buffer bytes of all jobs' completed operations")
                        .Register(*node_registry_)),
        node_duration_(prometheus::BuildHistogram()
                           .Name("hsdpd_node_op_duration_seconds")
                           .Help("Engine time of all jobs' completed operations")
                           .Register(*node_registry_)),
        busy_(prometheus::BuildCounter()
                  .Name("hsdpd_engine_busy_seconds_total")
                  .Help("Sum of the engine time of all operations")
                  .Register(*node_registry_)
                  .Add({})),
        node_(std::make_shared<NodeCollectable>(this, std::move(gauges))) {}

  ~Impl() { StopServing(); }  // stop scrapes and sweeps before anything they read goes

  bool job_series() const { return !options_.password.empty(); }

  void StopServing() {
    exposer_.reset();
    {
      absl::MutexLock l(&sweep_mu_);
      stop_ = true;
    }
    if (sweeper_.joinable()) sweeper_.join();
  }

  absl::Status Serve(const std::string& listen, std::string* bound) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics.listen: cannot serve /metrics on \"", listen, "\": ", e.what()));
    }
    if (job_series()) {
      exposer_->RegisterAuth(
          [this](const std::string& user, const std::string& password) {
            // Both compared in full, whatever the first says.
            const bool user_ok = SameSecret(user, options_.username);
            const bool password_ok = SameSecret(password, options_.password);
            return user_ok && password_ok;
          },
          "hsdpd");
    }
    // Collected in this order: node_ first drops what is no longer attached.
    exposer_->RegisterCollectable(node_);
    if (job_series()) exposer_->RegisterCollectable(registry_);
    exposer_->RegisterCollectable(node_registry_);
    const std::vector<int> ports = exposer_->GetListeningPorts();
    const std::string host = listen.substr(0, listen.rfind(':'));
    *bound = absl::StrCat(host, ":", ports.empty() ? 0 : ports[0]);
    if (job_series()) sweeper_ = std::thread([this] { SweepLoop(); });
    return absl::OkStatus();
  }

  std::string Text() const {
    // node_ first: it drops what is no longer attached.
    std::vector<prometheus::MetricFamily> families = node_->Collect();
    if (job_series()) {
      for (auto& f : registry_->Collect()) families.push_back(std::move(f));
    }
    for (auto& f : node_registry_->Collect()) families.push_back(std::move(f));
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    return out.str();
  }

  MetricsHeld Held() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    MetricsHeld h;
    h.jobs = jobs_.size();
    h.overflows = overflow_.size();
    for (const auto& [k, j] : jobs_) h.ranks += j.ranks.size();
    for (const auto& [k, j] : overflow_) h.ranks += j.ranks.size();
    h.cached = op_cache_.size() + rank_cache_.size();
    return h;
  }

  void OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals) {
    if (arrivals.size() < 2 || !job_series()) return;
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

  void OnCompleted(const GroupSpec& group, const std::vector<Arrival>& arrivals,
                   const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns) {
    if (arrivals.empty()) return;
    const Arrival& a = arrivals.front();
    absl::MutexLock l(&mu_);
    if (exec_ns > 0) busy_.Increment(exec_ns / 1e9);
    if (!status.ok()) {
      node_failed_.Add({{"op", std::string(OpName(a))}, {"reason", Reason(status)}}).Increment();
      if (!job_series()) return;
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
    const double bytes = static_cast<double>(OpBytes(group, a));
    NodeOpSeries& n = NodeSeriesFor(group, a);
    n.completed->Increment();
    n.bytes->Increment(bytes);
    n.duration->Observe(exec_ns / 1e9);
    if (!job_series()) return;
    OpSeries& s = OpSeriesFor(group, a);
    s.completed->Increment();
    s.bytes->Increment(bytes);
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
  struct NodeOpSeries {
    Counter* completed;
    Counter* bytes;
    Histogram* duration;
  };
  struct RankSeries {
    Histogram* lag;
    Counter* waited;
    Counter* last;
    uint64_t touched = 0;  // sweep generation of its last use
  };
  struct JobSeries {
    std::string label;  // job_id
    std::string owner;  // owner_uid
    bool overflow = false;
    uint64_t touched = 0;  // sweep generation of its last use
    std::set<Counter*> completed, bytes, failed;
    std::set<Histogram*> duration, queue_wait, engine_wait;
    std::map<int, RankSeries> ranks;
  };
  struct CachedOp {
    OpSeries s;
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

  class NodeCollectable : public prometheus::Collectable {
   public:
    NodeCollectable(Impl* impl, NodeGaugeSource source) : impl_(impl), source_(std::move(source)) {}
    std::vector<prometheus::MetricFamily> Collect() const override {
      const uint64_t generation = impl_->job_series() ? impl_->NextGeneration() : 0;
      const NodeGauges g = Read();
      if (impl_->job_series()) impl_->Retire(g, generation);
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
      uint64_t in_flight_total = 0;
      for (const NodeGauges::Job& j : g.jobs) in_flight_total += j.ops_in_flight;
      single("hsdpd_node_ops_in_flight", "Operations of all jobs submitted and not yet completed",
             in_flight_total);
      if (impl_->job_series()) impl_->JobGauges(g, &out);
      prometheus::MetricFamily info = GaugeFamily("hsdpd_build_info", "hsdpd's version");
      info.metric.push_back(GaugeValue(1, {{"version", kHsdpVersion}}));
      out.push_back(std::move(info));
      return out;
    }

    NodeGauges Read() const { return source_ ? source_() : NodeGauges{}; }

   private:
    Impl* const impl_;
    const NodeGaugeSource source_;
  };

  // The per-job gauges; jobs that share an overflow label are summed (ring
  // occupancy: the fullest), so no label set appears twice.
  void JobGauges(const NodeGauges& g, std::vector<prometheus::MetricFamily>* out)
      ABSL_LOCKS_EXCLUDED(mu_) {
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
        level.metric.push_back(GaugeValue(
            r.level, {{"job_id", labels.first},
                      {"owner_uid", labels.second},
                      {"priority_class", r.priority_class}}));
      }
    }
    out->push_back(std::move(in_flight));
    out->push_back(std::move(ring));
    out->push_back(std::move(arena));
    out->push_back(std::move(level));
  }

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

  // The series set of `job`: its own while it holds a slot (it gets one
  // while its owner holds fewer than max_jobs_per_uid and fewer than
  // kMaxJobs are taken), else its owner's overflow. A job keeps the set it
  // got for as long as it is attached.
  JobSeries& JobFor(const JobKey& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (auto it = jobs_.find(job); it != jobs_.end()) {
      it->second.touched = generation_;
      return it->second;
    }
    auto folded = folded_.find(job);
    if (folded == folded_.end()) {
      uint32_t& held = slots_of_uid_[job.owner_uid];
      // A job named like the overflow label shares it (its series would
      // otherwise be the same label set as its owner's overflow).
      if (held < options_.max_jobs_per_uid && jobs_.size() < kMaxJobs &&
          job.name != kOverflowLabel) {
        ++held;
        JobSeries& s = jobs_[job];
        s.label = job.name;
        s.owner = absl::StrCat(job.owner_uid);
        s.touched = generation_;
        NewSeries();
        return s;
      }
      if (held == 0) slots_of_uid_.erase(job.owner_uid);
      const uint32_t key =
          overflow_.count(job.owner_uid) > 0 || overflow_.size() < kMaxJobs ? job.owner_uid
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
      NewSeries();
    }
    s.touched = generation_;
    return s;
  }

  OpSeries& OpSeriesFor(const GroupSpec& group, const Arrival& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const uint64_t key = (uint64_t{group.id} << 32) | (uint64_t{a.desc.collective} << 16) |
                         (uint64_t{a.desc.dtype} << 8) | (a.phase2 ? 1 : 0);
    auto it = op_cache_.find(key);
    if (it != op_cache_.end()) {
      it->second.job->touched = generation_;
      return it->second.s;
    }
    JobSeries& job = JobFor(JobOf(group));
    const prometheus::Labels labels = OpLabels(job, group, a);
    OpSeries s{&completed_.Add(labels), &bytes_.Add(labels), &duration_.Add(labels, TimeBuckets()),
               &queue_wait_.Add(labels, TimeBuckets()), &engine_wait_.Add(labels, TimeBuckets())};
    job.completed.insert(s.completed);
    job.bytes.insert(s.bytes);
    job.duration.insert(s.duration);
    job.queue_wait.insert(s.queue_wait);
    job.engine_wait.insert(s.engine_wait);
    if (op_cache_.size() >= kMaxCached) op_cache_.clear();
    return op_cache_.emplace(key, CachedOp{s, &job}).first->second.s;
  }

  NodeOpSeries& NodeSeriesFor(const GroupSpec& group, const Arrival& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string_view kind = GroupKind(group, a);
    const uint32_t key = (uint32_t{a.desc.collective} << 16) | (uint32_t{a.desc.dtype} << 8) |
                         KindIndex(kind);
    auto it = node_cache_.find(key);
    if (it != node_cache_.end()) return it->second;
    const prometheus::Labels labels = {{"group", std::string(kind)},
                                       {"op", std::string(OpName(a))},
                                       {"dtype", std::string(DtypeName(a))}};
    NodeOpSeries s{&node_completed_.Add(labels), &node_bytes_.Add(labels),
                   &node_duration_.Add({{"op", std::string(OpName(a))}}, TimeBuckets())};
    return node_cache_.emplace(key, s).first->second;
  }

  // Null for jobs without series of their own (overflow): their ranks are
  // different jobs' ranks.
  RankSeries* RankSeriesFor(const GroupSpec& group, const Arrival& a)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const int global_rank = GlobalRank(a);
    const uint64_t key = (uint64_t{group.id} << 32) | static_cast<uint32_t>(global_rank);
    auto it = rank_cache_.find(key);
    if (it != rank_cache_.end()) {
      it->second.job->touched = generation_;
      it->second.s->touched = generation_;
      return it->second.s;
    }
    JobSeries& job = JobFor(JobOf(group));
    if (job.overflow) return nullptr;
    int rank = global_rank;
    if (job.ranks.count(rank) == 0 &&
        (job.ranks.size() >= kMaxRanksPerJob || rank_series_ >= kMaxRankSeries)) {
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
      NewSeries();
    }
    s.touched = generation_;
    if (rank_cache_.size() >= kMaxCached) rank_cache_.clear();
    rank_cache_.emplace(key, CachedRank{&s, &job});
    return &s;
  }

  void RemoveRank(RankSeries& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    arrival_lag_.Remove(s.lag);
    waited_for_.Remove(s.waited);
    last_arrivals_.Remove(s.last);
    --rank_series_;
  }

  void RemoveJob(JobSeries& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (Counter* c : job.completed) completed_.Remove(c);
    for (Counter* c : job.bytes) bytes_.Remove(c);
    for (Counter* c : job.failed) failed_.Remove(c);
    for (Histogram* h : job.duration) duration_.Remove(h);
    for (Histogram* h : job.queue_wait) queue_wait_.Remove(h);
    for (Histogram* h : job.engine_wait) engine_wait_.Remove(h);
    for (auto& [rank, s] : job.ranks) RemoveRank(s);
    job.ranks.clear();
  }

  // A new series set was made: the sweeper drops what is no longer attached.
  void NewSeries() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::MutexLock l(&sweep_mu_);
    sweep_wanted_ = true;
  }

  uint64_t NextGeneration() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return ++generation_;
  }

  // Drops the series of jobs and ranks not in `g` (what is attached, read
  // after `generation` began) and not used since: a job or rank that
  // attached after `g` was read has used its series in this generation.
  void Retire(const NodeGauges& g, uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_) {
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
        const bool rank_attached =
            attached != live.end() && attached->second.count(r->first) > 0;
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
                        gone.count(it->second.job) > 0 ||
                        gone_ranks.count(it->second.s) > 0;
      if (drop) {
        rank_cache_.erase(it++);
      } else {
        ++it;
      }
    }
  }

  void Sweep() ABSL_LOCKS_EXCLUDED(mu_) {
    const uint64_t generation = NextGeneration();
    const NodeGauges g = node_->Read();
    Retire(g, generation);
  }

  bool SweepWantedOrStopped() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(sweep_mu_) {
    return sweep_wanted_ || stop_;
  }

  // While series are being made, sweeps at most every kSweepInterval.
  void SweepLoop() {
    absl::MutexLock l(&sweep_mu_);
    for (;;) {
      sweep_mu_.Await(absl::Condition(this, &Impl::SweepWantedOrStopped));
      if (stop_) return;
      sweep_wanted_ = false;
      sweep_mu_.Unlock();
      Sweep();
      sweep_mu_.Lock();
      sweep_mu_.AwaitWithTimeout(absl::Condition(&stop_), kSweepInterval);
    }
  }

  const MetricsOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;       // per job
  std::shared_ptr<prometheus::Registry> node_registry_;  // node totals
  Family<Counter>& completed_;
  Family<Counter>& failed_;
  Family<Counter>& bytes_;
  Family<Histogram>& duration_;
  Family<Histogram>& queue_wait_;
  Family<Histogram>& engine_wait_;
  Family<Histogram>& arrival_lag_;
  Family<Counter>& waited_for_;
  Family<Counter>& last_arrivals_;
  Family<Counter>& node_completed_;
  Family<Counter>& node_failed_;
  Family<Counter>& node_bytes_;
  Family<Histogram>& node_duration_;
  Counter& busy_;
  const std::shared_ptr<NodeCollectable> node_;

  absl::Mutex mu_;  // before sweep_mu_
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, CachedOp> op_cache_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, CachedRank> rank_cache_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, NodeOpSeries> node_cache_ ABSL_GUARDED_BY(mu_);
  std::map<JobKey, JobSeries> jobs_ ABSL_GUARDED_BY(mu_);          // own slots
  std::map<uint32_t, JobSeries> overflow_ ABSL_GUARDED_BY(mu_);    // by owner uid
  std::map<JobKey, Folded> folded_ ABSL_GUARDED_BY(mu_);           // jobs in an overflow
  std::map<uint32_t, uint32_t> slots_of_uid_ ABSL_GUARDED_BY(mu_);  // own slots per owner
  size_t rank_series_ ABSL_GUARDED_BY(mu_) = 0;

  absl::Mutex sweep_mu_;
  bool sweep_wanted_ ABSL_GUARDED_BY(sweep_mu_) = false;
  bool stop_ ABSL_GUARDED_BY(sweep_mu_) = false;
  std::thread sweeper_;

  std::unique_ptr<prometheus::Exposer> exposer_;  // last: destroyed first
};

bool Metrics::Available() { return true; }

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(NodeGaugeSource gauges,
                                                         MetricsOptions options) {
  if (options.max_jobs_per_uid == 0) {
    return absl::InvalidArgumentError("metrics.max_jobs_per_uid: must be at least 1");
  }
  return std::unique_ptr<Metrics>(
      new Metrics(std::make_unique<Impl>(std::move(gauges), std::move(options))));
}

absl::Status Metrics::Serve(const std::string& listen) { return impl_->Serve(listen, &address_); }

void Metrics::StopServing() { impl_->StopServing(); }

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

bool Metrics::job_series() const { return impl_->job_series(); }

std::string Metrics::Text() const { return impl_->Text(); }

MetricsHeld Metrics::Held() const { return impl_->Held(); }

void Metrics::OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals) {
  impl_->OnMatched(group, arrivals);
}

void Metrics::OnCompleted(const GroupSpec& group, const std::vector<Arrival>& arrivals,
                          const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns) {
  impl_->OnCompleted(group, arrivals, status, queued_ns, exec_ns);
}

}  // namespace hsdp
