// Engine selection with the GPU engine (docs/gpu.md): wraps the engine
// MakeEngine built for host memory into one that routes every task by the
// memory kind of its buffers — host tasks to the CPU engine, device tasks to
// the NCCL engine — so a node runs both ("CPU tensors keep working").
//
//   engine.kind: cpu  -> the host engine as is
//   engine.kind: nccl -> routing engine; FAILED_PRECONDITION when this build
//                        has no CUDA/NCCL or no GPU is visible (named)
//   engine.kind: auto -> routing engine when a GPU is visible, else host only
//
//   engine.device: cuda (default) -> the real CUDA device and NCCL
//   engine.device: fake -> TEST ONLY: kFakeDevices host-memory "GPUs" in
//                  cross-process mode (fake_shm.h) and the fake NCCL, so a
//                  real hsdpd runs the whole device path in CI. Logged as a
//                  warning at start; never chosen unless named.
//
// KindRoutingEngine: tickets are its own (each maps to the inner engine and
// its ticket), so Abort and depends_on work across the two engines.
// Thread-safety: all methods are thread-safe.
#ifndef HSDP_DAEMON_ENGINE_DEVICE_ENGINE_FACTORY_H_
#define HSDP_DAEMON_ENGINE_DEVICE_ENGINE_FACTORY_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "daemon/device/device_api.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/nccl/collectives_api.h"
#include "daemon/engine/nccl/nccl_engine.h"

namespace hsdp {

class KindRoutingEngine : public Engine {
 public:
  KindRoutingEngine(std::unique_ptr<Engine> host, std::unique_ptr<Engine> device);
  ~KindRoutingEngine() override;

  absl::Status CreateGroup(const EngineGroupSpec& spec) override;
  void DestroyGroup(const std::string& key) override;
  uint64_t Launch(EngineTask task, EngineCallbacks callbacks) override;
  void Abort(uint64_t ticket, const absl::Status& why) override;
  void Shutdown() override;
  std::string name() const override;
  int threads() const override { return host_->threads() + device_->threads(); }
  bool Supports(MemoryKind kind) const override {
    return host_->Supports(kind) || device_->Supports(kind);
  }
  bool SupportsRemoteMembers() const override { return host_->SupportsRemoteMembers(); }

 private:
  struct Route {
    bool device;
    uint64_t inner;  // 0 until the inner Launch returned
  };
  std::unique_ptr<Engine> host_;
  std::unique_ptr<Engine> device_;
  std::mutex mu_;
  uint64_t next_ = 1;               // guarded by mu_
  std::map<uint64_t, Route> routes_;  // outer ticket -> route (bounded); guarded by mu_
};

// What the GPU path needs besides the engine: the device API the buffer
// registry maps with (shared with the NCCL engine).
struct DeviceStack {
  std::shared_ptr<device::DeviceApi> device;  // null when the engine is host only
  std::unique_ptr<Engine> engine;
};

// Devices of engine.device: fake.
inline constexpr int kFakeDevices = 8;

// `kind`: engine.kind from node.yaml; `device`: engine.device ("cuda" or
// "fake"). `host`: the host engine.
absl::StatusOr<DeviceStack> MakeDeviceAwareEngine(const std::string& kind,
                                                  std::unique_ptr<Engine> host,
                                                  nccl::NcclEngineOptions options = {},
                                                  const std::string& device = "cuda");

// For tests: the same over given device and collective implementations
// (which the returned engine then owns).
std::unique_ptr<Engine> MakeRoutingEngine(std::unique_ptr<Engine> host,
                                          std::shared_ptr<device::DeviceApi> device,
                                          std::unique_ptr<nccl::Collectives> collectives,
                                          nccl::NcclEngineOptions options = {});

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_DEVICE_ENGINE_FACTORY_H_
