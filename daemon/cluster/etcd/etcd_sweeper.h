// The sweeper: the one member (elected through P w/sweeper, under its
// lease) that watches the node keys (P n/) and turns each node key that
// etcd deleted (its lease expired, or it was revoked) into news every
// member hears: P w/news/<r> = the lost instance, state "lost", with the
// epoch it moved on to. So a join wakes one watcher, not N, and a loss
// costs the sweeper a few calls and each member one watch event.
//
// A loss is published only while the rank is still free and still held by
// the lost instance last (compared against P n/<r> and P h/ranks/<r>): a
// node that took the rank again already published news naming the
// instance it replaced.
//
// When it starts (elected, or after a compaction of its watch) it reads
// the node keys, the rank history and the news, and publishes the losses
// nobody published: every rank held once, not live now, whose news does
// not already say its last holder is lost. That covers the time with no
// sweeper (the previous one died: its own loss is among them).
//
// Run blocks until Stop; thread-safe.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_SWEEPER_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_SWEEPER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "daemon/cluster/etcd/etcd_join.h"
#include "daemon/cluster/etcd/etcd_keys.h"

namespace hsdp::etcd {

class EtcdSweeper {
 public:
  // `etcd` and `join` (for the epoch's steps) must outlive this; `rpcs`
  // (may be null) counts the calls made.
  EtcdSweeper(EtcdClient* etcd, EtcdJoin* join, std::string prefix, uint32_t nodes,
              std::atomic<uint64_t>* rpcs = nullptr);

  // Sweeps until Stop.
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Losses this sweeper published.
  uint64_t published() const { return published_.load(std::memory_order_relaxed); }
  // Node keys it is tracking now (0 until its first read and the losses it
  // found there are published: a test waits for that).
  size_t tracked() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Held {
    std::string address;
    std::string instance;
    int64_t revision = 0;  // of the claim that put the node key (and its holder record)
  };
  void Count() {
    if (rpcs_ != nullptr) rpcs_->fetch_add(1, std::memory_order_relaxed);
  }
  // Reads everything and publishes the losses nobody published; false
  // when etcd did not answer. `*from`: the revision to watch from.
  bool Start(int64_t* from) ABSL_LOCKS_EXCLUDED(mu_);
  // Publishes "rank's `held` instance is lost" at `epoch` (unless the rank
  // was taken again since); false when etcd did not answer.
  bool Publish(int rank, const Held& held, int64_t holder_revision, uint64_t epoch);
  bool stopping() const ABSL_LOCKS_EXCLUDED(mu_);

  EtcdClient* const etcd_;
  EtcdJoin* const join_;
  const EtcdKeys keys_;
  const uint32_t nodes_;
  std::atomic<uint64_t>* const rpcs_;
  std::atomic<uint64_t> published_{0};

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Watch* watch_ ABSL_GUARDED_BY(mu_) = nullptr;  // the watch in use, for Stop
  std::map<int, Held> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace hsdp::etcd

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_SWEEPER_H_
