// DeviceRegistration with a real SessionManager and FakeDeviceApi: feature
// negotiation, session ownership, VMM fds arriving over the data connection
// (before or after the call), and session end unmapping everything —
// including a registration that completes after its session ended.
#include "daemon/jobs/device_registration.h"

#include <future>

#include "daemon/server/device_service.h"
#include "daemon/device/fake_device_api.h"
#include "daemon/engine/fake/fake_engine.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/shm/layout.h"

namespace hsdp {
namespace {

class DeviceRegistrationTest : public ::testing::Test {
 protected:
  DeviceRegistrationTest() : dev_(1, 1 << 22), registry_(&dev_) {
    NodeLimits l;
    l.max_node_bytes = 1 << 30;
    l.max_mappings = 100;
    sm_ = std::make_unique<SessionManager>(config_, l, &engine_);
    sm_->EnableFeatures(shm::kFeatureDeviceMemory);
    reg_ = std::make_unique<DeviceRegistration>(sm_.get(), &registry_, absl::Milliseconds(300));
  }
  ~DeviceRegistrationTest() override { sm_->EndAll("test over"); }

  uint64_t Attach(int rank, bool offer_device = true, uint32_t uid = 1000) {
    AttachParams p;
    p.job_id = "j";
    p.rank = rank;
    p.world_size = 4;
    p.protocol_version = shm::kLayoutVersion;
    p.features = shm::kFeaturesImplemented | (offer_device ? uint64_t{shm::kFeatureDeviceMemory} : uint64_t{0});
    auto r = sm_->Attach(p, Cred(uid));
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(sm_->ClaimSession(r->session_id, r->token.data(), Cred(uid)).ok());
    return r->session_id;
  }
  static PeerCred Cred(uint32_t uid) { return PeerCred{1, uid, uid}; }

  absl::StatusOr<uint64_t> RegisterSync(uint64_t sid, DeviceBufferRequest r, uint64_t tag,
                                        uint32_t uid = 1000) {
    std::promise<absl::StatusOr<uint64_t>> p;
    auto f = p.get_future();
    reg_->RegisterBuffer(Cred(uid), sid, std::move(r), tag,
                         [&p](absl::StatusOr<uint64_t> id) { p.set_value(std::move(id)); });
    if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready) {
      return absl::DeadlineExceededError("registration did not complete");
    }
    return f.get();
  }
  DeviceBufferRequest Legacy(device::DevicePtr base, uint64_t size) {
    DeviceBufferRequest r;
    r.kind = device::HandleKind::kLegacyIpc;
    r.device = 0;
    r.handle = *dev_.ExportLegacy(base);
    r.size_bytes = size;
    return r;
  }
  DeviceBufferRequest Vmm(uint64_t bytes) {
    DeviceBufferRequest r;
    r.kind = device::HandleKind::kVmmFd;
    r.device = 0;
    r.allocation_bytes = bytes;
    r.size_bytes = bytes;
    return r;
  }

  NodeConfig config_;
  FakeStreamEngine engine_;
  device::FakeDeviceApi dev_;
  DeviceBufferRegistry registry_;
  std::unique_ptr<SessionManager> sm_;
  std::unique_ptr<DeviceRegistration> reg_;
};

TEST_F(DeviceRegistrationTest, NeedsTheNegotiatedFeatureAndTheOwner) {
  auto base = dev_.Allocate(0, 4096);
  const uint64_t without = Attach(0, /*offer_device=*/false);
  auto r = RegisterSync(without, Legacy(*base, 64), 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  const uint64_t with = Attach(1);
  EXPECT_EQ(RegisterSync(with, Legacy(*base, 64), 0, /*uid=*/2000).status().code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(RegisterSync(9999, Legacy(*base, 64), 0).status().code(), absl::StatusCode::kNotFound);
  auto ok = RegisterSync(with, Legacy(*base, 64), 0);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(IsDeviceBufferId(*ok));
  EXPECT_EQ(reg_->FreeBuffer(Cred(2000), with, *ok).code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(reg_->FreeBuffer(Cred(1000), with, *ok).ok());
}

TEST_F(DeviceRegistrationTest, VmmFdArrivesOverTheDataConnectionBeforeOrAfterTheCall) {
  const uint64_t sid = Attach(0);
  auto base = dev_.Allocate(0, 8192, device::AllocSharing::kPosixFd);
  // Before: the fd is parked until the call claims it.
  sm_->FindSession(sid)->PutFd(5, *dev_.ExportFd(*base), Session::FdKind::kDeviceHandle);
  auto a = RegisterSync(sid, Vmm(8192), 5);
  ASSERT_TRUE(a.ok()) << a.status();
  // An fd passed as a host memfd is not a device handle (and the reverse:
  // session_manager's RegisterBuffer refuses device handles).
  sm_->FindSession(sid)->PutFd(8, *dev_.ExportFd(*base), Session::FdKind::kMemfd);
  auto wrong = RegisterSync(sid, Vmm(8192), 8);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wrong.status().message()), ::testing::HasSubstr("host memfd"));
  // After: the call waits (without blocking) for the fd.
  std::promise<absl::StatusOr<uint64_t>> p;
  reg_->RegisterBuffer(Cred(1000), sid, Vmm(4096), 6,
                       [&p](absl::StatusOr<uint64_t> id) { p.set_value(std::move(id)); });
  auto f = p.get_future();
  EXPECT_EQ(f.wait_for(std::chrono::milliseconds(20)), std::future_status::timeout);
  sm_->FindSession(sid)->PutFd(6, *dev_.ExportFd(*base), Session::FdKind::kDeviceHandle);
  auto b = f.get();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(dev_.live_mappings(), 2);  // two exports: two fds, two identities
  // No fd ever comes: NOT_FOUND once the deadline passes (housekeeping expires it).
  std::promise<absl::StatusOr<uint64_t>> q;
  reg_->RegisterBuffer(Cred(1000), sid, Vmm(4096), 7,
                       [&q](absl::StatusOr<uint64_t> id) { q.set_value(std::move(id)); });
  auto g = q.get_future();
  for (int i = 0; i < 200 && g.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready; ++i) {
    sm_->Housekeeping();
  }
  ASSERT_EQ(g.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_FALSE(g.get().ok());
  EXPECT_EQ(RegisterSync(sid, Vmm(4096), 0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DeviceRegistrationTest, SessionEndUnmapsEverythingEvenMidRegistration) {
  const uint64_t sid = Attach(0);
  auto base = dev_.Allocate(0, 8192, device::AllocSharing::kPosixFd);
  ASSERT_TRUE(RegisterSync(sid, Legacy(*base, 128), 0).ok());
  auto ev = dev_.CreateEvent(0, true);
  auto h = dev_.ExportEvent(*ev);
  std::string bytes(reinterpret_cast<const char*>(h->data()), h->size());
  ASSERT_TRUE(reg_->RegisterEvent(Cred(1000), sid, 0, bytes).ok());
  EXPECT_FALSE(reg_->RegisterEvent(Cred(1000), sid, 0, bytes.substr(0, 10)).ok());
  // A VMM registration waits for its fd while the client dies.
  std::promise<absl::StatusOr<uint64_t>> p;
  reg_->RegisterBuffer(Cred(1000), sid, Vmm(8192), 9,
                       [&p](absl::StatusOr<uint64_t> id) { p.set_value(std::move(id)); });
  auto fd = dev_.ExportFd(*base);
  auto session = sm_->FindSession(sid);
  sm_->EndSession(sid, "client died");
  session->PutFd(9, *std::move(fd), Session::FdKind::kDeviceHandle);  // too late: session ended
  auto f = p.get_future();
  ASSERT_EQ(f.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_FALSE(f.get().ok());
  EXPECT_EQ(dev_.live_mappings(), 0);
  EXPECT_EQ(registry_.node_mappings(), 0u);
  EXPECT_EQ(registry_.Stats(sid).events, 0u);
}

TEST_F(DeviceRegistrationTest, CompletionEventsOnePerRingSlotForTheOwnerOnly) {
  const uint64_t sid = Attach(0);
  const uint32_t slots = sm_->FindSession(sid)->channel().ring_entries();
  EXPECT_EQ(reg_->CompletionEvents(Cred(2000), sid, 0).status().code(),
            absl::StatusCode::kPermissionDenied);
  auto handles = reg_->CompletionEvents(Cred(1000), sid, 0);
  ASSERT_TRUE(handles.ok()) << handles.status();
  EXPECT_EQ(handles->size(), slots);
  EXPECT_TRUE(registry_.CompletionEventFor(sid, 0, 12345).ok());
  sm_->EndSession(sid, "done");
  EXPECT_FALSE(registry_.CompletionEventFor(sid, 0, 1).ok());  // destroyed with the session
}

TEST_F(DeviceRegistrationTest, ProtoTranslationChecksTheHandle) {
  v1::RegisterDeviceBufferRequest req;
  req.set_handle_kind(v1::DEVICE_HANDLE_LEGACY_IPC);
  req.set_ipc_handle(std::string(63, 'x'));
  EXPECT_EQ(DeviceMemoryServiceImpl::FromProto(req).status().code(),
            absl::StatusCode::kInvalidArgument);
  req.set_ipc_handle(std::string(64, 'x'));
  req.set_device(0);
  req.set_offset_bytes(128);
  req.set_size_bytes(256);
  req.set_generation(3);
  auto r = DeviceMemoryServiceImpl::FromProto(req);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->kind, device::HandleKind::kLegacyIpc);
  EXPECT_EQ(r->offset, 128u);
  EXPECT_EQ(r->generation, 3u);
  req.set_handle_kind(static_cast<v1::DeviceHandleKind>(7));
  EXPECT_FALSE(DeviceMemoryServiceImpl::FromProto(req).ok());
}

}  // namespace
}  // namespace hsdp
