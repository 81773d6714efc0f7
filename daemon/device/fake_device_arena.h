// FakeDeviceApi's arena (internal to fake_device_api.cc and
// fake_device_memory.cc): one host buffer per fake device with a first-fit
// allocator, so a freed address is handed out again as with the CUDA caching
// allocator.
#ifndef HSDP_DAEMON_DEVICE_FAKE_DEVICE_ARENA_H_
#define HSDP_DAEMON_DEVICE_FAKE_DEVICE_ARENA_H_

#include <cstdint>
#include <cstdlib>
#include <map>

#include "daemon/device/fake_device_api.h"

namespace hsdp::device {

// A first-fit allocator over one host buffer.
struct FakeDeviceApi::Arena {
  explicit Arena(uint64_t bytes) : size(bytes) {
    mem = static_cast<char*>(std::aligned_alloc(4096, bytes));
    free_ranges[0] = bytes;
  }
  ~Arena() { std::free(mem); }
  char* mem;
  uint64_t size;
  std::map<uint64_t, uint64_t> free_ranges;  // offset -> length; guarded by the api's mu_
};

}  // namespace hsdp::device

#endif  // HSDP_DAEMON_DEVICE_FAKE_DEVICE_ARENA_H_
