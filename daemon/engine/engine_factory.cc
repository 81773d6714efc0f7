#include "daemon/engine/engine_factory.h"

#include "daemon/engine/cpu/cpu_engine.h"

namespace hsdp {

absl::StatusOr<DeviceStack> MakeEngine(const EngineOptions& options) {
  // Host memory always runs on the CPU engine (CPU tensors keep working on a
  // GPU node); the kind decides whether a device engine runs beside it.
  auto host = std::unique_ptr<Engine>(new CpuEngine(options.threads, options.inline_max_bytes,
                                                        CpuEngine::kDefaultSliceBytes,
                                                        options.bulk_nice,
                                                        options.idle_lower_classes));
  return MakeDeviceAwareEngine(options.kind, std::move(host), options.nccl, options.device);
}

}  // namespace hsdp
