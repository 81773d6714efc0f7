// The key/value store's rules (kv_limits.h), which both stores apply.
#include "daemon/cluster/kv_limits.h"

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

TEST(KvLimitsTest, KeysValuesAndKeyCountsAreBounded) {
  KvLimits limits;
  limits.max_key_bytes = 4;
  limits.max_value_bytes = 3;
  limits.max_wait_keys = 2;
  EXPECT_TRUE(CheckKvKey(limits, "abcd").ok());
  EXPECT_EQ(CheckKvKey(limits, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckKvKey(limits, "abcde").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckKvValue(limits, "xyz").ok());
  EXPECT_EQ(CheckKvValue(limits, "wxyz").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(CheckKvKeyCount(limits, 2, "deleting").ok());
  const absl::Status many = CheckKvKeyCount(limits, 3, "deleting");
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(many.message(), "deleting 3 keys; the limit is 2");
  EXPECT_EQ(CheckBarrierCount(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckBarrierCount(1).ok());
  EXPECT_EQ(KvKeysFullError(limits).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(KvWaitersFullError(limits).code(), absl::StatusCode::kResourceExhausted);
}

TEST(KvLimitsTest, DeadlinesAreCappedAtMaxWait) {
  KvLimits limits;
  limits.max_wait = absl::Seconds(10);
  const absl::Time soon = absl::Now() + absl::Seconds(1);
  EXPECT_EQ(CapKvDeadline(limits, soon), soon);
  const absl::Time capped = CapKvDeadline(limits, absl::InfiniteFuture());
  EXPECT_LE(capped, absl::Now() + absl::Seconds(10));
  EXPECT_GT(capped, absl::Now() + absl::Seconds(5));
}

TEST(KvLimitsTest, CountersParseOrFailAndNeverOverflow) {
  EXPECT_EQ(*KvCounterSum("c", nullptr, -5), -5);
  const std::string forty_one = "41";
  EXPECT_EQ(*KvCounterSum("c", &forty_one, 1), 42);
  const std::string text = "x";
  absl::StatusOr<int64_t> bad = KvCounterSum("c", &text, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "key \"c\" does not hold an integer counter");
  const std::string max = absl::StrCat(INT64_MAX);
  EXPECT_EQ(KvCounterSum("c", &max, 1).status().code(), absl::StatusCode::kInvalidArgument);
  // A long key is quoted up to 128 bytes in messages.
  const std::string long_key(1000, 'k');
  EXPECT_LT(KvCounterSum(long_key, &text, 1).status().message().size(), 200u);
}

}  // namespace
}  // namespace hsdp
