// Client: device memory (registration of device buffers and events, the
// daemon's completion events). Handles stay opaque bytes / fds here.
#include "absl/strings/str_cat.h"
#include "client_impl.h"
#include "hsdp/common/unix_socket.h"
#include "hsdp/shm/data_conn.h"

namespace hsdp {

using internal::FromGrpc;
using internal::SetDeadline;

namespace {

constexpr size_t kIpcHandleBytes = 64;

absl::Status NeedsDeviceMemory(uint64_t features) {
  if ((features & shm::kFeatureDeviceMemory) != 0) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "device memory was not negotiated: this hsdpd runs no device engine (engine.kind nccl or "
      "auto with a GPU), or ClientOptions::offer_device_memory is false");
}

absl::Status CheckUuid(const std::string& uuid) {
  if (uuid.empty() || uuid.size() == 16) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("device_uuid: ", uuid.size(), " bytes; a GPU UUID has 16"));
}

}  // namespace

bool Client::device_memory() const {
  return (impl_->features & shm::kFeatureDeviceMemory) != 0;
}

absl::StatusOr<uint64_t> Client::RegisterDeviceBuffer(const DeviceBufferSpec& spec) {
  Impl& im = *impl_;
  RETURN_IF_ERROR(NeedsDeviceMemory(im.features));
  if (spec.size_bytes == 0) return absl::InvalidArgumentError("size_bytes: must be > 0");
  v1::RegisterDeviceBufferRequest req;
  req.set_session_id(im.session_id);
  req.set_device(spec.device);
  req.set_offset_bytes(spec.offset_bytes);
  req.set_size_bytes(spec.size_bytes);
  req.set_generation(spec.generation);
  req.set_name(spec.name);
  RETURN_IF_ERROR(CheckUuid(spec.device_uuid));
  req.set_device_uuid(spec.device_uuid);
  req.set_allocation_id(spec.allocation_id);
  switch (spec.kind) {
    case DeviceHandleKind::kLegacyIpc:
      if (spec.legacy_handle.size() != kIpcHandleBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "legacy_handle: ", spec.legacy_handle.size(), " bytes; a legacy IPC handle has 64"));
      }
      req.set_handle_kind(v1::DEVICE_HANDLE_LEGACY_IPC);
      req.set_ipc_handle(spec.legacy_handle);
      break;
    case DeviceHandleKind::kVmmFd: {
      if (spec.fd < 0) return absl::InvalidArgumentError("fd: a VMM handle needs an fd");
      if (spec.allocation_bytes == 0 || spec.offset_bytes > spec.allocation_bytes ||
          spec.size_bytes > spec.allocation_bytes - spec.offset_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "allocation_bytes: buffer [", spec.offset_bytes, ", +", spec.size_bytes,
            ") does not fit the exported allocation of ", spec.allocation_bytes, " bytes"));
      }
      uint64_t tag;
      {
        absl::MutexLock l(&im.mu);
        tag = im.next_fd_tag++;
      }
      // Passed as a device handle: only RegisterDeviceBuffer can claim it.
      shm::FdMessage msg{shm::kFdMessageMagic, shm::kFdKindDeviceHandle, tag};
      RETURN_IF_ERROR(SendWithFds(im.Channel()->data_fd(), &msg, sizeof(msg), {spec.fd}));
      req.set_handle_kind(v1::DEVICE_HANDLE_VMM_FD);
      req.set_fd_tag(tag);
      req.set_allocation_bytes(spec.allocation_bytes);
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("kind: unknown device handle kind ", static_cast<int>(spec.kind)));
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::RegisterDeviceBufferResponse resp;
  RETURN_IF_ERROR(
      FromGrpc(im.device_stub->RegisterDeviceBuffer(&ctx, req, &resp), "RegisterDeviceBuffer"));
  absl::MutexLock l(&im.mu);
  im.device_buffers[resp.buffer_id()] = spec.size_bytes;
  return resp.buffer_id();
}

absl::Status Client::FreeDeviceBuffer(uint64_t buffer_id) {
  Impl& im = *impl_;
  RETURN_IF_ERROR(NeedsDeviceMemory(im.features));
  {
    absl::MutexLock l(&im.mu);
    if (im.device_buffers.erase(buffer_id) == 0) {
      return absl::NotFoundError(absl::StrCat("FreeDeviceBuffer: unknown buffer id ", buffer_id));
    }
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::FreeDeviceBufferRequest req;
  req.set_session_id(im.session_id);
  req.set_buffer_id(buffer_id);
  v1::FreeDeviceBufferResponse resp;
  return FromGrpc(im.device_stub->FreeDeviceBuffer(&ctx, req, &resp), "FreeDeviceBuffer");
}

absl::StatusOr<uint64_t> Client::RegisterDeviceEvent(int device, const std::string& ipc_handle,
                                                     const std::string& device_uuid) {
  Impl& im = *impl_;
  RETURN_IF_ERROR(NeedsDeviceMemory(im.features));
  RETURN_IF_ERROR(CheckUuid(device_uuid));
  if (ipc_handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ipc_handle: ", ipc_handle.size(),
                                                   " bytes; an event handle has 64"));
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::RegisterDeviceEventRequest req;
  req.set_session_id(im.session_id);
  req.set_device(device);
  req.set_ipc_handle(ipc_handle);
  req.set_device_uuid(device_uuid);
  v1::RegisterDeviceEventResponse resp;
  RETURN_IF_ERROR(
      FromGrpc(im.device_stub->RegisterDeviceEvent(&ctx, req, &resp), "RegisterDeviceEvent"));
  return resp.event_id();
}

absl::Status Client::FreeDeviceEvent(uint64_t event_id) {
  Impl& im = *impl_;
  RETURN_IF_ERROR(NeedsDeviceMemory(im.features));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::FreeDeviceEventRequest req;
  req.set_session_id(im.session_id);
  req.set_event_id(event_id);
  v1::FreeDeviceEventResponse resp;
  return FromGrpc(im.device_stub->FreeDeviceEvent(&ctx, req, &resp), "FreeDeviceEvent");
}

absl::StatusOr<std::vector<std::string>> Client::GetCompletionEvents(
    int device, const std::string& device_uuid) {
  Impl& im = *impl_;
  RETURN_IF_ERROR(NeedsDeviceMemory(im.features));
  RETURN_IF_ERROR(CheckUuid(device_uuid));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetCompletionEventsRequest req;
  req.set_session_id(im.session_id);
  req.set_device(device);
  req.set_device_uuid(device_uuid);
  v1::GetCompletionEventsResponse resp;
  RETURN_IF_ERROR(
      FromGrpc(im.device_stub->GetCompletionEvents(&ctx, req, &resp), "GetCompletionEvents"));
  return std::vector<std::string>(resp.ipc_handles().begin(), resp.ipc_handles().end());
}

}  // namespace hsdp
