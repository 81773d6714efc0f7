// MetricsServer: the HTTP side of Metrics. Serves /metrics (prometheus-cpp's
// Exposer) from the given collectables, in their order, and, when a
// password is set, asks for HTTP basic auth: the user name and the password
// are each compared in full and in constant time (ConstantTimeEquals), and
// anything else gets 401 with an empty body.
//
// Thread-safety: Serve and Stop from one thread; the auth check runs on the
// Exposer's threads.
#ifndef HSDP_DAEMON_OBSERVABILITY_METRICS_SERVER_H_
#define HSDP_DAEMON_OBSERVABILITY_METRICS_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"

namespace hsdp {

class MetricsServer {
 public:
  // `password` "": no authentication.
  MetricsServer(std::string username, std::string password);
  ~MetricsServer();  // Stop()
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Serves `collectables` (held weakly: the caller keeps them) on `listen` ("HOST:PORT"; port 0 picks a free
  // one); returns "HOST:PORT" actually bound. UNAVAILABLE when the address
  // cannot be bound. Call once.
  absl::StatusOr<std::string> Serve(
      const std::string& listen,
      const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables);
  // Stops serving; waits for scrapes in progress. Idempotent.
  void Stop();

  // Whether a request with this user and password is let in.
  bool Authorized(const std::string& user, const std::string& password) const;

 private:
  const std::string username_;
  const std::string password_;
  std::unique_ptr<prometheus::Exposer> exposer_;  // last: destroyed first
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_METRICS_SERVER_H_
