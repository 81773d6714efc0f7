#include "daemon/engine/engine_factory.h"

#include "absl/strings/str_cat.h"
#include "daemon/engine/cpu/cpu_engine.h"

namespace hsdp {

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const EngineOptions& options) {
  if (options.kind == "cpu" || options.kind == "auto") {
    // "auto" picks per device once a device engine exists; CPU is all there is now.
    return std::unique_ptr<Engine>(new CpuEngine(options.threads, options.inline_max_bytes));
  }
  if (options.kind == "nccl") {
    return absl::UnimplementedError(
        "engine.kind: \"nccl\" is not available in this build (engines: cpu)");
  }
  return absl::InvalidArgumentError(
      absl::StrCat("engine.kind: unknown engine \"", options.kind, "\" (engines: cpu)"));
}

}  // namespace hsdp
