#include "daemon/cluster/kv_limits.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace hsdp {
namespace {

// Keys are quoted in messages up to this many bytes.
std::string Quoted(const std::string& key) { return absl::StrCat("\"", key.substr(0, 128), "\""); }

}  // namespace

absl::Status CheckKvKey(const KvLimits& limits, const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("empty key");
  if (key.size() > limits.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "key of ", key.size(), " bytes is longer than the limit of ", limits.max_key_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckKvValue(const KvLimits& limits, const std::string& value) {
  if (value.size() > limits.max_value_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("value of ", value.size(),
                                                     " bytes exceeds the limit of ",
                                                     limits.max_value_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckKvKeyCount(const KvLimits& limits, size_t keys, const char* verb) {
  if (keys > limits.max_wait_keys) {
    return absl::InvalidArgumentError(
        absl::StrCat(verb, " ", keys, " keys; the limit is ", limits.max_wait_keys));
  }
  return absl::OkStatus();
}

absl::Status CheckBarrierCount(uint32_t count) {
  if (count == 0) return absl::InvalidArgumentError("barrier count must be at least 1");
  return absl::OkStatus();
}

absl::Status KvKeysFullError(const KvLimits& limits) {
  return absl::ResourceExhaustedError(
      absl::StrCat("the key/value store is full (", limits.max_keys, " keys)"));
}

absl::Status KvWaitersFullError(const KvLimits& limits) {
  return absl::ResourceExhaustedError(
      absl::StrCat("too many pending waits and barriers (limit ", limits.max_waiters, ")"));
}

absl::Time CapKvDeadline(const KvLimits& limits, absl::Time deadline) {
  return std::min(deadline, absl::Now() + limits.max_wait);
}

absl::StatusOr<int64_t> KvCounterSum(const std::string& key, const std::string* current,
                                     int64_t delta) {
  int64_t value = 0;
  if (current != nullptr && !absl::SimpleAtoi(*current, &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("key ", Quoted(key), " does not hold an integer counter"));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return absl::InvalidArgumentError(absl::StrCat("counter ", Quoted(key), " would overflow"));
  }
  return sum;
}

}  // namespace hsdp
