// Helpers of the device-memory integration tests: a real hsdpd on the fake
// device (engine.device: fake — host memory shared by the trainers, the CPU
// fake NCCL), and a trainer whose "device memory" is a fake allocation it
// owns (daemon/device/fake_shm.h), registered through the C++ client.
#ifndef HSDP_TESTS_INTEGRATION_DEVICE_FAKE_UTIL_H_
#define HSDP_TESTS_INTEGRATION_DEVICE_FAKE_UTIL_H_

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "daemon/device/fake_device_api.h"
#include "daemon/device/fake_shm.h"
#include "hsdp/client.h"
#include "test_util.h"

namespace hsdp::testing {

using device::fakeshm::FakeTrainerDevice;

// node.yaml of a daemon that runs the NCCL engine on the fake device.
inline std::string FakeDeviceConfig() {
  return "engine:\n  kind: nccl\n  device: fake\n  threads: 1\n"
         "timeouts:\n  collective_ms: 20000\n";
}

// Lines of the daemon's /proc maps and fd links naming fake device objects
// (the trainers' memfds and shm objects, the daemon's event blocks): what a
// leak would leave behind.
inline int FakeDeviceObjectsIn(pid_t pid) {
  int n = 0;
  const std::string maps = ReadFile("/proc/" + std::to_string(pid) + "/maps");
  for (size_t at = maps.find("hsdp-fake"); at != std::string::npos;
       at = maps.find("hsdp-fake", at + 1)) {
    ++n;
  }
  const std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  if (DIR* d = ::opendir(dir.c_str()); d != nullptr) {
    while (dirent* e = ::readdir(d)) {
      char link[512];
      const std::string path = dir + "/" + e->d_name;
      const ssize_t len = ::readlink(path.c_str(), link, sizeof(link) - 1);
      if (len > 0 && std::string(link, len).find("hsdp-fake") != std::string::npos) ++n;
    }
    ::closedir(d);
  }
  return n;
}

// One trainer process: a client and one fake device allocation registered
// as one device buffer. Even ranks share it as a VMM fd, odd ranks as a
// legacy handle, so every multi-rank test covers both handle kinds.
struct DeviceTrainer {
  std::unique_ptr<Client> client;
  FakeTrainerDevice dev;
  std::unique_ptr<FakeTrainerDevice::Allocation> alloc;
  uint64_t buffer = 0;
  int device = 0;
  int rank = 0;
  FILE* out = nullptr;
  int failures = 0;
  std::vector<std::string> completion_events;
  // Name the GPU by UUID (the fake daemon's FakeUuid(rank)) and send
  // `claimed_device` as the ordinal: a trainer numbering GPUs differently.
  bool by_uuid = false;
  int claimed_device = -1;
  std::string Uuid() const {
    const device::DeviceUuid u = device::FakeUuid(device);
    return by_uuid ? std::string(reinterpret_cast<const char*>(u.data()), u.size()) : "";
  }
  int Claimed() const { return claimed_device >= 0 ? claimed_device : device; }

  void Fail(const std::string& what) {
    if (++failures <= 20) std::fprintf(out, "rank %d FAIL: %s\n", rank, what.c_str());
  }
  float* F(uint64_t byte_offset) {
    return reinterpret_cast<float*>(static_cast<char*>(alloc->data) + byte_offset);
  }

  absl::StatusOr<uint64_t> Register(FakeTrainerDevice::Allocation& a, uint64_t offset,
                                    uint64_t size, uint64_t generation, bool vmm) {
    DeviceBufferSpec spec;
    spec.device = Claimed();
    spec.device_uuid = Uuid();
    spec.offset_bytes = offset;
    spec.size_bytes = size;
    spec.generation = generation;
    if (vmm) {
      spec.kind = DeviceHandleKind::kVmmFd;
      spec.fd = a.fd.get();
      spec.allocation_bytes = a.bytes;
    } else {
      spec.kind = DeviceHandleKind::kLegacyIpc;
      spec.legacy_handle.assign(reinterpret_cast<const char*>(a.handle.data()), a.handle.size());
    }
    return client->RegisterDeviceBuffer(spec);
  }

  // Connects as `rank` of `world` on fake device `rank` (or `on_device`:
  // several trainers may share one), allocates `bytes` and registers them;
  // asks for the completion events.
  bool Start(const std::string& socket, const std::string& job, int r, int world,
             uint64_t bytes, int on_device = -1) {
    rank = r;
    device = on_device >= 0 ? on_device : r;
    ClientOptions o;
    o.socket_path = socket;
    o.job_id = job;
    o.rank = r;
    o.world_size = world;
    o.device = "cuda:" + std::to_string(device);
    auto c = Client::Connect(o);
    if (!c.ok()) return Fail("connect: " + c.status().ToString()), false;
    client = std::move(*c);
    if (!client->device_memory()) return Fail("device memory was not negotiated"), false;
    const bool vmm = r % 2 == 0;
    auto a = vmm ? dev.AllocateVmm(bytes) : dev.AllocateLegacy(bytes, 1000 + r);
    if (!a.ok()) return Fail("allocate: " + a.status().ToString()), false;
    alloc = std::move(*a);
    auto id = Register(*alloc, 0, bytes, 1, vmm);
    if (!id.ok()) return Fail("register: " + id.status().ToString()), false;
    buffer = *id;
    auto ev = client->GetCompletionEvents(Claimed(), Uuid());
    if (!ev.ok()) return Fail("completion events: " + ev.status().ToString()), false;
    completion_events = *ev;
    return true;
  }

  ~DeviceTrainer() {
    client.reset();
    FakeTrainerDevice::Free(std::move(alloc));
  }
};

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_DEVICE_FAKE_UTIL_H_
