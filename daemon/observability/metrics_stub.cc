// Metrics when hsdpd is built without prometheus-cpp: every constructor
// fails with UNIMPLEMENTED, so `metrics.listen` refuses to start the daemon.
#include "daemon/observability/metrics.h"

namespace hsdp {
namespace {
absl::Status NotBuilt() {
  return absl::UnimplementedError(
      "metrics.listen: this hsdpd was built without prometheus-cpp (install "
      "prometheus-cpp-dev, see tools/scripts/bootstrap.sh, and rebuild)");
}
}  // namespace

class Metrics::Impl {};

bool Metrics::Available() { return false; }
absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(NodeGaugeSource, MetricsOptions) {
  return NotBuilt();
}
absl::Status Metrics::Serve(const std::string&) { return NotBuilt(); }
void Metrics::StopServing() {}
Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;
bool Metrics::job_series() const { return false; }
std::string Metrics::Text() const { return ""; }
MetricsHeld Metrics::Held() const { return {}; }
void Metrics::OnMatched(const GroupSpec&, const std::map<int, Arrival>&) {}
void Metrics::OnCompleted(const GroupSpec&, const std::vector<Arrival>&, const absl::Status&,
                          uint64_t, uint64_t) {}

}  // namespace hsdp
