#include "daemon/engine/device_engine_factory.h"

#include "absl/strings/str_cat.h"
#include "daemon/device/fake_device_api.h"
#include "daemon/engine/nccl/fake_collectives.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

#ifdef HSDP_HAVE_CUDA
#include "daemon/device/cuda_device_api.h"
#include "daemon/engine/nccl/nccl_collectives.h"
#endif

namespace hsdp {
namespace {

constexpr size_t kMaxRoutes = 1 << 16;

bool AnyDevice(const EngineTask& t) {
  for (const EngineMember& m : t.members) {
    if (m.local && (m.send.kind == MemoryKind::kDevice || m.recv.kind == MemoryKind::kDevice)) {
      return true;
    }
  }
  return false;
}

// The NCCL engine together with what it runs on.
class OwningNcclEngine : public nccl::NcclEngine {
 public:
  OwningNcclEngine(std::shared_ptr<device::DeviceApi> dev,
                   std::unique_ptr<nccl::Collectives> coll, nccl::NcclEngineOptions options)
      : NcclEngine(dev.get(), coll.get(), options), dev_(std::move(dev)), coll_(std::move(coll)) {}
  ~OwningNcclEngine() override { Shutdown(); }  // before dev_ / coll_ go

 private:
  std::shared_ptr<device::DeviceApi> dev_;
  std::unique_ptr<nccl::Collectives> coll_;
};

}  // namespace

KindRoutingEngine::KindRoutingEngine(std::unique_ptr<Engine> host, std::unique_ptr<Engine> device)
    : host_(std::move(host)), device_(std::move(device)) {}

KindRoutingEngine::~KindRoutingEngine() { Shutdown(); }

absl::Status KindRoutingEngine::CreateGroup(const EngineGroupSpec& spec) {
  RETURN_IF_ERROR(host_->CreateGroup(spec));
  return device_->CreateGroup(spec);
}

void KindRoutingEngine::DestroyGroup(const std::string& key) {
  host_->DestroyGroup(key);
  device_->DestroyGroup(key);
}

uint64_t KindRoutingEngine::Launch(EngineTask task, EngineCallbacks cb) {
  const bool dev = AnyDevice(task);
  uint64_t outer;
  {
    std::lock_guard<std::mutex> l(mu_);
    outer = next_++;
    routes_[outer] = Route{dev, 0};
    while (routes_.size() > kMaxRoutes) routes_.erase(routes_.begin());
    // Dependencies name outer tickets; the inner engine knows its own.
    std::vector<uint64_t> inner_deps;
    for (uint64_t d : task.depends_on) {
      auto it = routes_.find(d);
      if (it != routes_.end() && it->second.device == dev && it->second.inner != 0) {
        inner_deps.push_back(it->second.inner);
      }
    }
    task.depends_on = std::move(inner_deps);
  }
  EngineCallbacks inner_cb;
  // The inner ticket is recorded here too: `launched` may run (on the inner
  // engine's thread) before Launch below returns, and a task launched from
  // inside it (the composite's second phase) must find this one's inner
  // ticket, or its dependency would be dropped.
  inner_cb.launched = [this, outer, launched = std::move(cb.launched)](uint64_t inner_ticket) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (auto it = routes_.find(outer); it != routes_.end()) it->second.inner = inner_ticket;
    }
    launched(outer);
  };
  inner_cb.completed = std::move(cb.completed);
  const uint64_t inner = (dev ? device_ : host_)->Launch(std::move(task), std::move(inner_cb));
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = routes_.find(outer); it != routes_.end()) it->second.inner = inner;
  return outer;
}

void KindRoutingEngine::Abort(uint64_t ticket, const absl::Status& why) {
  Route r{false, 0};
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = routes_.find(ticket);
    if (it == routes_.end() || it->second.inner == 0) return;
    r = it->second;
  }
  (r.device ? device_ : host_)->Abort(r.inner, why);
}

void KindRoutingEngine::Shutdown() {
  host_->Shutdown();
  device_->Shutdown();
}

std::string KindRoutingEngine::name() const {
  return absl::StrCat(host_->name(), "+", device_->name());
}

std::unique_ptr<Engine> MakeRoutingEngine(std::unique_ptr<Engine> host,
                                          std::shared_ptr<device::DeviceApi> device,
                                          std::unique_ptr<nccl::Collectives> collectives,
                                          nccl::NcclEngineOptions options) {
  auto nccl_engine =
      std::make_unique<OwningNcclEngine>(std::move(device), std::move(collectives), options);
  return std::make_unique<KindRoutingEngine>(std::move(host), std::move(nccl_engine));
}

absl::StatusOr<DeviceStack> MakeDeviceAwareEngine(const std::string& kind,
                                                  std::unique_ptr<Engine> host,
                                                  nccl::NcclEngineOptions options,
                                                  const std::string& device) {
  DeviceStack out;
  if (kind != "cpu" && kind != "nccl" && kind != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("engine.kind: unknown engine \"", kind,
                                                   "\" (engines: cpu, nccl, auto)"));
  }
  if (device != "cuda" && device != "fake") {
    return absl::InvalidArgumentError(
        absl::StrCat("engine.device: unknown device \"", device, "\" (cuda, or fake for tests)"));
  }
  if (kind == "cpu") {
    if (device == "fake") {
      return absl::InvalidArgumentError(
          "engine.device: \"fake\" needs engine.kind nccl or auto (cpu runs no device engine)");
    }
    out.engine = std::move(host);
    return out;
  }
  if (device == "fake") {
    HSDP_LOG(Warning) << "engine.device: fake — TEST ONLY: device memory is host memory shared "
                         "by the trainers, \"NCCL\" is a CPU fake; "
                      << kFakeDevices << " fake GPUs. Never use this in production.";
    auto fake = std::make_shared<device::FakeDeviceApi>(kFakeDevices, uint64_t{64} << 20,
                                                        /*cross_process=*/true);
    auto collectives = std::make_unique<nccl::FakeCollectives>(fake.get());
    out.device = fake;
    out.engine = MakeRoutingEngine(std::move(host), fake, std::move(collectives), options);
    return out;
  }
#ifdef HSDP_HAVE_CUDA
  std::shared_ptr<device::CudaDeviceApi> cuda = device::CudaDeviceApi::Create();
  if (cuda->DeviceCount() == 0) {
    if (kind == "nccl") {
      return absl::FailedPreconditionError(absl::StrCat(
          "engine.kind: \"nccl\" needs a GPU: ", cuda->unavailable_reason()));
    }
    HSDP_LOG(Info) << "engine.kind auto: no GPU visible (" << cuda->unavailable_reason()
                   << "); host memory only, device memory is not offered";
    out.engine = std::move(host);
    return out;
  }
  absl::StatusOr<std::unique_ptr<nccl::NcclCollectives>> collectives =
      nccl::NcclCollectives::Create();
  if (!collectives.ok()) {
    if (kind == "nccl") {
      return absl::FailedPreconditionError(absl::StrCat(
          "engine.kind: \"nccl\" needs libnccl: ", collectives.status().message()));
    }
    HSDP_LOG(Warning) << "engine.kind auto: a GPU is visible but "
                      << collectives.status().message()
                      << "; host memory only, device memory is not offered";
    out.engine = std::move(host);
    return out;
  }
  HSDP_LOG(Info) << "NCCL " << (*collectives)->name() << " loaded";
  out.device = cuda;
  out.engine = MakeRoutingEngine(std::move(host), cuda, *std::move(collectives), options);
  return out;
#else
  if (kind == "nccl") {
    return absl::FailedPreconditionError(
        "engine.kind: \"nccl\" is not available in this build (built without CUDA/NCCL; "
        "HSDP_WITH_CUDA)");
  }
  (void)options;
  HSDP_LOG(Info) << "engine.kind auto: built without CUDA/NCCL; host memory only";
  out.engine = std::move(host);
  return out;
#endif
}

}  // namespace hsdp
