#include "daemon/device/device_api.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hsdp::device {

const char* HandleKindName(HandleKind kind) {
  switch (kind) {
    case HandleKind::kVmmFd: return "vmm_fd";
    case HandleKind::kLegacyIpc: return "legacy_ipc";
    default: return "invalid";
  }
}

std::string UuidName(const DeviceUuid& u) {
  std::string hex;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) hex += '-';
    hex += absl::StrFormat("%02x", u[i]);
  }
  return "GPU-" + hex;
}

absl::StatusOr<int> ResolveDevice(const DeviceApi& api, int device, const std::string& uuid) {
  if (uuid.empty()) return device;
  if (uuid.size() != kDeviceUuidBytes) {
    return absl::InvalidArgumentError(absl::StrCat("device_uuid: ", uuid.size(),
                                                   " bytes; a GPU UUID has ", kDeviceUuidBytes));
  }
  DeviceUuid want;
  std::memcpy(want.data(), uuid.data(), want.size());
  std::string seen;
  for (int d = 0; d < api.DeviceCount(); ++d) {
    absl::StatusOr<DeviceUuid> got = api.UuidOf(d);
    if (!got.ok()) continue;
    if (*got == want) return d;
    absl::StrAppend(&seen, seen.empty() ? "" : ", ", UuidName(*got));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "device_uuid: ", UuidName(want), " is not a GPU this hsdpd sees (it sees ",
      api.DeviceCount(), ": ", seen.empty() ? "none" : seen, ")"));
}

}  // namespace hsdp::device
