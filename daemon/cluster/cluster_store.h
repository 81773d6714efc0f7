// The cluster's shared key/value store, as the daemon's users of it see it
// (placement, group epochs, the Gloo rendezvous, the NCCL unique-id
// exchange): one interface, two stores behind it (cluster.store):
//   embedded  the coordinator's KvStore, reached over the Cluster service
//             (ClusterClient);
//   etcd      keys under the cluster's prefix in etcd (EtcdStore).
// Both apply the same limits (KvLimits: key and value sizes, keys in one
// wait, the longest wait) and answer with the same status codes:
// INVALID_ARGUMENT for a bad key or a non-integer Add, NOT_FOUND for a Get of
// an absent key, RESOURCE_EXHAUSTED beyond a limit, DEADLINE_EXCEEDED when a
// wait runs out, UNAVAILABLE when the store cannot be reached. Messages name
// the store (name()).
//
// Thread-safe; every call blocks up to its timeout.
#ifndef HSDP_DAEMON_CLUSTER_CLUSTER_STORE_H_
#define HSDP_DAEMON_CLUSTER_CLUSTER_STORE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hsdp {

class ClusterStore {
 public:
  virtual ~ClusterStore() = default;

  // "the cluster coordinator HOST:PORT" or "etcd (ep1,ep2)": for messages.
  virtual std::string name() const = 0;

  virtual absl::Status Set(const std::string& key, const std::string& value,
                           absl::Duration timeout) = 0;
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
  // Adds `delta` to the decimal integer at `key` (absent = 0); returns the sum.
  virtual absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta,
                                      absl::Duration timeout) = 0;
  // Waits up to `timeout` for every key (DEADLINE_EXCEEDED after it).
  virtual absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // Waits like Wait and returns the values, by key.
  virtual absl::StatusOr<std::vector<std::string>> WaitValues(const std::vector<std::string>& keys,
                                                              absl::Duration timeout) = 0;
  // Stores `value` unless `key` exists; returns the value stored now.
  virtual absl::StatusOr<std::string> SetIfAbsent(const std::string& key, const std::string& value,
                                                  absl::Duration timeout) = 0;
  // Removes the keys that exist.
  virtual absl::Status Delete(const std::vector<std::string>& keys, absl::Duration timeout) = 0;
  // OK for all once `count` callers wait on `name`; then the barrier resets.
  virtual absl::Status Barrier(const std::string& name, uint32_t count,
                               absl::Duration timeout) = 0;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_CLUSTER_STORE_H_
