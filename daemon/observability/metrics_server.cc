#include "daemon/observability/metrics_server.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/util/constant_time.h"

namespace hsdp {

MetricsServer::MetricsServer(std::string username, std::string password)
    : username_(std::move(username)), password_(std::move(password)) {}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() { exposer_.reset(); }

bool MetricsServer::Authorized(const std::string& user, const std::string& password) const {
  // Both compared in full, whatever the first says.
  const bool user_ok = ConstantTimeEquals(user, username_);
  const bool password_ok = ConstantTimeEquals(password, password_);
  return user_ok && password_ok;
}

absl::StatusOr<std::string> MetricsServer::Serve(
    const std::string& listen,
    const std::vector<std::shared_ptr<prometheus::Collectable>>& collectables) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(listen, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("metrics.listen: cannot serve /metrics on \"", listen, "\": ", e.what()));
  }
  if (!password_.empty()) {
    exposer_->RegisterAuth(
        [this](const std::string& user, const std::string& password) {
          return Authorized(user, password);
        },
        "hsdpd");
  }
  for (const auto& c : collectables) exposer_->RegisterCollectable(c);
  const std::vector<int> ports = exposer_->GetListeningPorts();
  const std::string host = listen.substr(0, listen.rfind(':'));
  return absl::StrCat(host, ":", ports.empty() ? 0 : ports[0]);
}

}  // namespace hsdp
