#include "daemon/observability/metrics_server.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hsdp {

bool SameSecret(const std::string& a, const std::string& b) {
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

MetricsServer::MetricsServer(std::string username, std::string password)
    : username_(std::move(username)), password_(std::move(password)) {}

MetricsServer::~MetricsServer() { Stop(); }

void MetricsServer::Stop() { exposer_.reset(); }

bool MetricsServer::Authorized(const std::string& user, const std::string& password) const {
  // Both compared in full, whatever the first says.
  const bool user_ok = SameSecret(user, username_);
  const bool password_ok = SameSecret(password, password_);
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
