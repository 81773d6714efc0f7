// A gloo::rendezvous::Store over the cluster's key/value store, for Gloo
// contexts (and, later, NCCL unique ids) across daemons. Keys are prefixed
// with `prefix` so several contexts share one coordinator.
//
// Gloo's Store interface reports failures by throwing: every failed call
// throws gloo::IoException with the coordinator's message. get() waits for
// the key like Gloo's own stores. Thread-safe (ClusterStore is).
#ifndef HSDP_DAEMON_CLUSTER_GLOO_STORE_H_
#define HSDP_DAEMON_CLUSTER_GLOO_STORE_H_

#include <chrono>
#include <string>
#include <vector>

#include "daemon/cluster/cluster_store.h"
#include "gloo/rendezvous/store.h"

namespace hsdp {

class GlooStore : public gloo::rendezvous::Store {
 public:
  // `client` must outlive the store.
  GlooStore(ClusterStore* client, std::string prefix,
            std::chrono::milliseconds timeout = kDefaultTimeout)
      : client_(client), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  ClusterStore* const client_;
  const std::string prefix_;
  const std::chrono::milliseconds timeout_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_GLOO_STORE_H_
