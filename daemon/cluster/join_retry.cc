#include "daemon/cluster/join_retry.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "daemon/cluster/member_status.h"
#include "hsdp/common/logging.h"

namespace hsdp {
namespace {

double Uniform01() {
  thread_local std::mt19937_64 gen{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, 1.0)(gen);
}

}  // namespace

absl::Duration JoinRetry::Backoff(int attempt, absl::Duration cap, double u) {
  const absl::Duration grown = absl::Milliseconds(200) * (int64_t{1} << std::min(attempt, 10));
  return std::min(grown, cap) * (0.5 + u / 2);
}

absl::Status JoinRetry::Run(const Attempt& attempt) {
  const absl::Time deadline = absl::Now() + options_.join_timeout;
  absl::Status last;
  for (int n = 0;; ++n) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    {
      absl::MutexLock l(&mu_);
      if (cancelled_) return absl::CancelledError("cluster: stopped while joining");
    }
    last = attempt(std::min(left, options_.attempt));
    if (last.ok()) return last;
    {
      absl::MutexLock l(&mu_);
      last_ = last;
    }
    if (PermanentJoinError(last)) {
      const std::string hint =
          last.code() == absl::StatusCode::kPermissionDenied ? options_.permission_hint : "";
      return absl::Status(last.code(), absl::StrCat("cannot join the cluster", options_.where,
                                                    ": ", last.message(), hint));
    }
    if (n % 10 == 0) {
      HSDP_LOG(Info) << "cluster: waiting for " << options_.store << " (" << last.message()
                     << ")";
    }
    absl::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_),
                         std::min(Backoff(n, options_.max_backoff, Uniform01()),
                                  std::max(absl::ZeroDuration(), deadline - absl::Now())));
  }
  {
    absl::MutexLock l(&mu_);
    if (cancelled_) return absl::CancelledError("cluster: stopped while joining");
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "cannot join the cluster: ", options_.store,
      " did not take this node within cluster.join_timeout_ms (",
      absl::ToInt64Milliseconds(options_.join_timeout), " ms); last error: ",
      last.ok() ? "no attempt was made" : last.message()));
}

void JoinRetry::Cancel() {
  absl::MutexLock l(&mu_);
  cancelled_ = true;
}

absl::Status JoinRetry::last() const {
  absl::MutexLock l(&mu_);
  return last_;
}

}  // namespace hsdp
