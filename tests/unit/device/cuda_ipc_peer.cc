// The "trainer" side of cuda_device_test's two-process IPC test: allocates
// a VMM buffer and a cudaMalloc buffer, fills them on a stream, records an
// interprocess event after the fill, and sends the daemon side (over the
// socketpair fd in argv[1]) a legacy IPC handle, the event handle and the
// VMM allocation as an fd (SCM_RIGHTS). Then waits for 'D' and checks that
// the daemon side doubled both buffers. Exit 0 = all good; 2 = no GPU.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "daemon/device/cuda_device_api.h"
#include "hsdp/common/unix_socket.h"
#include "tests/unit/device/cuda_ipc_message.h"

using namespace hsdp;

int main(int argc, char** argv) {
  if (argc != 2) return 3;
  const int sock = std::atoi(argv[1]);
  auto api = device::CudaDeviceApi::Create();
  IpcMessage msg{};
  if (api->DeviceCount() == 0) {
    msg.tag = 'S';
    (void)SendWithFds(sock, &msg, sizeof(msg), {});
    return 2;
  }
  constexpr uint64_t kElems = kIpcElems;
  std::vector<float> a(kElems), b(kElems);
  for (uint64_t i = 0; i < kElems; ++i) {
    a[i] = float(i);
    b[i] = float(3 * i + 1);
  }
  auto vmm = api->Allocate(0, kElems * 4, hsdp::device::AllocSharing::kPosixFd);
  void* legacy = nullptr;
  if (!vmm.ok() || cudaMalloc(&legacy, kElems * 4 + kIpcLegacyOffset) != cudaSuccess) return 4;
  const auto legacy_ptr = reinterpret_cast<device::DevicePtr>(legacy);
  auto stream = api->CreateStream(0, device::StreamPriority::kDefault);
  auto event = api->CreateEvent(0, true);
  if (!stream.ok() || !event.ok()) return 5;
  // Host staging -> device on the stream; the event marks "produced".
  auto staging_a = api->Allocate(0, kElems * 4);
  auto staging_b = api->Allocate(0, kElems * 4);
  if (!staging_a.ok() || !staging_b.ok()) return 6;
  if (!api->CopyToDevice(*staging_a, a.data(), kElems * 4).ok() ||
      !api->CopyToDevice(*staging_b, b.data(), kElems * 4).ok()) return 7;
  if (!api->MemcpyAsync(*vmm, *staging_a, kElems * 4, *stream).ok() ||
      !api->MemcpyAsync(legacy_ptr + kIpcLegacyOffset, *staging_b, kElems * 4, *stream).ok() ||
      !api->RecordEvent(*event, *stream).ok()) return 8;
  auto range = api->GetAddressRange(legacy_ptr + kIpcLegacyOffset);
  auto legacy_handle = range.ok() ? api->ExportLegacy(range->base) : range.status();
  auto event_handle = api->ExportEvent(*event);
  auto fd = api->ExportFd(*vmm);
  if (!legacy_handle.ok() || !event_handle.ok() || !fd.ok()) {
    std::fprintf(stderr, "peer export failed: %s %s %s\n",
                 std::string(legacy_handle.status().message()).c_str(),
                 std::string(event_handle.status().message()).c_str(),
                 std::string(fd.status().message()).c_str());
    return 9;
  }
  msg.tag = 'H';
  msg.vmm_bytes = kElems * 4;
  msg.legacy_offset = legacy_ptr + kIpcLegacyOffset - range->base;
  msg.legacy = *legacy_handle;
  msg.event = *event_handle;
  if (!SendWithFds(sock, &msg, sizeof(msg), {fd->get()}).ok()) return 10;
  char done = 0;
  if (!RecvWithFds(sock, &done, 1, nullptr, 60000).ok() || done != 'D') return 11;
  if (!api->CopyToHost(a.data(), *vmm, kElems * 4).ok() ||
      !api->CopyToHost(b.data(), legacy_ptr + kIpcLegacyOffset, kElems * 4).ok()) return 12;
  for (uint64_t i = 0; i < kElems; ++i) {
    if (a[i] != 2.0f * float(i) || b[i] != 2.0f * float(3 * i + 1)) {
      std::fprintf(stderr, "peer: element %llu is %f / %f\n", (unsigned long long)i, a[i], b[i]);
      return 13;
    }
  }
  return 0;
}
