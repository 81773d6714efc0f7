// Rate-limited logging (HSDP_LOG_EVERY_N_SEC) and SummarizeList.
#include "hsdp/common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Captures what `body` writes to stderr.
template <typename F>
std::string CaptureStderr(F body) {
  std::fflush(stderr);
  char path[] = "/tmp/hsdp-logtest.XXXXXX";
  const int file = ::mkstemp(path);
  ::unlink(path);
  const int saved = ::dup(STDERR_FILENO);
  ::dup2(file, STDERR_FILENO);
  body();
  ::dup2(saved, STDERR_FILENO);
  ::close(saved);
  std::string out;
  char buf[4096];
  ssize_t n;
  ::lseek(file, 0, SEEK_SET);
  while ((n = ::read(file, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(file);
  return out;
}

int CountLines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

void LogFromOneSite(int i) { HSDP_LOG_EVERY_N_SEC(Warning, 0.3) << "bad connection " << i; }

// The rate limiters' time while a FakeLogClock lives (they start at 1 s).
std::atomic<int64_t> g_fake_now_ns{0};
int64_t FakeNow() { return g_fake_now_ns.load(); }

class FakeLogClock {
 public:
  FakeLogClock() : previous_(internal::SetLogClockForTesting(&FakeNow)) {
    g_fake_now_ns.store(1'000'000'000);
  }
  ~FakeLogClock() { internal::SetLogClockForTesting(previous_); }
  void Advance(int64_t ns) { g_fake_now_ns.fetch_add(ns); }

 private:
  internal::LogClockFn previous_;
};

TEST(LogEveryNSecTest, OneLinePerPeriodThenCountsTheSuppressed) {
  FakeLogClock clock;
  int evaluated = 0;
  auto count = [&] { return ++evaluated; };
  const std::string first = CaptureStderr([&] {
    for (int i = 0; i < 1000; ++i) {
      LogFromOneSite(i);
      HSDP_LOG_EVERY_N_SEC(Warning, 60) << "other site " << count();
    }
  });
  EXPECT_EQ(CountLines(first), 2) << first;
  EXPECT_THAT(first, HasSubstr("bad connection 0"));
  EXPECT_THAT(first, Not(HasSubstr("suppressed")));
  EXPECT_EQ(evaluated, 1) << "operands of dropped lines must not be evaluated";

  // Not one nanosecond early; then exactly when the period is over.
  clock.Advance(300'000'000 - 1);
  EXPECT_EQ(CaptureStderr([] { LogFromOneSite(1000); }), "");
  clock.Advance(1);
  const std::string second = CaptureStderr([] { LogFromOneSite(1001); });
  EXPECT_EQ(CountLines(second), 1) << second;
  EXPECT_THAT(second, HasSubstr("bad connection 1001 [1000 similar messages suppressed]"));
}

TEST(LogRateLimiterTest, OnePerPeriodAtTheTimesGiven) {
  internal::LogRateLimiter limiter;
  uint64_t suppressed = 7;
  EXPECT_TRUE(limiter.AllowAt(1'000'000'000, 0.5, &suppressed));
  EXPECT_EQ(suppressed, 0u);
  EXPECT_FALSE(limiter.AllowAt(1'499'999'999, 0.5, &suppressed));
  EXPECT_FALSE(limiter.AllowAt(1'499'999'999, 0.5, &suppressed));
  EXPECT_TRUE(limiter.AllowAt(1'500'000'000, 0.5, &suppressed));
  EXPECT_EQ(suppressed, 2u);
  EXPECT_TRUE(limiter.AllowAt(2'000'000'000, 0, &suppressed));
  EXPECT_TRUE(limiter.AllowAt(2'000'000'000, 0, &suppressed)) << "a period of 0 never holds back";
  EXPECT_TRUE(limiter.AllowAt(2'000'000'000, -1, &suppressed));
  EXPECT_EQ(suppressed, 0u);
}

TEST(LogRateLimiterTest, TheClockIsSetAndRestored) {
  const internal::LogClockFn real = internal::SetLogClockForTesting(&FakeNow);
  g_fake_now_ns.store(42);
  EXPECT_EQ(internal::LogClockNanos(), 42);
  EXPECT_EQ(internal::SetLogClockForTesting(real), &FakeNow);
  EXPECT_GT(internal::LogClockNanos(), 42);  // CLOCK_MONOTONIC: the machine's uptime
}

TEST(LogEveryNSecTest, BelowTheLevelLogsAndCountsNothing) {
  const LogLevel old = GetLogLevel();
  SetLogLevel(LogLevel::kError);
  const std::string out = CaptureStderr([] { HSDP_LOG_EVERY_N_SEC(Warning, 0) << "hidden"; });
  SetLogLevel(old);
  EXPECT_EQ(out, "");
}

TEST(LogEveryNSecTest, SafeInUnbracedIfElse) {
  const std::string out = CaptureStderr([] {
    for (int i = 0; i < 2; ++i) {
      if (i == 0)
        HSDP_LOG_EVERY_N_SEC(Info, 60) << "then";
      else
        HSDP_LOG(Info) << "else";
    }
  });
  EXPECT_THAT(out, HasSubstr("then"));
  EXPECT_THAT(out, HasSubstr("else"));
}

TEST(SummarizeListTest, ShortListsWholeLongListsCut) {
  EXPECT_EQ(SummarizeList({}, 3), "[]");
  EXPECT_EQ(SummarizeList({4, 5}, 3), "[4, 5]");
  EXPECT_EQ(SummarizeList({1, 2, 3}, 3), "[1, 2, 3]");
  std::vector<int> big(1048576);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int>(i);
  EXPECT_EQ(SummarizeList(big, 3), "[0, 1, 2, ... (1048573 more)]");
  EXPECT_EQ(SummarizeList({7, 8}, 0), "[... (2 more)]");
}

}  // namespace
}  // namespace hsdp
