// The one message of the two-process CUDA IPC test (peer -> test).
#ifndef HSDP_TESTS_UNIT_DEVICE_CUDA_IPC_MESSAGE_H_
#define HSDP_TESTS_UNIT_DEVICE_CUDA_IPC_MESSAGE_H_

#include <cstdint>

#include "daemon/device/device_api.h"

namespace hsdp {

inline constexpr uint64_t kIpcElems = 1 << 20;
inline constexpr uint64_t kIpcLegacyOffset = 4096;  // the buffer starts inside the allocation

struct IpcMessage {
  char tag;  // 'H': handles follow (and one fd); 'S': no GPU in the peer
  uint64_t vmm_bytes;
  uint64_t legacy_offset;  // of the buffer from the allocation base
  device::IpcHandleBytes legacy;
  device::IpcHandleBytes event;
};

}  // namespace hsdp

#endif  // HSDP_TESTS_UNIT_DEVICE_CUDA_IPC_MESSAGE_H_
