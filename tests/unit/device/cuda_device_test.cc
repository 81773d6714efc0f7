// The real CUDA device API and NCCL binding (built with HSDP_WITH_CUDA). On a
// machine without a GPU every test skips with the reason. With one GPU:
// VMM allocation, streams with priorities, events, the scale/cast kernel,
// two-process CUDA IPC with both handle kinds and an interprocess event
// (through DeviceBufferRegistry), and NcclEngine on single-rank
// communicators (two ranks when there are two GPUs).
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "common/device_wait.h"
#include "common/wait.h"
#include "daemon/device/cuda_device_api.h"
#include "daemon/engine/nccl/nccl_collectives.h"
#include "daemon/engine/nccl/nccl_library.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "daemon/session/device_buffers.h"
#include "gtest/gtest.h"
#include "hsdp/common/unix_socket.h"
#include "tests/unit/device/cuda_ipc_message.h"

extern char** environ;

namespace hsdp {
namespace {

using device::CudaDeviceApi;

std::unique_ptr<CudaDeviceApi> ApiOrSkipReason(std::string* reason) {
  auto api = CudaDeviceApi::Create();
  if (api->DeviceCount() == 0) *reason = "no GPU on this machine (" + api->unavailable_reason() + ")";
  return api;
}

#define SKIP_WITHOUT_GPU(api)                                  \
  std::string skip_reason_;                                    \
  auto api = ApiOrSkipReason(&skip_reason_);                   \
  if (api->DeviceCount() == 0) GTEST_SKIP() << skip_reason_

TEST(CudaDeviceTest, ReportsDevicesOrWhyNot) {
  auto api = CudaDeviceApi::Create();
  if (api->DeviceCount() == 0) {
    EXPECT_FALSE(api->unavailable_reason().empty());
    EXPECT_FALSE(api->Allocate(0, 16).ok());  // refused, not a crash
    GTEST_SKIP() << "no GPU on this machine (" << api->unavailable_reason() << ")";
  }
  EXPECT_TRUE(api->unavailable_reason().empty());
}

TEST(CudaDeviceTest, VmmStreamsEventsAndTheScaleCastKernel) {
  SKIP_WITHOUT_GPU(api);
  const uint64_t n = 1 << 16;
  auto src = api->Allocate(0, n * 4);
  auto mid = api->Allocate(0, n * 2);
  ASSERT_TRUE(src.ok() && mid.ok()) << src.status() << mid.status();
  auto range = api->GetAddressRange(*src + 100);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_EQ(range->base, *src);
  std::vector<float> in(n);
  for (uint64_t i = 0; i < n; ++i) in[i] = float(i % 256);
  ASSERT_TRUE(api->CopyToDevice(*src, in.data(), n * 4).ok());
  auto hi = api->CreateStream(0, device::StreamPriority::kHigh);
  auto lo = api->CreateStream(0, device::StreamPriority::kDefault);
  ASSERT_TRUE(hi.ok() && lo.ok());
  auto ev = api->CreateEvent(0, false);
  ASSERT_TRUE(ev.ok());
  // hi: f32 -> bf16 * 0.5 ; lo waits on it, then bf16 -> f32 * 4, in place into src.
  ASSERT_TRUE(api->ScaleCastAsync(*src, DataType::kFloat32, *mid, DataType::kBFloat16, n, 0.5, *hi).ok());
  ASSERT_TRUE(api->RecordEvent(*ev, *hi).ok());
  ASSERT_TRUE(api->StreamWaitEvent(*lo, *ev).ok());
  ASSERT_TRUE(api->ScaleCastAsync(*mid, DataType::kBFloat16, *src, DataType::kFloat32, n, 4.0, *lo).ok());
  auto done = api->CreateEvent(0, false);
  ASSERT_TRUE(api->RecordEvent(*done, *lo).ok());
  ASSERT_TRUE(testing::WaitEventDone(*api, *done).ok());
  std::vector<float> out(n);
  ASSERT_TRUE(api->CopyToHost(out.data(), *src, n * 4).ok());
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], 2.0f * in[i]) << i;
  api->DestroyEvent(*ev);
  api->DestroyEvent(*done);
  api->DestroyStream(*hi);
  api->DestroyStream(*lo);
  EXPECT_TRUE(api->Free(*src).ok());
  EXPECT_TRUE(api->Free(*mid).ok());
}

TEST(CudaIpcTest, TwoProcessesShareBothHandleKindsAndAProducerEvent) {
  // The peer initialises CUDA itself; this process only after it reported.
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  ASSERT_GT(len, 0);
  exe[len] = 0;
  std::string peer = std::string(exe);
  peer = peer.substr(0, peer.rfind('/')) + "/cuda_ipc_peer";
  std::string fd_arg = std::to_string(sv[1]);
  char* argv[] = {peer.data(), fd_arg.data(), nullptr};
  pid_t pid = 0;
  ASSERT_EQ(::posix_spawn(&pid, peer.c_str(), nullptr, nullptr, argv, environ), 0) << peer;
  ::close(sv[1]);
  UniqueFd sock(sv[0]);
  IpcMessage msg{};
  std::vector<UniqueFd> fds;
  ASSERT_TRUE(RecvWithFds(sock.get(), &msg, sizeof(msg), &fds, 60000).ok());
  if (msg.tag == 'S') {
    int st = 0;
    ::waitpid(pid, &st, 0);
    GTEST_SKIP() << "no GPU on this machine (the peer found none)";
  }
  ASSERT_EQ(msg.tag, 'H');
  ASSERT_EQ(fds.size(), 1u);
  auto api = CudaDeviceApi::Create();
  ASSERT_GT(api->DeviceCount(), 0);
  DeviceBufferRegistry reg(api.get());
  DeviceBufferRequest vmm;
  vmm.kind = device::HandleKind::kVmmFd;
  vmm.device = 0;
  vmm.fd = std::move(fds[0]);
  vmm.allocation_bytes = msg.vmm_bytes;
  vmm.size_bytes = msg.vmm_bytes;
  auto vmm_id = reg.Register(1, std::move(vmm));
  ASSERT_TRUE(vmm_id.ok()) << vmm_id.status();
  DeviceBufferRequest legacy;
  legacy.kind = device::HandleKind::kLegacyIpc;
  legacy.device = 0;
  legacy.handle = msg.legacy;
  legacy.offset = msg.legacy_offset;
  legacy.size_bytes = kIpcElems * 4;
  auto legacy_id = reg.Register(1, std::move(legacy));
  ASSERT_TRUE(legacy_id.ok()) << legacy_id.status();
  auto event_id = reg.RegisterEvent(1, 0, msg.event);
  ASSERT_TRUE(event_id.ok()) << event_id.status();
  auto a = reg.Resolve(1, *vmm_id, 0, kIpcElems * 4, "send");
  auto b = reg.Resolve(1, *legacy_id, 0, kIpcElems * 4, "send");
  auto ev = reg.FindEvent(1, *event_id, 0);
  ASSERT_TRUE(a.ok() && b.ok() && ev.ok());
  // The daemon's stream waits for the producer, then doubles both buffers.
  auto stream = api->CreateStream(0, device::StreamPriority::kHigh);
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE(api->StreamWaitEvent(*stream, *ev).ok());
  ASSERT_TRUE(api->ScaleCastAsync(a->ptr, DataType::kFloat32, a->ptr, DataType::kFloat32, kIpcElems, 2.0, *stream).ok());
  ASSERT_TRUE(api->ScaleCastAsync(b->ptr, DataType::kFloat32, b->ptr, DataType::kFloat32, kIpcElems, 2.0, *stream).ok());
  auto done = api->CreateEvent(0, false);
  ASSERT_TRUE(api->RecordEvent(*done, *stream).ok());
  ASSERT_TRUE(testing::WaitEventDone(*api, *done).ok());
  char d = 'D';
  ASSERT_TRUE(SendWithFds(sock.get(), &d, 1, {}).ok());
  int st = 0;
  ASSERT_EQ(::waitpid(pid, &st, 0), pid);
  EXPECT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0) << "the peer saw wrong data (exit code)";
  EXPECT_EQ(reg.Stats(1).mappings, 2u);
  reg.EndSession(1);
  EXPECT_EQ(reg.node_mappings(), 0u);
}

struct Done {
  std::promise<absl::Status> p;
  EngineCallbacks Callbacks() {
    EngineCallbacks cb;
    cb.launched = [](uint64_t) {};
    cb.completed = [this](absl::Status s, uint64_t) { p.set_value(s); };
    return cb;
  }
  absl::Status Wait() {
    auto f = p.get_future();
    if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
      return absl::DeadlineExceededError("no completion in 60 s");
    }
    return f.get();
  }
};

TEST(NcclEngineCudaTest, CollectivesOnRealCommunicators) {
  SKIP_WITHOUT_GPU(api);
  auto nccl_lib = nccl::NcclLibrary::Default();
  ASSERT_TRUE(nccl_lib.ok()) << nccl_lib.status();
  nccl::NcclCollectives coll(*nccl_lib);
  nccl::NcclEngine engine(api.get(), &coll);
  const int n = std::min(api->DeviceCount(), 2);
  const uint64_t count = 4096;
  std::vector<device::DevicePtr> buf(n);
  std::vector<float> host(count);
  for (uint64_t i = 0; i < count; ++i) host[i] = float(i % 64);
  EngineTask t;
  t.collective = Collective::kAllReduce;
  t.count = count;
  t.group_key = "cuda";
  t.spec.dtype = DataType::kFloat32;
  t.spec.op = ReduceOp::kAvg;
  t.spec.pre_divide = 2;     // PreMulSum(1/2) ...
  t.spec.post_divide = 0.5;  // ... and an in-place scale by 1/(0.5 n)
  for (int r = 0; r < n; ++r) {
    auto p = api->Allocate(r, count * 4);
    ASSERT_TRUE(p.ok());
    buf[r] = *p;
    ASSERT_TRUE(api->CopyToDevice(buf[r], host.data(), count * 4).ok());
    EngineMember m;
    m.global_rank = r;
    m.send = m.recv = BufferView{MemoryKind::kDevice, r, reinterpret_cast<void*>(buf[r]), count * 4};
    t.members.push_back(m);
  }
  Done d1;
  engine.Launch(t, d1.Callbacks());
  ASSERT_TRUE(d1.Wait().ok());
  std::vector<float> out(count);
  ASSERT_TRUE(api->CopyToHost(out.data(), buf[0], count * 4).ok());
  // sum over n of x/2, divided by 0.5 n: x.
  for (uint64_t i = 0; i < count; ++i) ASSERT_FLOAT_EQ(out[i], host[i]) << i;
  // The same, through a bf16 wire (cast kernels around the collective).
  t.spec.wire_dtype = DataType::kBFloat16;
  Done d2;
  engine.Launch(t, d2.Callbacks());
  ASSERT_TRUE(d2.Wait().ok());
  ASSERT_TRUE(api->CopyToHost(out.data(), buf[0], count * 4).ok());
  for (uint64_t i = 0; i < count; ++i) ASSERT_FLOAT_EQ(out[i], host[i]) << i;
  EXPECT_EQ(engine.stats().comm_inits, 1u);
  engine.Shutdown();
  for (auto p : buf) EXPECT_TRUE(api->Free(p).ok());
}

// A trainer's producer stream held back by a host function until release:
// the producer event recorded behind it stays pending.
class HeldProducer {
 public:
  // The stream is the API's own (it records events only on streams it made;
  // the first H200 run of this test used a bare cudaStream_t and the record
  // was refused).
  explicit HeldProducer(CudaDeviceApi& api) : api_(api) {
    auto s = api_.CreateStream(0, device::StreamPriority::kDefault);
    EXPECT_TRUE(s.ok()) << s.status();
    handle_ = *s;
    EXPECT_EQ(cudaLaunchHostFunc(reinterpret_cast<cudaStream_t>(handle_), &HeldProducer::Hold,
                                 &released_),
              cudaSuccess);
    auto ev = api_.CreateEvent(0, /*interprocess=*/true);
    EXPECT_TRUE(ev.ok()) << ev.status();
    event_ = *ev;
    EXPECT_TRUE(api_.RecordEvent(event_, handle_).ok());
    auto done = api_.EventDone(event_);
    EXPECT_TRUE(done.ok() && !*done) << "the producer event must be pending";
  }
  ~HeldProducer() {
    Release();
    (void)cudaStreamSynchronize(reinterpret_cast<cudaStream_t>(handle_));
    api_.DestroyEvent(event_);
    api_.DestroyStream(handle_);
  }
  void Release() { released_.store(true); }
  device::EventHandle event() const { return event_; }

 private:
  static void CUDART_CB Hold(void* flag) {
    auto* released = static_cast<std::atomic<bool>*>(flag);
    while (!released->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  CudaDeviceApi& api_;
  device::StreamHandle handle_ = 0;
  std::atomic<bool> released_{false};
  device::EventHandle event_ = 0;
};

EngineTask OneRankAllReduce(device::DevicePtr buf, uint64_t count, const std::string& group,
                            uint32_t epoch) {
  EngineTask t;
  t.collective = Collective::kAllReduce;
  t.count = count;
  t.group_key = group;
  t.epoch = epoch;
  t.spec.dtype = DataType::kFloat32;
  EngineMember m;
  m.global_rank = 0;
  m.send = m.recv = BufferView{MemoryKind::kDevice, 0, reinterpret_cast<void*>(buf), count * 4};
  t.members.push_back(m);
  return t;
}

// Work queued behind a producer that never finishes is
// failed (abort, then the op timeout) without hanging the engine or poisoning
// the context: the group's next epoch gets new communicators and runs, and
// the held-back producer finishes normally once released.
TEST(NcclEngineCudaTest, HeldBackProducerAbortTimeoutAndANewEpoch) {
  SKIP_WITHOUT_GPU(api);
  auto nccl_lib = nccl::NcclLibrary::Default();
  ASSERT_TRUE(nccl_lib.ok()) << nccl_lib.status();
  nccl::NcclCollectives coll(*nccl_lib);
  nccl::NcclEngineOptions o;
  o.op_timeout = absl::Milliseconds(500);
  nccl::NcclEngine engine(api.get(), &coll, o);
  const uint64_t count = 1024;
  auto buf = api->Allocate(0, count * 4);
  ASSERT_TRUE(buf.ok()) << buf.status();
  std::vector<float> ones(count, 1.0f), out(count);
  ASSERT_TRUE(api->CopyToDevice(*buf, ones.data(), count * 4).ok());

  // 1. An abort of a task waiting on the held-back producer.
  {
    HeldProducer held(*api);
    EngineTask t = OneRankAllReduce(*buf, count, "held", 1);
    t.members[0].wait_event = held.event();
    Done d;
    const uint64_t ticket = engine.Launch(t, d.Callbacks());
    // The gate holds it (its producer is pending): the abort drops a held task.
    EXPECT_EQ(testing::EventuallyEq([&] { return engine.stats().gated_tasks; }, uint64_t{1}, 5000),
              1u);
    engine.Abort(ticket, absl::AbortedError("trainer left"));
    EXPECT_EQ(d.Wait().code(), absl::StatusCode::kAborted);
    held.Release();
  }
  // 2. The op timeout of a task waiting on it.
  {
    HeldProducer held(*api);
    EngineTask t = OneRankAllReduce(*buf, count, "held", 1);
    t.members[0].wait_event = held.event();
    Done d;
    engine.Launch(t, d.Callbacks());
    EXPECT_EQ(d.Wait().code(), absl::StatusCode::kDeadlineExceeded);
    held.Release();
  }
  // 3. The next epoch runs on the same context, with a result.
  Done d3;
  engine.Launch(OneRankAllReduce(*buf, count, "held", 2), d3.Callbacks());
  ASSERT_TRUE(d3.Wait().ok());
  ASSERT_TRUE(api->CopyToHost(out.data(), *buf, count * 4).ok());
  EXPECT_EQ(out, ones);  // one rank: the sum is the input
  EXPECT_GE(engine.stats().comm_inits, 1u);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "the context is not poisoned";
  engine.Shutdown();
  EXPECT_TRUE(api->Free(*buf).ok());
}

// Shard collectives (all-gather, reduce-scatter) run on a stream of the
// device's greatest priority, the all-reduce on a default-priority one.
TEST(NcclEngineCudaTest, ShardCollectivesRunOnTheHighestPriorityStream) {
  SKIP_WITHOUT_GPU(api);
  auto nccl_lib = nccl::NcclLibrary::Default();
  ASSERT_TRUE(nccl_lib.ok()) << nccl_lib.status();
  nccl::NcclCollectives coll(*nccl_lib);
  nccl::NcclEngine engine(api.get(), &coll);
  const uint64_t count = 1024;
  auto a = api->Allocate(0, count * 4);
  auto b = api->Allocate(0, count * 4);
  ASSERT_TRUE(a.ok() && b.ok());
  for (Collective c : {Collective::kAllGather, Collective::kAllReduce}) {
    EngineTask t = OneRankAllReduce(*a, count, "prio", 1);
    t.collective = c;
    t.members[0].recv = BufferView{MemoryKind::kDevice, 0, reinterpret_cast<void*>(*b), count * 4};
    Done d;
    engine.Launch(t, d.Callbacks());
    ASSERT_TRUE(d.Wait().ok()) << static_cast<int>(c);
  }
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  int high = 1, normal = 1;
  ASSERT_EQ(cudaStreamGetPriority(
                reinterpret_cast<cudaStream_t>(engine.StreamOf("prio", 0, true)), &high),
            cudaSuccess);
  ASSERT_EQ(cudaStreamGetPriority(
                reinterpret_cast<cudaStream_t>(engine.StreamOf("prio", 0, false)), &normal),
            cudaSuccess);
  EXPECT_EQ(high, greatest);
  EXPECT_LT(high, normal) << "lower numbers are higher priorities";
  engine.Shutdown();
  EXPECT_TRUE(api->Free(*a).ok());
  EXPECT_TRUE(api->Free(*b).ok());
}

}  // namespace
}  // namespace hsdp
