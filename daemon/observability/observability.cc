#include "daemon/observability/observability.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "absl/container/inlined_vector.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "daemon/observability/op_labels.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

TraceEvent EventOf(TraceEventKind kind, const GroupSpec& group, const Arrival& a, int64_t ts) {
  TraceEvent e;
  e.ts_ns = ts;
  e.kind = kind;
  e.session_id = a.session != nullptr ? a.session->id() : 0;
  e.op_id = a.desc.op_id;
  e.seq = a.seq;
  e.epoch = a.epoch;
  e.group_id = group.id;
  e.rank = GlobalRank(a);
  e.collective = a.desc.collective;
  e.dtype = a.desc.dtype;
  e.phase2 = a.phase2;
  e.bytes = OpBytes(group, a);
  return e;
}

}  // namespace

absl::StatusOr<std::string> ReadMetricsPassword(const std::string& path) {
  constexpr size_t kMaxBytes = 4096;
  constexpr size_t kMinChars = 16;
  const auto refuse = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat("metrics.password_file \"", path, "\": ", why));
  };
  // O_NONBLOCK: a FIFO must not hold up the start; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    const std::string what = absl::StrCat("metrics.password_file \"", path,
                                          "\": cannot open: ", std::strerror(err));
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(what);
    if (err == ENOENT) return absl::NotFoundError(what);
    return absl::FailedPreconditionError(what);
  }
  struct stat st;
  absl::Status bad;
  if (::fstat(fd, &st) != 0) {
    bad = refuse(absl::StrCat("cannot stat: ", std::strerror(errno)));
  } else if (!S_ISREG(st.st_mode)) {
    bad = refuse("not a regular file");
  } else if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
    bad = refuse(absl::StrCat("owned by uid ", st.st_uid, ", not by root or hsdpd's uid ",
                              ::geteuid(), " (anyone who can replace it can read metrics)"));
  } else if ((st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    bad = refuse(absl::StrCat("mode ", mode,
                              " lets group or others use it; chmod 0600 (or 0400) it"));
  } else if (static_cast<uint64_t>(st.st_size) > kMaxBytes) {
    bad = refuse(absl::StrCat("larger than ", kMaxBytes, " bytes"));
  }
  std::string text;
  if (bad.ok()) {
    char buffer[1024];
    for (;;) {
      const ssize_t n = ::read(fd, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        bad = refuse(absl::StrCat("cannot read: ", std::strerror(errno)));
        break;
      }
      if (n == 0) break;
      text.append(buffer, static_cast<size_t>(n));
      if (text.size() > kMaxBytes) {
        bad = refuse(absl::StrCat("larger than ", kMaxBytes, " bytes"));
        break;
      }
    }
  }
  ::close(fd);
  if (!bad.ok()) return bad;
  std::string password(absl::StripAsciiWhitespace(text));
  if (password.size() < kMinChars) {
    return refuse(absl::StrCat("the password has ", password.size(), " characters; use at least ",
                               kMinChars, " random ones (e.g. `openssl rand -hex 32`)"));
  }
  return password;
}

absl::StatusOr<std::unique_ptr<Observability>> Observability::Create(
    const ObservabilityOptions& options, NodeGaugeSource gauges) {
  std::unique_ptr<Metrics> metrics;
  if (!options.metrics_listen.empty()) {
    MetricsOptions m_options;
    m_options.username = options.metrics_username;
    m_options.max_jobs_per_uid = options.metrics_max_jobs_per_uid;
    if (!options.metrics_password_file.empty()) {
      absl::StatusOr<std::string> password = ReadMetricsPassword(options.metrics_password_file);
      if (!password.ok()) return password.status();
      m_options.password = std::move(*password);
    }
    absl::StatusOr<std::unique_ptr<Metrics>> m =
        Metrics::Create(std::move(gauges), std::move(m_options));
    if (!m.ok()) return m.status();
    metrics = std::move(*m);
  }
  return std::unique_ptr<Observability>(new Observability(options, std::move(metrics)));
}

Observability::Observability(const ObservabilityOptions& options, std::unique_ptr<Metrics> metrics)
    : metrics_listen_(options.metrics_listen),
      metrics_(std::move(metrics)),
      trace_(options.trace_events) {}

absl::Status Observability::ServeMetrics() {
  if (metrics_ == nullptr) return absl::OkStatus();
  return metrics_->Serve(metrics_listen_);
}

void Observability::StopMetrics() {
  if (metrics_ != nullptr) metrics_->StopServing();
}

std::string Observability::metrics_address() const {
  return metrics_ != nullptr ? metrics_->address() : "";
}

void Observability::OnArrival(const GroupSpec& group, const Arrival& a) {
  if (!trace_.Recording(a.arrived_ns)) return;
  const TraceEvent e = EventOf(TraceEventKind::kArrival, group, a, a.arrived_ns);
  trace_.AppendForGroup({&e, 1}, group.id, group.job_id, group.owner_uid,
                        static_cast<int>(group.ranks.size()));
}

void Observability::OnMatched(const GroupSpec& group, const std::map<int, Arrival>& arrivals) {
  if (arrivals.empty()) return;
  const Arrival* last = nullptr;
  int64_t last_ns = INT64_MIN, second_ns = INT64_MIN;
  for (const auto& [li, a] : arrivals) {
    if (a.arrived_ns > last_ns) {
      second_ns = last_ns;
      last_ns = a.arrived_ns;
      last = &a;
    } else if (a.arrived_ns > second_ns) {
      second_ns = a.arrived_ns;
    }
  }
  const int64_t waited = arrivals.size() >= 2 ? last_ns - second_ns : -1;
  StragglerEvent ev;
  ev.mono_ns = last_ns;
  ev.group_id = group.id;
  ev.op = OpName(*last);
  ev.seq = last->seq;
  ev.epoch = last->epoch;
  stragglers_.Record(group.job_id, group.owner_uid, GlobalRank(*last), waited, ev);
  if (metrics_ != nullptr) metrics_->OnMatched(group, arrivals);
  if (trace_.MaybeRecording() && trace_.Recording(last_ns)) {
    TraceEvent e = EventOf(TraceEventKind::kMatched, group, *last, last_ns);
    e.value_ns = std::max<int64_t>(0, waited);
    trace_.Append({&e, 1});
  }
}

void Observability::OnLaunched(const GroupSpec& group, const Arrival& any, uint64_t ticket) {
  if (!trace_.MaybeRecording()) return;
  const int64_t now = shm::NowNanos();
  if (!trace_.Recording(now)) return;
  TraceEvent e = EventOf(TraceEventKind::kLaunched, group, any, now);
  e.ticket = ticket;
  trace_.Append({&e, 1});
}

void Observability::OnCompleted(const GroupSpec& group, const std::vector<Arrival>& arrivals,
                                const absl::Status& status, uint64_t queued_ns, uint64_t exec_ns) {
  if (arrivals.empty()) return;
  const Arrival& a = arrivals.front();
  {
    absl::MutexLock l(&mu_);
    const JobKey key{group.owner_uid, group.job_id};
    auto it = jobs_.find(key);
    if (it == jobs_.end()) {
      if (jobs_.size() >= kMaxJobs) {
        // Forget the job with the fewest operations (a crude but bounded rule).
        auto victim =
            std::min_element(jobs_.begin(), jobs_.end(), [](const auto& x, const auto& y) {
              return x.second.ops_completed + x.second.ops_failed <
                     y.second.ops_completed + y.second.ops_failed;
            });
        jobs_.erase(victim);
      }
      it = jobs_.emplace(key, JobActivity{}).first;
      it->second.job_id = group.job_id;
      it->second.uid = group.owner_uid;
    }
    JobActivity& j = it->second;
    if (status.ok()) {
      ++j.ops_completed;
      j.bytes += OpBytes(group, a);
    } else {
      ++j.ops_failed;
    }
    j.busy_ns += exec_ns;
    if (status.ok() && exec_ns > 0 && a.first_ns > 0) {
      // Whole life minus matching and hand-off minus running: the engine's
      // queueing delay (what fair share and priority classes change).
      const int64_t total = shm::NowNanos() - a.first_ns;
      const int64_t waited = total - static_cast<int64_t>(queued_ns + exec_ns);
      if (waited > 0) j.engine_wait_ns += static_cast<uint64_t>(waited);
    }
  }
  if (metrics_ != nullptr) metrics_->OnCompleted(group, arrivals, status, queued_ns, exec_ns);
  if (!trace_.MaybeRecording()) return;
  const int64_t now = shm::NowNanos();
  if (!trace_.Recording(now)) return;
  absl::InlinedVector<TraceEvent, 8> events;
  for (const Arrival& m : arrivals) {
    TraceEvent e = EventOf(TraceEventKind::kCompleted, group, m, now);
    e.status_code = static_cast<int32_t>(status.code());
    e.value_ns = static_cast<int64_t>(exec_ns);
    events.push_back(e);
  }
  trace_.AppendForGroup({events.data(), events.size()}, group.id, group.job_id, group.owner_uid,
                        static_cast<int>(group.ranks.size()));
}

std::vector<JobActivity> Observability::Activity(std::optional<uint32_t> only_uid) const {
  std::vector<JobActivity> out;
  absl::MutexLock l(&mu_);
  for (const auto& [key, j] : jobs_) {
    if (!only_uid.has_value() || j.uid == *only_uid) out.push_back(j);
  }
  std::sort(out.begin(), out.end(), [](const JobActivity& x, const JobActivity& y) {
    return std::tie(x.job_id, x.uid) < std::tie(y.job_id, y.uid);
  });
  return out;
}

}  // namespace hsdp
