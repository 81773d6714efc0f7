// The device path on a REAL GPU through a real hsdpd (engine.kind: nccl):
// two trainer processes on GPU 0, one sharing a cuMem (VMM) allocation as a
// POSIX fd over its data connection, the other a cudaMalloc block as a legacy
// IPC handle + offset. Each produces its input with an async copy on its own
// stream, records an interprocess producer event and submits without a CPU
// sync; the daemon must wait for it. Work::WaitOnStream makes the trainer's
// stream wait on the daemon's completion event before it reads the result.
// The two trainers are ranks 0 and 1 of one job and all-reduce together:
// both on GPU 0, so the daemon reduces them with its intra-device plan (one
// GPU, no NCCL communicator) — what a one-GPU machine exercises.
// Skips with the reason where no GPU is visible (built only with CUDA).
#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "common/device_wait.h"
#include "daemon/device/cuda_device_api.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "test_util.h"

namespace hsdp {
namespace {

using device::CudaDeviceApi;
using testing::Child;
using testing::DaemonProcess;
using testing::TempDir;

constexpr uint64_t kN = 1 << 16;
constexpr int kNoGpu = 77;

// Runs in a forked child (CUDA is initialised only here).
int Trainer(const std::string& socket, int k, FILE* out) {
  auto api = CudaDeviceApi::Create();
  if (api->DeviceCount() == 0) {
    std::fprintf(out, "no GPU: %s\n", api->unavailable_reason().c_str());
    return kNoGpu;
  }
  auto fail = [&](const std::string& what) {
    std::fprintf(out, "trainer %d FAIL: %s\n", k, what.c_str());
    return 1;
  };
  ClientOptions o;
  o.socket_path = socket;
  // One job, ranks 0 and 1 both on GPU 0: the NCCL engine's intra-device
  // plan (NCCL refuses two ranks of a communicator on one GPU).
  o.job_id = "gpu";
  o.rank = k;
  o.world_size = 2;
  o.device = "cuda:0";
  auto c = Client::Connect(o);
  if (!c.ok()) return fail(c.status().ToString());
  if (!(*c)->device_memory()) return fail("device memory not negotiated");
  const uint64_t bytes = 2 * kN * 4;
  DeviceBufferSpec spec;
  spec.device = 0;
  spec.size_bytes = bytes;
  spec.generation = 1;
  device::DevicePtr data = 0;
  UniqueFd vmm_fd;
  void* legacy = nullptr;
  if (k == 0) {
    auto base = api->Allocate(0, bytes, hsdp::device::AllocSharing::kPosixFd);
    if (!base.ok()) return fail(base.status().ToString());
    auto range = api->GetAddressRange(*base);
    auto fd = api->ExportFd(*base);
    if (!range.ok() || !fd.ok()) return fail("export VMM");
    vmm_fd = *std::move(fd);
    data = *base;
    spec.kind = DeviceHandleKind::kVmmFd;
    spec.fd = vmm_fd.get();
    spec.allocation_bytes = range->bytes;
  } else {
    if (cudaMalloc(&legacy, bytes + 512) != cudaSuccess) return fail("cudaMalloc");
    data = reinterpret_cast<uintptr_t>(legacy) + 512;
    auto range = api->GetAddressRange(data);
    if (!range.ok()) return fail(range.status().ToString());
    auto h = api->ExportLegacy(range->base);
    if (!h.ok()) return fail(h.status().ToString());
    spec.kind = DeviceHandleKind::kLegacyIpc;
    spec.legacy_handle.assign(reinterpret_cast<const char*>(h->data()), h->size());
    spec.offset_bytes = data - range->base;
  }
  auto buf = (*c)->RegisterDeviceBuffer(spec);
  if (!buf.ok()) return fail("register: " + buf.status().ToString());
  auto completion = (*c)->GetCompletionEvents(0);
  auto producer = api->CreateEvent(0, true);
  auto stream = api->CreateStream(0, device::StreamPriority::kDefault);
  auto staging = api->Allocate(0, kN * 4);
  if (!completion.ok() || !producer.ok() || !stream.ok() || !staging.ok()) return fail("setup");
  auto ph = api->ExportEvent(*producer);
  if (!ph.ok()) return fail("export event");
  auto ev_id = (*c)->RegisterDeviceEvent(
      0, std::string(reinterpret_cast<const char*>(ph->data()), ph->size()));
  if (!ev_id.ok()) return fail("register event: " + ev_id.status().ToString());
  auto g = (*c)->NewGroup({0, 1});
  if (!g.ok()) return fail("NewGroup");
  std::vector<float> stale(2 * kN, -1.0f), in(kN);
  for (uint64_t i = 0; i < kN; ++i) in[i] = float((k + 1) * (i % 1000));
  if (!api->CopyToDevice(data, stale.data(), bytes).ok() ||
      !api->CopyToDevice(*staging, in.data(), kN * 4).ok()) {
    return fail("initial copies");
  }
  // Producer: an async copy into the buffer, the event after it, and the
  // submission right away (no CPU sync).
  if (!api->MemcpyAsync(data, *staging, kN * 4, *stream).ok() ||
      !api->RecordEvent(*producer, *stream).ok()) {
    return fail("producer");
  }
  SubmitOptions so;
  so.wait_event_id = *ev_id;
  auto w = (*c)->AllReduce(*g, {*buf, 0}, {*buf, kN * 4}, kN, DataType::kFloat32, {}, so);
  if (!w.ok()) return fail("submit: " + w.status().ToString());
  absl::Status s = w->WaitOnStream(
      [&](uint64_t id) -> absl::Status {
        if (id == 0 || id > completion->size()) return absl::InternalError("bad event id");
        device::IpcHandleBytes h;
        std::memcpy(h.data(), (*completion)[id - 1].data(), h.size());
        auto ce = api->ImportEvent(0, h);
        if (!ce.ok()) return ce.status();
        return api->StreamWaitEvent(*stream, *ce);
      },
      absl::Seconds(60));
  if (!s.ok()) return fail("WaitOnStream: " + s.ToString());
  // Read the result on the stream that waited on the completion event.
  auto done = api->CreateEvent(0, false);
  if (!done.ok() || !api->MemcpyAsync(*staging, data + kN * 4, kN * 4, *stream).ok() ||
      !api->RecordEvent(*done, *stream).ok() || !testing::WaitEventDone(*api, *done).ok()) {
    return fail("read back");
  }
  std::vector<float> got(kN);
  if (!api->CopyToHost(got.data(), *staging, kN * 4).ok()) return fail("copy to host");
  for (uint64_t i = 0; i < kN; ++i) {
    const float want = float(3 * (i % 1000));  // (1 + 2) * (i % 1000): both trainers' inputs
    if (got[i] != want) {
      return fail("[" + std::to_string(i) + "] got " + std::to_string(got[i]) + ", want " +
                  std::to_string(want));
    }
  }
  if (!(*c)->FreeDeviceBuffer(*buf).ok()) return fail("free");
  std::fprintf(out, "trainer %d ok (%s)\n", k, k == 0 ? "vmm fd" : "legacy ipc");
  if (legacy != nullptr) cudaFree(legacy);
  return 0;
}

TEST(CudaDaemonTest, TwoTrainersOnOneGpuBothHandleKindsEventsAndCompletion) {
  TempDir dir;
  DaemonProcess d(dir);
  // Started before any CUDA use in this process (the trainers fork from it).
  Child t0([&](FILE* out) { return Trainer(d.socket(), 0, out); });
  Child t1([&](FILE* out) { return Trainer(d.socket(), 1, out); });
  const bool started = d.Start("engine:\n  kind: nccl\n");
  const int r0 = t0.Finish(120000), r1 = t1.Finish(120000);
  if (r0 == kNoGpu && r1 == kNoGpu) {
    GTEST_SKIP() << "no GPU on this machine: " << t0.output();
  }
  ASSERT_TRUE(started) << d.Log();
  EXPECT_EQ(r0, 0) << t0.output() << d.Log();
  EXPECT_EQ(r1, 0) << t1.output() << d.Log();
  EXPECT_EQ(d.Stop(), 0);
}

}  // namespace
}  // namespace hsdp
