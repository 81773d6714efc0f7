#include "daemon/server/cluster_engine.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"

#if HSDP_HAVE_CLUSTER_ENGINE
#include "daemon/cluster/gloo_store.h"
#include "daemon/engine/crossnode/gloo_transport.h"
#include "daemon/engine/crossnode/hierarchical_engine.h"
#endif

namespace hsdp {

absl::StatusOr<std::unique_ptr<Engine>> MakeClusterEngine(std::unique_ptr<Engine> local,
                                                          ClusterStore* coordinator,
                                                          const NodeConfig& config, int threads,
                                                          const std::string& instance) {
#if HSDP_HAVE_CLUSTER_ENGINE
  const std::string listen_host = config.cluster_listen.substr(0, config.cluster_listen.rfind(':'));
  GlooTransportOptions transport;
  transport.instance = instance;
  transport.data_address =
      config.cluster_data_address.empty() ? listen_host : config.cluster_data_address;
  // Rendezvous waits are bounded like the tasks themselves.
  const std::chrono::milliseconds wait(std::max<uint32_t>(1000, config.collective_timeout_ms));
  // "<prefix>/" + Gloo's key: without the separator, key "10" of epoch 1
  // ("k/1" "10") and key "0" of epoch 11 ("k/11" "0") would be the same.
  transport.store = [coordinator, wait](const std::string& prefix) {
    return std::unique_ptr<gloo::rendezvous::Store>(
        new GlooStore(coordinator, prefix + "/", wait));
  };
  // The coordinator's store is bounded: a link's addresses are deleted once
  // every participant connected, so long-lived daemons do not fill it.
  transport.release = [coordinator](const std::string& prefix,
                                     const std::vector<std::string>& keys) {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const std::string& k : keys) full.push_back(prefix + "/" + k);
    if (absl::Status s = coordinator->Delete(full, absl::Seconds(5)); !s.ok()) {
      HSDP_LOG(Warning) << "cluster: could not delete the rendezvous keys of " << prefix << ": "
                        << s;
    }
  };
  HierarchicalEngineOptions options;
  options.threads = std::max(2, threads);
  options.timeout = absl::Milliseconds(config.collective_timeout_ms);
  return MakeHierarchicalEngine(std::move(local), MakeGlooTransport(std::move(transport)),
                                options);
#else
  (void)coordinator;
  (void)config;
  (void)threads;
  (void)instance;
  HSDP_LOG(Warning) << "cluster: this hsdpd was built without the cross-node engine (Gloo); "
                       "groups whose ranks span nodes fail with FAILED_PRECONDITION";
  return local;
#endif
}

}  // namespace hsdp
