// JoinRetry: how both memberships join at start (retries with a growing,
// jittered pause; a permanent error at once; Cancel; the deadline naming the
// store and the last error).
#include "daemon/cluster/join_retry.h"

#include <atomic>
#include <thread>

#include "common/wait.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;

JoinRetry::Options Fast(absl::Duration timeout) {
  return {.store = "the coordinator c:1",
          .where = " in etcd (e:1)",
          .permission_hint = " (grant access)",
          .join_timeout = timeout,
          .attempt = absl::Milliseconds(100),
          .max_backoff = absl::Milliseconds(10)};
}

TEST(JoinRetryTest, TransientFailuresAreRetriedUntilAnAttemptSucceeds) {
  JoinRetry retry(Fast(absl::Seconds(30)));
  int attempts = 0;
  const absl::Status s = retry.Run([&](absl::Duration timeout) {
    EXPECT_LE(timeout, absl::Milliseconds(100));  // never longer than one attempt
    return ++attempts < 3 ? absl::UnavailableError("down") : absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(attempts, 3);
  EXPECT_EQ(retry.last().message(), "down");
}

TEST(JoinRetryTest, APermanentErrorEndsAtOnceWithWhereAndTheHint) {
  JoinRetry retry(Fast(absl::Seconds(30)));
  int attempts = 0;
  absl::Status s = retry.Run([&](absl::Duration) {
    ++attempts;
    return absl::PermissionDeniedError("no access");
  });
  EXPECT_EQ(attempts, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "cannot join the cluster in etcd (e:1): no access (grant access)");
  EXPECT_EQ(retry.last().message(), "no access");  // what MemberStatus shows

  // The hint is for PERMISSION_DENIED only.
  s = JoinRetry(Fast(absl::Seconds(30))).Run([](absl::Duration) {
    return absl::AlreadyExistsError("rank 3 held");
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(s.message(), "cannot join the cluster in etcd (e:1): rank 3 held");
}

TEST(JoinRetryTest, TheDeadlineNamesTheStoreAndTheLastError) {
  JoinRetry retry(Fast(absl::Milliseconds(300)));
  const absl::Status s = retry.Run([](absl::Duration) { return absl::UnavailableError("refused"); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("the coordinator c:1 did not take this node within "
                        "cluster.join_timeout_ms (300 ms); last error: refused"));
}

TEST(JoinRetryTest, CancelEndsARunInProgressAndLaterOnes) {
  JoinRetry retry(Fast(absl::Seconds(60)));
  std::atomic<int> attempts{0};
  absl::Status s;
  std::thread t([&] {
    s = retry.Run([&](absl::Duration) {
      attempts.fetch_add(1);
      return absl::UnavailableError("down");
    });
  });
  ASSERT_TRUE(testing::Eventually([&] { return attempts.load() >= 2; }, 10000));
  retry.Cancel();
  t.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(retry.Run([](absl::Duration) { return absl::OkStatus(); }).code(),
            absl::StatusCode::kCancelled);
}

// Both stores pause the same way: from 200 ms, doubling to the cap, jittered
// to half..all of it (before, the coordinator's member paused a fixed
// 200 ms, in lockstep across a crowd of nodes).
TEST(JoinRetryTest, TheBackoffGrowsToItsCapWithJitter) {
  EXPECT_EQ(JoinRetry::Backoff(0, absl::Seconds(5), 0.0), absl::Milliseconds(100));
  EXPECT_EQ(JoinRetry::Backoff(0, absl::Seconds(5), 1.0), absl::Milliseconds(200));
  EXPECT_EQ(JoinRetry::Backoff(2, absl::Seconds(5), 1.0), absl::Milliseconds(800));
  EXPECT_EQ(JoinRetry::Backoff(9, absl::Seconds(5), 1.0), absl::Seconds(5));
  EXPECT_EQ(JoinRetry::Backoff(1000, absl::Seconds(5), 0.0), absl::Milliseconds(2500));
  // The coordinator's cap: 100 to 200 ms at every attempt.
  EXPECT_EQ(JoinRetry::Backoff(7, absl::Milliseconds(200), 0.0), absl::Milliseconds(100));
  EXPECT_EQ(JoinRetry::Backoff(7, absl::Milliseconds(200), 1.0), absl::Milliseconds(200));
}

}  // namespace
}  // namespace hsdp
