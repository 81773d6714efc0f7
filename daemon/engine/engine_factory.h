// Builds the engine named by `engine.kind` / `engine.device` in node.yaml:
// the CPU engine for host memory, wrapped (kind nccl / auto) into the
// routing engine that also runs device tasks on the NCCL engine
// (device_engine_factory.h).
#ifndef HSDP_DAEMON_ENGINE_ENGINE_FACTORY_H_
#define HSDP_DAEMON_ENGINE_ENGINE_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/engine/device_engine_factory.h"
#include "daemon/engine/engine.h"

namespace hsdp {

struct EngineOptions {
  std::string kind = "cpu";     // "cpu", "nccl" or "auto"
  int threads = 1;              // CPU threads for large tasks
  uint64_t inline_max_bytes = 64 * 1024;
  int bulk_nice = 0;            // nice increment of the threads running queued work
  bool idle_lower_classes = false;  // CpuEngine: lower classes yield the CPU to higher ones
  std::string device = "cuda";  // "cuda", or "fake" (tests only)
  nccl::NcclEngineOptions nccl;  // for the NCCL engine of kind nccl / auto
};

// The engine and, when it runs device tasks, the device API the daemon's
// device-buffer registry maps with (DeviceStack::device; null otherwise).
// INVALID_ARGUMENT for an unknown kind or device; FAILED_PRECONDITION (named)
// for "nccl" without CUDA/NCCL in the build or without a visible GPU.
absl::StatusOr<DeviceStack> MakeEngine(const EngineOptions& options);

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_ENGINE_FACTORY_H_
