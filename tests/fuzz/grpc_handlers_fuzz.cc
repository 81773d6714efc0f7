// Fuzz target: the gRPC handlers of the daemon's Unix socket (Node, Admin,
// Health, DeviceMemory services), each request decoded from bytes as
// protobuf, as gRPC would, and handed to the real handler on a real
// SessionManager (fake engine, fake device). Callers are any of three uids:
// root (an admin), 1000 and 1001, all allowed.
//
// Records (fuzz_input.h): payload [uid: u8][request bytes], op % 19:
//   0 Attach 1 Detach 2 RegisterBuffer 3 FreeBuffer 4 NewGroup 5 Status
//   6 GetConfig 7 Trace 8 Stragglers 9 Activity 10 Health.Check
//   11 RegisterDeviceBuffer 12 FreeDeviceBuffer 13 RegisterDeviceEvent
//   14 FreeDeviceEvent 15 GetCompletionEvents
//   16 an fd arrives on a session's data connection:
//      [uid][session: u8][fd_tag: u64][bytes: u16][device: u8] (a sealed
//      memfd of that size, or with device odd a device-memory handle)
//   17 a session's data connection says hello (ClaimSession with its token)
//   18 Admin.Drain (the drain itself is recorded, not run)
// Sessions are named by the ids Attach returned (1, 2, ... in order).
//
// Oracles beyond "no crash, no sanitizer report": every call finishes exactly
// once (callback methods by the end, when every session has ended); a
// non-admin caller's Status lists only its own sessions and its own jobs'
// (isolation, docs/security.md); an Attach that succeeded made a session of
// the caller's uid; Drain reaches the daemon only from root, with a timeout
// within (0, 3600] s.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <deque>
#include <map>
#include <memory>

#include "absl/strings/str_cat.h"
#include "daemon/auth/authenticator.h"
#include "daemon/device/fake_device_api.h"
#include "daemon/engine/fake/fake_engine.h"
#include "daemon/jobs/device_registration.h"
#include "daemon/jobs/session_manager.h"
#include "daemon/observability/observability.h"
#include "daemon/server/device_service.h"
#include "daemon/server/grpc_services.h"
#include "daemon/session/device_buffers.h"
#include "daemon/util/executor.h"
#include "fuzz_input.h"
#include "grpcpp/test/default_reactor_test_peer.h"

namespace hsdp::fuzz {
namespace {

constexpr uint32_t kUids[] = {0, 1000, 1001};

// The caller of the current record (the handlers run on this thread).
thread_local uint32_t g_uid = 0;

class FuzzAuth : public Authenticator {
 public:
  absl::StatusOr<PeerCred> Authenticate(const grpc::ServerContextBase&) const override {
    return PeerCred{1, g_uid, g_uid};
  }
  bool IsAdmin(uint32_t uid) const override { return uid == 0; }
};

struct CallBase {
  grpc::CallbackServerContext cb_ctx;  // callback methods
  grpc::ServerContext ctx;             // the others
  std::atomic<int> finished{0};
  grpc::testing::DefaultReactorTestPeer peer{&cb_ctx, [this](grpc::Status) { finished.fetch_add(1); }};
  bool callback = false;
  virtual ~CallBase() = default;
};
template <typename Req, typename Resp>
struct Call : CallBase {
  Req req;
  Resp resp;
};

struct Fixture {
  device::FakeDeviceApi dev{1, 1 << 22};
  device::DevicePtr alloc = 0;
  FuzzAuth auth;
  NodeConfig config;
  Fixture() {
    config.ring_entries = 16;
    config.max_sessions = 8;
    config.max_buffers_per_session = 4;
    config.max_session_bytes = 1 << 20;
    config.max_groups_per_job = 4;
    auto a = dev.Allocate(0, 1 << 16, device::AllocSharing::kPosixFd);
    if (!a.ok()) Fail("fake device Allocate: " + a.status().ToString());
    alloc = *a;
  }
};

UniqueFd SealedMemfd(uint64_t bytes) {
  UniqueFd fd(::memfd_create("fuzz", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) Fail("memfd");
  ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  return fd;
}

class Node {
 public:
  explicit Node(Fixture* fx)
      : fx_(fx),
        sm_(fx->config, Limits(), &engine_, &control_),
        registry_(&fx->dev),
        registration_(&sm_, &registry_, absl::Milliseconds(50)),
        node_(&sm_, &fx->auth, fx->config, &tracker_),
        admin_(&sm_, &fx->auth, fx->config, &engine_, "/fuzz/hsdpd.sock", Obs(), nullptr,
               [this](absl::Duration timeout) {
                 HSDP_FUZZ_CHECK(timeout > absl::ZeroDuration() && timeout <= absl::Hours(1),
                                 absl::StrCat("drain with timeout ", absl::FormatDuration(timeout)));
                 ++drains_;
                 return v1::DrainResponse();
               }),
        health_(&fx->auth),
        device_(&registration_, &fx->auth, &tracker_) {
    sm_.EnableFeatures(shm::kFeatureDeviceMemory);
    sm_.AddSessionEndHook([this](uint64_t id) { registration_.OnSessionEnded(id); });
  }
  ~Node() {
    sm_.EndAll("fuzz input over");
    control_.Shutdown();  // runs the registrations the session ends completed
    for (const auto& c : calls_) {
      HSDP_FUZZ_CHECK(c->finished.load() == (c->callback ? 1 : 0),
                      absl::StrCat("a call finished ", c->finished.load(), " times"));
    }
  }

  void Run(uint8_t op, uint32_t uid, std::string_view bytes) {
    g_uid = uid;
    switch (op % 19) {
      case 0:
        if (auto* c = Decode<v1::AttachRequest, v1::AttachResponse>(bytes)) {
          if (node_.Attach(&c->ctx, &c->req, &c->resp).ok()) {
            std::shared_ptr<Session> s = sm_.FindSession(c->resp.session_id());
            HSDP_FUZZ_CHECK(s != nullptr && s->info().uid == uid, "Attach made no session of its caller");
            tokens_[c->resp.session_id()] = c->resp.session_token();
          }
        }
        break;
      case 1: Sync<v1::DetachRequest, v1::DetachResponse>(bytes, &NodeServiceImpl::Detach, node_); break;
      case 2:
        if (auto* c = Decode<v1::RegisterBufferRequest, v1::RegisterBufferResponse>(bytes, true)) {
          node_.RegisterBuffer(&c->cb_ctx, &c->req, &c->resp);
        }
        break;
      case 3: Sync<v1::FreeBufferRequest, v1::FreeBufferResponse>(bytes, &NodeServiceImpl::FreeBuffer, node_); break;
      case 4: Sync<v1::NewGroupRequest, v1::NewGroupResponse>(bytes, &NodeServiceImpl::NewGroup, node_); break;
      case 5:
        if (auto* c = Decode<v1::StatusRequest, v1::StatusResponse>(bytes)) {
          if (admin_.Status(&c->ctx, &c->req, &c->resp).ok() && uid != 0) {
            for (const v1::SessionInfo& s : c->resp.sessions()) {
              HSDP_FUZZ_CHECK(s.peer_uid() == uid || s.owner_uid() == uid,
                              absl::StrCat("uid ", uid, " sees session ", s.session_id(),
                                           " of uid ", s.peer_uid(), " (owner ", s.owner_uid(), ")"));
            }
            for (const v1::JobInfo& j : c->resp.jobs()) {
              HSDP_FUZZ_CHECK(j.owner_uid() == uid, absl::StrCat("uid ", uid, " sees job of uid ",
                                                                 j.owner_uid()));
            }
          }
        }
        break;
      case 6: Sync<v1::GetConfigRequest, v1::GetConfigResponse>(bytes, &AdminServiceImpl::GetConfig, admin_); break;
      case 7: Sync<v1::TraceRequest, v1::TraceResponse>(bytes, &AdminServiceImpl::Trace, admin_); break;
      case 8: Sync<v1::StragglersRequest, v1::StragglersResponse>(bytes, &AdminServiceImpl::Stragglers, admin_); break;
      case 9: Sync<v1::ActivityRequest, v1::ActivityResponse>(bytes, &AdminServiceImpl::Activity, admin_); break;
      case 10:
        Sync<grpc::health::v1::HealthCheckRequest, grpc::health::v1::HealthCheckResponse>(
            bytes, &HealthServiceImpl::Check, health_);
        break;
      case 11:
        if (auto* c = Decode<v1::RegisterDeviceBufferRequest, v1::RegisterDeviceBufferResponse>(bytes, true)) {
          device_.RegisterDeviceBuffer(&c->cb_ctx, &c->req, &c->resp);
        }
        break;
      case 12: Sync<v1::FreeDeviceBufferRequest, v1::FreeDeviceBufferResponse>(bytes, &DeviceMemoryServiceImpl::FreeDeviceBuffer, device_); break;
      case 13: Sync<v1::RegisterDeviceEventRequest, v1::RegisterDeviceEventResponse>(bytes, &DeviceMemoryServiceImpl::RegisterDeviceEvent, device_); break;
      case 14: Sync<v1::FreeDeviceEventRequest, v1::FreeDeviceEventResponse>(bytes, &DeviceMemoryServiceImpl::FreeDeviceEvent, device_); break;
      case 15: Sync<v1::GetCompletionEventsRequest, v1::GetCompletionEventsResponse>(bytes, &DeviceMemoryServiceImpl::GetCompletionEvents, device_); break;
      case 16: {
        Fields f(bytes);
        std::shared_ptr<Session> s = sm_.FindSession(f.Get<uint8_t>() % 8 + 1);
        const uint64_t tag = f.Get<uint64_t>();
        const uint64_t size = f.Get<uint16_t>() + 1;
        if (s == nullptr) break;
        if (f.Get<uint8_t>() & 1) {
          auto fd = fx_->dev.ExportFd(fx_->alloc);
          if (fd.ok()) s->PutFd(tag, std::move(*fd), Session::FdKind::kDeviceHandle);
        } else {
          s->PutFd(tag, SealedMemfd(size));
        }
        break;
      }
      case 18:
        if (auto* c = Decode<v1::DrainRequest, v1::DrainResponse>(bytes)) {
          const int before = drains_;
          const grpc::Status st = admin_.Drain(&c->ctx, &c->req, &c->resp);
          if (uid != 0) {
            HSDP_FUZZ_CHECK(st.error_code() == grpc::StatusCode::PERMISSION_DENIED &&
                                drains_ == before,
                            absl::StrCat("uid ", uid, " drained hsdpd"));
          }
        }
        break;
      case 17: {
        const uint64_t id = bytes.empty() ? 1 : static_cast<uint8_t>(bytes[0]) % 8 + 1;
        auto it = tokens_.find(id);
        if (it != tokens_.end() && it->second.size() == shm::kSessionTokenBytes) {
          (void)sm_.ClaimSession(id, reinterpret_cast<const uint8_t*>(it->second.data()),
                                 PeerCred{1, uid, uid});
        }
        break;
      }
    }
  }

 private:
  static NodeLimits Limits() {
    NodeLimits l;
    l.max_node_bytes = 4 << 20;
    l.max_mappings = 64;
    return l;
  }
  Observability* Obs() {
    if (obs_ == nullptr) {
      auto o = Observability::Create(ObservabilityOptions{"", 1024}, [] { return NodeGauges{}; });
      if (!o.ok()) Fail("Observability: " + o.status().ToString());
      obs_ = std::move(*o);
    }
    return obs_.get();
  }
  template <typename Req, typename Resp>
  Call<Req, Resp>* Decode(std::string_view bytes, bool callback = false) {
    auto c = std::make_unique<Call<Req, Resp>>();
    if (!c->req.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return nullptr;
    c->callback = callback;
    calls_.push_back(std::move(c));
    return static_cast<Call<Req, Resp>*>(calls_.back().get());
  }
  template <typename Req, typename Resp, typename Service>
  void Sync(std::string_view bytes,
            grpc::Status (Service::*method)(grpc::ServerContext*, const Req*, Resp*),
            Service& service) {
    if (auto* c = Decode<Req, Resp>(bytes)) (void)(service.*method)(&c->ctx, &c->req, &c->resp);
  }

  Fixture* const fx_;
  std::unique_ptr<Observability> obs_;  // before the manager that reports to it
  FakeStreamEngine engine_;
  RpcTracker tracker_;
  // Buffer mapping runs here, as in hsdpd (daemon.cc); with none it runs
  // inline, under the session manager's lock when a session end fails a
  // registration waiting for its fd, which deadlocks.
  Executor control_{2};
  SessionManager sm_;
  DeviceBufferRegistry registry_;
  DeviceRegistration registration_;
  NodeServiceImpl node_;
  AdminServiceImpl admin_;
  HealthServiceImpl health_;
  DeviceMemoryServiceImpl device_;
  std::map<uint64_t, std::string> tokens_;
  int drains_ = 0;
  std::deque<std::unique_ptr<CallBase>> calls_;  // alive until every callback ran
};

}  // namespace
}  // namespace hsdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hsdp::fuzz;
  static Fixture* fx = new Fixture();
  Node node(fx);
  Script script(data, size);
  Record r;
  for (int ops = 0; script.Next(&r) && ops < 64; ++ops) {
    const uint32_t uid = r.payload.empty() ? 1000 : kUids[static_cast<uint8_t>(r.payload[0]) % 3];
    node.Run(r.op, uid, r.payload.empty() ? r.payload : r.payload.substr(1));
  }
  return 0;
}
