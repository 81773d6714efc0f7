// Builds the engine named by `engine.kind` in node.yaml.
#ifndef HSDP_DAEMON_ENGINE_ENGINE_FACTORY_H_
#define HSDP_DAEMON_ENGINE_ENGINE_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/engine/engine.h"

namespace hsdp {

struct EngineOptions {
  std::string kind = "cpu";  // "cpu"; "nccl" and "auto" once the GPU engine exists
  int threads = 1;           // CPU threads for large tasks
  uint64_t inline_max_bytes = 64 * 1024;
};

// UNIMPLEMENTED (naming the kind and what this build has) for a kind this
// build cannot run; INVALID_ARGUMENT for an unknown kind.
absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const EngineOptions& options);

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_ENGINE_FACTORY_H_
