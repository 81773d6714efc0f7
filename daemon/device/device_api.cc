#include "daemon/device/device_api.h"

namespace hsdp::device {

const char* HandleKindName(HandleKind kind) {
  switch (kind) {
    case HandleKind::kVmmFd: return "vmm_fd";
    case HandleKind::kLegacyIpc: return "legacy_ipc";
    default: return "invalid";
  }
}

}  // namespace hsdp::device
