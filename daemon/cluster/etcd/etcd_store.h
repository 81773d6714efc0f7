// The cluster's key/value store in etcd (cluster.store: etcd): key K lives at
// <prefix>kv/K. Same limits and status codes as the embedded store
// (ClusterStore, KvLimits); the key count is checked before a put creates a
// key (not atomically across nodes: a burst may pass it by a few keys; etcd's
// own quota, --quota-backend-bytes, bounds the bytes).
//
// Keys are written under this node's lease once it has one (SetLease): keys
// a dead node left behind go with its lease. Epoch hints (PutUnleased) are
// cluster state that outlives the node that wrote them.
//
// Wait watches the store's prefix from the revision of its first read, so a
// key set in between is never missed; at most max_waiters waits and barriers
// run at once on one node (RESOURCE_EXHAUSTED beyond, as on the coordinator). Barrier is a counter per name: the
// n-th arrival belongs to generation (n-1)/count and waits until the counter
// reaches the end of its generation; a caller that times out leaves (the
// counter goes back by one) unless its generation completed meanwhile.
//
// Thread-safe.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_STORE_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_STORE_H_

#include <atomic>
#include <string>
#include <vector>

#include "daemon/cluster/cluster_store.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/kv_store.h"

namespace hsdp {

class EtcdStore : public ClusterStore {
 public:
  // `etcd` must outlive the store; `prefix` is cluster.etcd.prefix (ends
  // with '/').
  EtcdStore(etcd::EtcdClient* etcd, std::string prefix, KvLimits limits = {});

  // The lease later puts attach to (0 = none).
  void SetLease(int64_t lease) { lease_.store(lease); }
  // Stores without a lease (survives this node).
  absl::Status PutUnleased(const std::string& key, const std::string& value,
                           absl::Duration timeout);
  // Waits and barriers in progress on this node.
  size_t waiter_count() const { return waiters_.load(); }
  // Of those, the waits (Wait, WaitValues) watching now: they read the keys
  // and wait for them on a watch (a key set now reaches them through it).
  size_t watching_count() const { return watching_.load(); }
  // Where key K lives in etcd.
  std::string EtcdKey(const std::string& key) const { return kv_prefix_ + key; }

  std::string name() const override;
  absl::Status Set(const std::string& key, const std::string& value,
                   absl::Duration timeout) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta,
                              absl::Duration timeout) override;
  absl::Status Wait(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::StatusOr<std::vector<std::string>> WaitValues(const std::vector<std::string>& keys,
                                                      absl::Duration timeout) override;
  absl::StatusOr<std::string> SetIfAbsent(const std::string& key, const std::string& value,
                                          absl::Duration timeout) override;
  absl::Status Delete(const std::vector<std::string>& keys, absl::Duration timeout) override;
  absl::Status Barrier(const std::string& name, uint32_t count, absl::Duration timeout) override;

 private:
  absl::Status CheckKey(const std::string& key) const;
  absl::Status CheckValue(const std::string& value) const;
  // RESOURCE_EXHAUSTED when the store holds max_keys keys already.
  absl::Status CheckRoom(absl::Time deadline) const;
  // CheckRoom for creating etcd key `k`; when the store is full but `k` was
  // created meanwhile (by a concurrent caller), OK with *appeared = true:
  // the caller retries, now without creating a key.
  absl::Status CheckRoomFor(const std::string& k, absl::Time deadline, bool* appeared) const;
  // Puts `value` at `key` when the key is absent; returns the value there now.
  absl::StatusOr<std::string> PutIfAbsent(const std::string& key, const std::string& value,
                                          int64_t lease, absl::Time deadline);
  absl::Status Named(const absl::Status& s, const std::string& what) const;

  etcd::EtcdClient* const etcd_;
  const std::string kv_prefix_;
  const KvLimits limits_;
  std::atomic<int64_t> lease_{0};
  // Waits and barriers in progress on this node (each holds a caller's
  // thread and a watch): at most limits_.max_waiters.
  std::atomic<size_t> waiters_{0};
  std::atomic<size_t> watching_{0};  // waits with their watch open
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_STORE_H_
