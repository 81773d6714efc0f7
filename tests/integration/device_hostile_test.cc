// Hostile input on the device path of a real hsdpd (engine.device: fake):
// raw sessions that write descriptors and pass fds themselves. Each case
// gets a clear error (or ends only the offending session) and the daemon
// keeps serving.
#include <sys/mman.h>
#include <sys/socket.h>

#include <cstring>

#include "device_fake_util.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "hsdp/v1/device.grpc.pb.h"
#include "raw_session.h"
#include "test_util.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using testing::DaemonProcess;
using testing::FakeDeviceConfig;
using testing::FakeTrainerDevice;
using testing::RawSession;
using testing::TempDir;

constexpr uint64_t kFeatures = shm::kFeaturesImplemented | shm::kFeatureDeviceMemory;
constexpr uint64_t kBytes = 64 * 1024;

std::unique_ptr<v1::DeviceMemory::Stub> DeviceStub(const std::string& socket) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  return v1::DeviceMemory::NewStub(
      grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args));
}

grpc::Status RegisterLegacy(v1::DeviceMemory::Stub* stub, uint64_t session,
                            const FakeTrainerDevice::Allocation& a, uint64_t offset,
                            uint64_t size, uint64_t* id) {
  v1::RegisterDeviceBufferRequest req;
  req.set_session_id(session);
  req.set_handle_kind(v1::DEVICE_HANDLE_LEGACY_IPC);
  req.set_device(0);
  req.set_ipc_handle(std::string(reinterpret_cast<const char*>(a.handle.data()), a.handle.size()));
  req.set_offset_bytes(offset);
  req.set_size_bytes(size);
  req.set_generation(1);
  v1::RegisterDeviceBufferResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::Status s = stub->RegisterDeviceBuffer(&ctx, req, &resp);
  if (id != nullptr) *id = resp.buffer_id();
  return s;
}

grpc::Status RegisterVmmTag(v1::DeviceMemory::Stub* stub, uint64_t session, uint64_t tag) {
  v1::RegisterDeviceBufferRequest req;
  req.set_session_id(session);
  req.set_handle_kind(v1::DEVICE_HANDLE_VMM_FD);
  req.set_device(0);
  req.set_fd_tag(tag);
  req.set_allocation_bytes(kBytes);
  req.set_size_bytes(kBytes);
  v1::RegisterDeviceBufferResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return stub->RegisterDeviceBuffer(&ctx, req, &resp);
}

shm::OpDescriptor AllReduce(uint64_t op_id, uint32_t group, uint64_t seq, uint64_t send_id,
                            uint64_t send_off, uint64_t recv_id, uint64_t recv_off,
                            uint64_t count) {
  shm::OpDescriptor d{};
  d.op_id = op_id;
  d.seq = seq;
  d.group_id = group;
  d.epoch = 1;
  d.collective = static_cast<uint8_t>(Collective::kAllReduce);
  d.dtype = static_cast<uint8_t>(DataType::kFloat32);
  d.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  d.premul_factor = d.pre_divide = d.post_divide = 1.0;
  d.count = count;
  d.send = {send_id, send_off};
  d.recv = {recv_id, recv_off};
  return d;
}

absl::Status SendFd(int conn, int fd, uint32_t kind, uint64_t tag) {
  shm::FdMessage msg{shm::kFdMessageMagic, kind, tag};
  return SendWithFds(conn, &msg, sizeof(msg), {fd});
}

// The daemon still runs a host collective for a fresh client.
void ExpectServing(const std::string& socket, const std::string& job) {
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = job;
  auto c = Client::Connect(o);
  ASSERT_TRUE(c.ok()) << c.status();
  auto g = (*c)->NewGroup({0});
  auto b = (*c)->AllocateBuffer(4096);
  ASSERT_TRUE(g.ok() && b.ok());
  static_cast<float*>(b->data)[0] = 3.0f;
  auto w = (*c)->AllReduce(*g, {b->id, 0}, {b->id, 2048}, 1, DataType::kFloat32);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->Wait(absl::Seconds(20)).ok());
  EXPECT_EQ(static_cast<float*>(b->data)[512], 3.0f);
}

TEST(DeviceHostileTest, DescriptorsNamingBadDeviceBuffersGetClearErrors) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  auto stub = DeviceStub(d.socket());
  FakeTrainerDevice dev;
  auto mem = dev.AllocateLegacy(kBytes, 1);
  ASSERT_TRUE(mem.ok());

  // Session A holds two device buffers; B holds one (same numbering: ids
  // are per session, so B's first id equals A's first).
  RawSession a, b;
  ASSERT_TRUE(a.Open(d.socket(), "a", 0, 1, kFeatures).ok());
  ASSERT_TRUE(b.Open(d.socket(), "b", 0, 1, kFeatures).ok());
  ASSERT_NE(b.features() & shm::kFeatureDeviceMemory, 0u);
  uint64_t a1 = 0, a2 = 0, b1 = 0;
  ASSERT_TRUE(RegisterLegacy(stub.get(), a.session_id(), **mem, 0, 8192, &a1).ok());
  ASSERT_TRUE(RegisterLegacy(stub.get(), a.session_id(), **mem, 8192, 8192, &a2).ok());
  ASSERT_TRUE(RegisterLegacy(stub.get(), b.session_id(), **mem, 0, 8192, &b1).ok());
  EXPECT_NE(a2 & shm::kDeviceBufferIdBit, 0u);
  auto g = b.NewGroup({0});
  ASSERT_TRUE(g.ok()) << g.status();

  // Another session's buffer id.
  b.Push(AllReduce(1, *g, 1, a2, 0, b1, 4096, 16));
  auto s1 = b.Completion(1, 10000);
  ASSERT_TRUE(s1.has_value());
  EXPECT_EQ(s1->code(), absl::StatusCode::kInvalidArgument) << *s1;
  EXPECT_THAT(s1->message(), HasSubstr("unknown device buffer"));

  // Out of range (offset past the end, and a range crossing it).
  b.Push(AllReduce(2, *g, 2, b1, 8192, b1, 0, 1));
  b.Push(AllReduce(3, *g, 3, b1, 8000, b1, 0, 64));
  for (uint64_t op : {2, 3}) {
    auto s = b.Completion(op, 10000);
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(s->code(), absl::StatusCode::kInvalidArgument) << *s;
    EXPECT_THAT(s->message(), HasSubstr("send.offset_bytes"));
  }
  // Overlapping send and recv that are not in place.
  b.Push(AllReduce(4, *g, 4, b1, 0, b1, 4, 16));
  auto s4 = b.Completion(4, 10000);
  ASSERT_TRUE(s4.has_value());
  EXPECT_THAT(s4->message(), HasSubstr("in-place"));
  // An unknown producer event.
  shm::OpDescriptor ev = AllReduce(5, *g, 5, b1, 0, b1, 4096, 16);
  ev.flags = shm::kFlagWaitEvent;
  ev.event_id = 77;
  b.Push(ev);
  auto s5 = b.Completion(5, 10000);
  ASSERT_TRUE(s5.has_value());
  EXPECT_THAT(s5->message(), HasSubstr("event_id"));
  // A registration outside the allocation.
  grpc::Status r = RegisterLegacy(stub.get(), b.session_id(), **mem, kBytes - 8, 64, nullptr);
  EXPECT_EQ(r.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.error_message();
  EXPECT_THAT(r.error_message(), HasSubstr("outside the allocation"));
  // Another session's RPC (same uid may not name a session it does not own
  // through the data path; here: a session id that does not exist).
  r = RegisterLegacy(stub.get(), 987654321, **mem, 0, 64, nullptr);
  EXPECT_EQ(r.error_code(), grpc::StatusCode::NOT_FOUND) << r.error_message();

  // A valid op still runs in B afterwards (sequence numbers were consumed).
  auto* f = static_cast<float*>((*mem)->data);
  for (int i = 0; i < 16; ++i) f[i] = float(i);
  b.Push(AllReduce(6, *g, 6, b1, 0, b1, 4096, 16));
  auto s6 = b.Completion(6, 10000);
  ASSERT_TRUE(s6.has_value());
  EXPECT_TRUE(s6->ok()) << *s6;
  EXPECT_EQ(f[1024 + 15], 15.0f);
  EXPECT_FALSE(a.closed());
  EXPECT_FALSE(b.closed());
  ExpectServing(d.socket(), "after");
  FakeTrainerDevice::Free(std::move(*mem));
  EXPECT_EQ(d.Stop(), 0);
}

TEST(DeviceHostileTest, FdsOfTheWrongKindAreRefused) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  auto stub = DeviceStub(d.socket());

  // A memfd passed as a device handle cannot be claimed by a host
  // RegisterBuffer; one passed as a memfd cannot be claimed as a device
  // handle. Both sessions live on.
  RawSession s;
  ASSERT_TRUE(s.Open(d.socket(), "kinds", 0, 1, kFeatures).ok());
  FakeTrainerDevice dev;
  auto vmm = dev.AllocateVmm(kBytes);
  ASSERT_TRUE(vmm.ok());
  ASSERT_TRUE(SendFd(s.data_fd(), (*vmm)->fd.get(), shm::kFdKindDeviceHandle, 41).ok());
  {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    auto node = v1::Node::NewStub(grpc::CreateCustomChannel(
        "unix:" + d.socket(), grpc::InsecureChannelCredentials(), args));
    v1::RegisterBufferRequest req;
    req.set_session_id(s.session_id());
    req.set_fd_tag(41);
    req.set_size_bytes(kBytes);
    v1::RegisterBufferResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    grpc::Status r = node->RegisterBuffer(&ctx, req, &resp);
    EXPECT_EQ(r.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.error_message();
    EXPECT_THAT(r.error_message(), HasSubstr("device-memory handle"));
  }
  ASSERT_TRUE(SendFd(s.data_fd(), (*vmm)->fd.get(), shm::kFdKindMemfd, 42).ok());
  grpc::Status r = RegisterVmmTag(stub.get(), s.session_id(), 42);
  EXPECT_EQ(r.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << r.error_message();
  EXPECT_THAT(r.error_message(), HasSubstr("host memfd"));
  // The right kind works.
  ASSERT_TRUE(SendFd(s.data_fd(), (*vmm)->fd.get(), shm::kFdKindDeviceHandle, 43).ok());
  r = RegisterVmmTag(stub.get(), s.session_id(), 43);
  EXPECT_TRUE(r.ok()) << r.error_message();
  EXPECT_FALSE(s.closed());

  // A socket passed as a device handle ends only that session.
  RawSession bad;
  ASSERT_TRUE(bad.Open(d.socket(), "socket", 0, 1, kFeatures).ok());
  int sp[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
  ASSERT_TRUE(SendFd(bad.data_fd(), sp[0], shm::kFdKindDeviceHandle, 1).ok());
  ::close(sp[0]);
  ::close(sp[1]);
  EXPECT_TRUE(testing::Eventually([&] { return bad.closed(); }, 10000));
  // An unknown fd kind ends the session too.
  RawSession odd;
  ASSERT_TRUE(odd.Open(d.socket(), "odd", 0, 1, kFeatures).ok());
  ASSERT_TRUE(SendFd(odd.data_fd(), (*vmm)->fd.get(), 7, 1).ok());
  EXPECT_TRUE(testing::Eventually([&] { return odd.closed(); }, 10000));
  EXPECT_FALSE(s.closed());
  EXPECT_THAT(d.Log(), HasSubstr("a socket as a device-memory handle"));
  ExpectServing(d.socket(), "after");
  FakeTrainerDevice::Free(std::move(*vmm));
  EXPECT_EQ(d.Stop(), 0);
}

TEST(DeviceHostileTest, WithoutTheFeatureDeviceMemoryIsRefused) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(FakeDeviceConfig())) << d.Log();
  auto stub = DeviceStub(d.socket());
  FakeTrainerDevice dev;
  auto mem = dev.AllocateLegacy(kBytes, 2);
  ASSERT_TRUE(mem.ok());

  // A session that did not offer device memory.
  RawSession s;
  ASSERT_TRUE(s.Open(d.socket(), "nofeature", 0, 1).ok());
  EXPECT_EQ(s.features() & shm::kFeatureDeviceMemory, 0u);
  grpc::Status r = RegisterLegacy(stub.get(), s.session_id(), **mem, 0, 64, nullptr);
  EXPECT_EQ(r.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << r.error_message();
  EXPECT_THAT(r.error_message(), HasSubstr("did not negotiate device memory"));
  auto g = s.NewGroup({0});
  ASSERT_TRUE(g.ok());
  s.Push(AllReduce(1, *g, 1, shm::kDeviceBufferIdBit | 1, 0, shm::kDeviceBufferIdBit | 1, 64, 4));
  auto c = s.Completion(1, 10000);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(c->code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c->message(), HasSubstr("did not negotiate"));
  // A wait-event flag without the feature.
  char* host = nullptr;
  auto hb = s.RegisterBuffer(4096, &host);
  ASSERT_TRUE(hb.ok());
  shm::OpDescriptor ev = AllReduce(2, *g, 2, *hb, 0, *hb, 1024, 4);
  ev.flags = shm::kFlagWaitEvent;
  ev.event_id = 1;
  s.Push(ev);
  c = s.Completion(2, 10000);
  ASSERT_TRUE(c.has_value());
  EXPECT_THAT(c->message(), HasSubstr("flags"));
  // A device handle fd from such a session ends it.
  auto vmm = dev.AllocateVmm(4096);
  ASSERT_TRUE(vmm.ok());
  ASSERT_TRUE(SendFd(s.data_fd(), (*vmm)->fd.get(), shm::kFdKindDeviceHandle, 9).ok());
  EXPECT_TRUE(testing::Eventually([&] { return s.closed(); }, 10000));

  // The C++ client that does not offer it: a clear local error.
  ClientOptions o;
  o.socket_path = d.socket();
  o.job_id = "client";
  o.offer_device_memory = false;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok());
  EXPECT_FALSE((*client)->device_memory());
  auto id = (*client)->RegisterDeviceBuffer(DeviceBufferSpec{});
  EXPECT_EQ(id.status().code(), absl::StatusCode::kFailedPrecondition);
  ExpectServing(d.socket(), "after");
  FakeTrainerDevice::Free(std::move(*mem));
  FakeTrainerDevice::Free(std::move(*vmm));
  EXPECT_EQ(d.Stop(), 0);
}

// engine.kind: cpu runs no device engine: device memory is not negotiated,
// the DeviceMemory service is not served, host collectives run.
TEST(DeviceHostileTest, CpuDaemonOffersNoDeviceMemory) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start("engine:\n  kind: cpu\n")) << d.Log();
  RawSession s;
  ASSERT_TRUE(s.Open(d.socket(), "cpu", 0, 1, kFeatures).ok());
  EXPECT_EQ(s.features() & shm::kFeatureDeviceMemory, 0u);
  auto stub = DeviceStub(d.socket());
  grpc::Status r = RegisterVmmTag(stub.get(), s.session_id(), 1);
  EXPECT_EQ(r.error_code(), grpc::StatusCode::UNIMPLEMENTED) << r.error_message();
  ExpectServing(d.socket(), "host");
  EXPECT_EQ(d.Stop(), 0);
}

// engine.device: fake is refused where it cannot mean anything.
TEST(DeviceHostileTest, FakeDeviceNeedsADeviceEngine) {
  TempDir dir;
  DaemonProcess d(dir);
  // The socket is bound before the engine is built: wait for the exit.
  ASSERT_TRUE(d.Start("engine:\n  kind: cpu\n  device: fake\n", {}, {}, /*wait_ready=*/false));
  EXPECT_TRUE(testing::Eventually([&] { return !d.Alive(); }, 10000));
  EXPECT_THAT(d.Log(), HasSubstr("needs engine.kind nccl or auto"));
}

}  // namespace
}  // namespace hsdp
