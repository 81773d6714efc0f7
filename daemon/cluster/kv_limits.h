// The limits and argument rules of the cluster's key/value store, one
// definition for both stores: the embedded coordinator's (kv_store.h) and
// the one in etcd (etcd/etcd_store.h). Each rule returns the status both
// stores give, with the same code and words.
#ifndef HSDP_DAEMON_CLUSTER_KV_LIMITS_H_
#define HSDP_DAEMON_CLUSTER_KV_LIMITS_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hsdp {

struct KvLimits {
  size_t max_keys = 16384;
  size_t max_key_bytes = 1024;
  size_t max_value_bytes = 1 << 20;
  size_t max_total_bytes = 64 << 20;  // keys + values (the embedded store; etcd has its own quota)
  size_t max_waiters = 1024;          // pending Wait and Barrier calls together
  size_t max_wait_keys = 1024;        // keys in one Wait or Delete
  absl::Duration max_wait = absl::Minutes(10);
};

// INVALID_ARGUMENT for an empty key or one longer than max_key_bytes.
absl::Status CheckKvKey(const KvLimits& limits, const std::string& key);
// RESOURCE_EXHAUSTED for a value longer than max_value_bytes.
absl::Status CheckKvValue(const KvLimits& limits, const std::string& value);
// INVALID_ARGUMENT when one call names more than max_wait_keys keys;
// `verb` says what the call does ("waiting for", "deleting").
absl::Status CheckKvKeyCount(const KvLimits& limits, size_t keys, const char* verb);
// INVALID_ARGUMENT for a barrier of count 0.
absl::Status CheckBarrierCount(uint32_t count);
// The store already holds max_keys keys (RESOURCE_EXHAUSTED).
absl::Status KvKeysFullError(const KvLimits& limits);
// max_waiters waits and barriers are pending (RESOURCE_EXHAUSTED).
absl::Status KvWaitersFullError(const KvLimits& limits);
// A caller's wait ends at `deadline`, and never more than max_wait from now.
absl::Time CapKvDeadline(const KvLimits& limits, absl::Time deadline);
// What Add stores: the decimal integer `current` (null: the key is absent,
// 0) plus `delta`; INVALID_ARGUMENT when `current` is not an integer or the
// sum would overflow.
absl::StatusOr<int64_t> KvCounterSum(const std::string& key, const std::string* current,
                                     int64_t delta);

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_KV_LIMITS_H_
