// The CPU cost of observing one operation (two members: two arrivals, the
// match, the launch, the completion), measured straight on the hooks so that
// the figure does not drown in a shared machine's noise: with observability
// as configured by default (no metrics endpoint, trace not recording), with
// metrics (node totals), with metrics and a recording trace, and with the
// per-job series of a password-protected endpoint. Prints ns per operation
// (docs/benchmarks.md) and fails when one exceeds a generous bound.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "daemon/observability/observability.h"
#include "fake_engine.h"
#include "gtest/gtest.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

constexpr int kOps = 100000;
constexpr int kRepeats = 5;

class ObserverCostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_.id = 1;
    spec_.job_id = "cost-job-with-a-long-name";
    spec_.ranks = {0, 1};
    spec_.key = GroupKey(JobKey{spec_.owner_uid, spec_.job_id}, spec_.ranks, 0);
    for (int r = 0; r < 2; ++r) {
      Arrival a;
      a.session = testing::MakeSession(10 + r, r, 2);
      a.desc.op_id = 1;
      a.desc.collective = static_cast<uint8_t>(Collective::kAllReduce);
      a.desc.dtype = static_cast<uint8_t>(DataType::kFloat32);
      a.desc.count = 1024;
      a.epoch = 1;
      matched_[r] = a;
      completed_.push_back(a);
    }
  }

  // Best of kRepeats: ns per observed operation.
  double NsPerOp(OpObserver* obs) {
    double best = 1e18;
    for (int rep = 0; rep < kRepeats; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kOps; ++i) {
        const uint64_t seq = static_cast<uint64_t>(rep) * kOps + i + 1;
        for (int r = 0; r < 2; ++r) {
          Arrival& a = matched_[r];
          a.seq = seq;
          a.arrived_ns = shm::NowNanos();  // the group takes this timestamp anyway
          if (obs != nullptr) obs->OnArrival(spec_, a);
        }
        if (obs != nullptr) {
          obs->OnMatched(spec_, matched_);
          obs->OnLaunched(spec_, matched_[0], seq);
          completed_[0].seq = completed_[1].seq = seq;
          obs->OnCompleted(spec_, completed_, absl::OkStatus(), 1000, 2000);
        }
      }
      const auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / kOps);
    }
    return best;
  }

  GroupSpec spec_;
  std::map<int, Arrival> matched_;
  std::vector<Arrival> completed_;
};

TEST_F(ObserverCostTest, PerOperationCost) {
  const double none = NsPerOp(nullptr);
  auto off = Observability::Create(ObservabilityOptions{"", 65536}, nullptr);
  ASSERT_TRUE(off.ok());
  const double base = NsPerOp(off->get()) - none;
  std::printf("observer cost per 2-member operation, ns (best of %d x %d ops):\n", kRepeats, kOps);
  std::printf("  default (no metrics, trace idle): %8.1f\n", base);
  EXPECT_LT(base, 2000);
  if (!Metrics::Available()) GTEST_SKIP() << "built without prometheus-cpp";
  auto on = Observability::Create(ObservabilityOptions{"127.0.0.1:0", 65536}, nullptr);
  ASSERT_TRUE(on.ok());
  const double metrics = NsPerOp(on->get()) - none;
  std::printf("  metrics:                          %8.1f\n", metrics);
  ASSERT_TRUE((*on)->trace().Arm(shm::NowNanos(), 3600'000'000'000));
  const double both = NsPerOp(on->get()) - none;
  std::printf("  metrics + trace recording:        %8.1f\n", both);
  EXPECT_LT(metrics, 4000);
  EXPECT_LT(both, 6000);
  // With a password the per-job and per-rank series are kept as well.
  char path[] = "/tmp/hsdp-cost-password-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string password = "0123456789abcdef0123456789abcdef";
  ASSERT_EQ(::write(fd, password.data(), password.size()), static_cast<ssize_t>(password.size()));
  ::close(fd);
  ObservabilityOptions with_jobs("127.0.0.1:0", 65536);
  with_jobs.metrics_password_file = path;
  auto jobs = Observability::Create(with_jobs, nullptr);
  ::unlink(path);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  const double per_job = NsPerOp(jobs->get()) - none;
  std::printf("  metrics with per-job series:      %8.1f\n", per_job);
}

}  // namespace
}  // namespace hsdp
