#include "daemon/device/device_api.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hsdp/common/status_macros.h"

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

absl::Status CheckReduceArgs(size_t inputs, ReduceOp op, DataType from, DataType to, bool scaled) {
  if (inputs == 0) return absl::InvalidArgumentError("reduce: no inputs");
  if (op != ReduceOp::kSum && op != ReduceOp::kMin && op != ReduceOp::kMax &&
      op != ReduceOp::kProduct) {
    return absl::InvalidArgumentError("reduce: op must be sum, min, max or product");
  }
  if ((from != to || scaled) && (!IsFloatingPoint(from) || !IsFloatingPoint(to))) {
    return absl::InvalidArgumentError("reduce: a cast or a scale needs float types");
  }
  return absl::OkStatus();
}

std::vector<DevicePtr> InputsDstFirst(std::vector<DevicePtr> srcs, DevicePtr dst) {
  auto it = std::find(srcs.begin(), srcs.end(), dst);
  if (it != srcs.end()) std::rotate(srcs.begin(), it, it + 1);
  return srcs;
}

absl::Status CheckReduceToMany(const std::vector<DevicePtr>& srcs, DataType from,
                               const std::vector<DevicePtr>& dsts, DataType to) {
  if (srcs.empty() || dsts.empty()) return absl::InvalidArgumentError("reduce: no inputs or outputs");
  if (DataTypeSize(from) != DataTypeSize(to)) {
    for (DevicePtr d : dsts) {
      for (DevicePtr s : srcs) {
        if (d == s) return absl::InvalidArgumentError("reduce: an output in place of an input of another size");
      }
    }
  }
  return absl::OkStatus();
}

absl::Status DeviceApi::ReduceToManyAsync(const std::vector<DevicePtr>& srcs, DataType from,
                                          const std::vector<DevicePtr>& dsts, DataType to,
                                          uint64_t count, ReduceOp op, double in_scale,
                                          double out_scale, StreamHandle stream) {
  RETURN_IF_ERROR(CheckReduceToMany(srcs, from, dsts, to));
  RETURN_IF_ERROR(ReduceAsync(srcs, from, dsts[0], to, count, op, in_scale, /*accumulate=*/false,
                              stream));
  if (out_scale != 1.0) RETURN_IF_ERROR(ScaleCastAsync(dsts[0], to, dsts[0], to, count, out_scale, stream));
  for (size_t j = 1; j < dsts.size(); ++j) {
    if (dsts[j] != dsts[0]) RETURN_IF_ERROR(MemcpyAsync(dsts[j], dsts[0], count * DataTypeSize(to), stream));
  }
  return absl::OkStatus();
}

}  // namespace hsdp::device
