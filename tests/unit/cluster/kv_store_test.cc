// KvStore: set/get/add, waits completed by sets, deadlines, barriers, and
// every limit answering RESOURCE_EXHAUSTED.
#include "daemon/cluster/kv_store.h"

#include "absl/synchronization/notification.h"

#include <atomic>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;

// A Done that fulfils a future.
struct Result {
  std::shared_ptr<std::promise<absl::Status>> promise = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> future = promise->get_future();
  KvStore::Done done() {
    auto p = promise;
    return [p](absl::Status s) { p->set_value(s); };
  }
  absl::Status Get() {
    EXPECT_EQ(future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
    return future.get();
  }
  bool Ready() { return future.wait_for(std::chrono::milliseconds(0)) == std::future_status::ready; }
};

TEST(KvStoreTest, SetGetAdd) {
  KvStore kv;
  EXPECT_EQ(kv.Get("a").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(kv.Set("a", "1").ok());
  EXPECT_EQ(*kv.Get("a"), "1");
  EXPECT_EQ(*kv.Add("a", 41), 42);
  EXPECT_EQ(*kv.Add("n", -3), -3);
  EXPECT_EQ(*kv.Get("a"), "42");
  ASSERT_TRUE(kv.Set("s", "text").ok());
  EXPECT_EQ(kv.Add("s", 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Set("", "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStoreTest, WaitCompletesOnSetAndTimesOut) {
  KvStore kv;
  Result r;
  kv.Wait({"x", "y"}, absl::Now() + absl::Seconds(5), r.done());
  ASSERT_TRUE(kv.Set("x", "1").ok());
  EXPECT_FALSE(r.Ready());
  ASSERT_TRUE(kv.Set("y", "2").ok());
  EXPECT_TRUE(r.Get().ok());

  Result present;
  kv.Wait({"x"}, absl::Now() + absl::Seconds(5), present.done());
  EXPECT_TRUE(present.Ready());

  Result late;
  const absl::Time start = absl::Now();
  kv.Wait({"never"}, absl::Now() + absl::Milliseconds(50), late.done());
  const absl::Status s = late.Get();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("never"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(kv.waiter_count(), 0u);
}

TEST(KvStoreTest, BarrierReleasesAllAndResets) {
  KvStore kv;
  for (int round = 0; round < 2; ++round) {
    Result a, b, c;
    kv.Barrier("b", 3, absl::Now() + absl::Seconds(5), a.done());
    kv.Barrier("b", 3, absl::Now() + absl::Seconds(5), b.done());
    EXPECT_FALSE(a.Ready());
    kv.Barrier("b", 3, absl::Now() + absl::Seconds(5), c.done());
    EXPECT_TRUE(a.Get().ok());
    EXPECT_TRUE(b.Get().ok());
    EXPECT_TRUE(c.Get().ok());
  }
  Result one, wrong;
  kv.Barrier("m", 2, absl::Now() + absl::Milliseconds(100), one.done());
  kv.Barrier("m", 5, absl::Now() + absl::Seconds(5), wrong.done());
  EXPECT_EQ(wrong.Get().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(one.Get().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(KvStoreTest, LimitsAreResourceExhausted) {
  KvLimits limits;
  limits.max_keys = 4;
  limits.max_value_bytes = 16;
  limits.max_total_bytes = 40;
  limits.max_waiters = 2;
  KvStore kv(limits);
  EXPECT_EQ(kv.Set("big", std::string(17, 'x')).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(kv.Set("k1", std::string(16, 'x')).ok());
  ASSERT_TRUE(kv.Set("k2", std::string(16, 'x')).ok());
  EXPECT_EQ(kv.Set("k3", std::string(16, 'x')).code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(kv.Set("k1", "small").ok());  // replacing frees bytes
  ASSERT_TRUE(kv.Set("k3", "x").ok());
  ASSERT_TRUE(kv.Set("k4", "x").ok());
  EXPECT_EQ(kv.Set("k5", "x").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(kv.Add("k6", 1).status().code(), absl::StatusCode::kResourceExhausted);

  Result w1, w2, w3, b;
  kv.Wait({"a"}, absl::Now() + absl::Seconds(5), w1.done());
  kv.Wait({"b"}, absl::Now() + absl::Seconds(5), w2.done());
  kv.Wait({"c"}, absl::Now() + absl::Seconds(5), w3.done());
  kv.Barrier("z", 2, absl::Now() + absl::Seconds(5), b.done());
  EXPECT_EQ(w3.Get().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(b.Get().code(), absl::StatusCode::kResourceExhausted);
  kv.Shutdown();
  EXPECT_EQ(w1.Get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(w2.Get().code(), absl::StatusCode::kUnavailable);
}

TEST(KvStoreTest, ConcurrentAddsAreAtomic) {
  KvStore kv;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) ASSERT_TRUE(kv.Add("c", 1).ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(*kv.Get("c"), "2000");
}


TEST(KvStoreTest, SetIfAbsentKeepsTheFirstWriterAndWakesWaiters) {
  KvStore kv;
  absl::Notification woke;
  kv.Wait({"claim"}, absl::Now() + absl::Seconds(5), [&](absl::Status s) {
    EXPECT_TRUE(s.ok());
    woke.Notify();
  });
  auto first = kv.SetIfAbsent("claim", "node 1");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first, "node 1");
  EXPECT_TRUE(woke.WaitForNotificationWithTimeout(absl::Seconds(5)));
  auto second = kv.SetIfAbsent("claim", "node 2");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(*second, "node 1");
  EXPECT_EQ(*kv.Get("claim"), "node 1");
  EXPECT_EQ(kv.SetIfAbsent("", "x").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(KvStoreTest, DeleteRemovesKeysAndFreesTheirRoom) {
  KvLimits limits;
  limits.max_keys = 2;
  KvStore kv(limits);
  ASSERT_TRUE(kv.Set("a", "1").ok());
  ASSERT_TRUE(kv.Set("b", "2").ok());
  EXPECT_EQ(kv.Set("c", "3").code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(kv.Delete({"a", "never-there"}).ok());
  EXPECT_EQ(kv.Get("a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(kv.Set("c", "3").ok());
  EXPECT_EQ(kv.key_count(), 2u);
  EXPECT_EQ(kv.Delete({""}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv.Delete(std::vector<std::string>(limits.max_wait_keys + 1, "b")).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hsdp
