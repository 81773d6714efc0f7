#include "daemon/server/device_service.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace hsdp {

absl::StatusOr<DeviceBufferRequest> DeviceMemoryServiceImpl::FromProto(
    const v1::RegisterDeviceBufferRequest& req) {
  DeviceBufferRequest r;
  switch (req.handle_kind()) {
    case v1::DEVICE_HANDLE_VMM_FD:
      r.kind = device::HandleKind::kVmmFd;
      break;
    case v1::DEVICE_HANDLE_LEGACY_IPC:
      r.kind = device::HandleKind::kLegacyIpc;
      if (req.ipc_handle().size() != device::kIpcHandleBytes) {
        return absl::InvalidArgumentError(absl::StrCat("ipc_handle: ", req.ipc_handle().size(),
                                                       " bytes; a memory handle has ",
                                                       device::kIpcHandleBytes));
      }
      std::memcpy(r.handle.data(), req.ipc_handle().data(), r.handle.size());
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("handle_kind: unknown kind ", static_cast<int>(req.handle_kind())));
  }
  if (req.name().size() > 256) return absl::InvalidArgumentError("name: longer than 256 bytes");
  r.device = req.device();
  r.allocation_bytes = req.allocation_bytes();
  r.offset = req.offset_bytes();
  r.size_bytes = req.size_bytes();
  r.generation = req.generation();
  r.allocation_id = req.allocation_id();
  r.name = req.name();
  return r;
}

grpc::ServerUnaryReactor* DeviceMemoryServiceImpl::RegisterDeviceBuffer(
    grpc::CallbackServerContext* ctx, const v1::RegisterDeviceBufferRequest* req,
    v1::RegisterDeviceBufferResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  absl::StatusOr<PeerCred> cred = auth_->Authenticate(*ctx);
  absl::StatusOr<DeviceBufferRequest> r =
      cred.ok() ? FromProto(*req) : absl::StatusOr<DeviceBufferRequest>(cred.status());
  if (r.ok()) {
    absl::StatusOr<int> d = registration_->ResolveDevice(r->device, req->device_uuid());
    if (d.ok()) {
      r->device = *d;
    } else {
      r = d.status();
    }
  }
  if (!r.ok()) {
    reactor->Finish(ToGrpc(r.status()));
    return reactor;
  }
  auto scope = std::make_shared<RpcTracker::Scope>(tracker_);  // until `done` ran
  registration_->RegisterBuffer(*cred, req->session_id(), *std::move(r), req->fd_tag(),
                                [reactor, resp, scope](absl::StatusOr<uint64_t> id) {
                                  if (id.ok()) resp->set_buffer_id(*id);
                                  reactor->Finish(ToGrpc(id.status()));
                                });
  return reactor;
}

grpc::Status DeviceMemoryServiceImpl::FreeDeviceBuffer(grpc::ServerContext* ctx,
                                                       const v1::FreeDeviceBufferRequest* req,
                                                       v1::FreeDeviceBufferResponse*) {
  RpcTracker::Scope in_flight(tracker_);
  absl::StatusOr<PeerCred> cred = auth_->Authenticate(*ctx);
  if (!cred.ok()) return ToGrpc(cred.status());
  return ToGrpc(registration_->FreeBuffer(*cred, req->session_id(), req->buffer_id()));
}

grpc::Status DeviceMemoryServiceImpl::RegisterDeviceEvent(grpc::ServerContext* ctx,
                                                          const v1::RegisterDeviceEventRequest* req,
                                                          v1::RegisterDeviceEventResponse* resp) {
  RpcTracker::Scope in_flight(tracker_);
  absl::StatusOr<PeerCred> cred = auth_->Authenticate(*ctx);
  if (!cred.ok()) return ToGrpc(cred.status());
  absl::StatusOr<int> device = registration_->ResolveDevice(req->device(), req->device_uuid());
  if (!device.ok()) return ToGrpc(device.status());
  absl::StatusOr<uint64_t> id =
      registration_->RegisterEvent(*cred, req->session_id(), *device, req->ipc_handle());
  if (id.ok()) resp->set_event_id(*id);
  return ToGrpc(id.status());
}

grpc::Status DeviceMemoryServiceImpl::FreeDeviceEvent(grpc::ServerContext* ctx,
                                                      const v1::FreeDeviceEventRequest* req,
                                                      v1::FreeDeviceEventResponse*) {
  RpcTracker::Scope in_flight(tracker_);
  absl::StatusOr<PeerCred> cred = auth_->Authenticate(*ctx);
  if (!cred.ok()) return ToGrpc(cred.status());
  return ToGrpc(registration_->FreeEvent(*cred, req->session_id(), req->event_id()));
}

grpc::Status DeviceMemoryServiceImpl::GetCompletionEvents(
    grpc::ServerContext* ctx, const v1::GetCompletionEventsRequest* req,
    v1::GetCompletionEventsResponse* resp) {
  RpcTracker::Scope in_flight(tracker_);
  absl::StatusOr<PeerCred> cred = auth_->Authenticate(*ctx);
  if (!cred.ok()) return ToGrpc(cred.status());
  absl::StatusOr<int> device = registration_->ResolveDevice(req->device(), req->device_uuid());
  if (!device.ok()) return ToGrpc(device.status());
  auto handles = registration_->CompletionEvents(*cred, req->session_id(), *device);
  if (!handles.ok()) return ToGrpc(handles.status());
  for (const device::IpcHandleBytes& h : *handles) {
    resp->add_ipc_handles(reinterpret_cast<const char*>(h.data()), h.size());
  }
  return grpc::Status::OK;
}

}  // namespace hsdp
