#include "daemon/jobs/device_registration.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/layout.h"

namespace hsdp {

DeviceRegistration::DeviceRegistration(SessionManager* sessions, DeviceBufferRegistry* registry,
                                       absl::Duration fd_timeout)
    : sessions_(sessions), registry_(registry), fd_timeout_(fd_timeout) {
  sessions_->AddSessionEndHook([this](uint64_t id) { OnSessionEnded(id); });
}

absl::StatusOr<std::shared_ptr<Session>> DeviceRegistration::Check(const PeerCred& caller,
                                                                   uint64_t session_id) const {
  std::shared_ptr<Session> s = sessions_->FindSession(session_id);
  if (s == nullptr) {
    return absl::NotFoundError(absl::StrCat("session_id: no session ", session_id));
  }
  if (caller.uid != 0 && caller.uid != s->info().uid) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", session_id, " belongs to uid ", s->info().uid));
  }
  if ((s->info().features & shm::kFeatureDeviceMemory) == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", session_id,
        " did not negotiate device memory (the client did not offer it, or this hsdpd runs "
        "no device engine)"));
  }
  return s;
}

absl::StatusOr<uint64_t> DeviceRegistration::Finish(const std::shared_ptr<Session>& s,
                                                    DeviceBufferRequest request) {
  absl::StatusOr<uint64_t> id = registry_->Register(s->id(), std::move(request));
  if (id.ok() && (s->closed() || sessions_->FindSession(s->id()) == nullptr)) {
    registry_->EndSession(s->id());  // ended meanwhile: undo, leak nothing
    return absl::NotFoundError(absl::StrCat("session ", s->id(), " ended during registration"));
  }
  return id;
}

void DeviceRegistration::RegisterBuffer(const PeerCred& caller, uint64_t session_id,
                                        DeviceBufferRequest request, uint64_t fd_tag, Done done) {
  absl::StatusOr<std::shared_ptr<Session>> s = Check(caller, session_id);
  if (!s.ok()) return done(s.status());
  if (request.kind != device::HandleKind::kVmmFd) {
    request.fd.Reset();
    return done(Finish(*s, std::move(request)));
  }
  if (fd_tag == 0) return done(absl::InvalidArgumentError("fd_tag: a VMM handle needs an fd"));
  auto req = std::make_shared<DeviceBufferRequest>(std::move(request));
  auto shared_done = std::make_shared<Done>(std::move(done));
  std::shared_ptr<Session> session = *s;
  absl::Status waiting = session->AwaitFd(
      fd_tag, absl::Now() + fd_timeout_,
      [this, session, req, shared_done](absl::StatusOr<UniqueFd> fd) {
        if (!fd.ok()) {
          (*shared_done)(absl::Status(fd.status().code(),
                                      absl::StrCat("fd_tag: ", fd.status().message())));
          return;
        }
        req->fd = *std::move(fd);
        (*shared_done)(Finish(session, std::move(*req)));
      },
      Session::FdKind::kDeviceHandle);
  if (!waiting.ok()) (*shared_done)(waiting);
}

absl::Status DeviceRegistration::FreeBuffer(const PeerCred& caller, uint64_t session_id,
                                            uint64_t buffer_id) {
  RETURN_IF_ERROR(Check(caller, session_id).status());
  return registry_->Free(session_id, buffer_id);
}

absl::StatusOr<uint64_t> DeviceRegistration::RegisterEvent(const PeerCred& caller,
                                                           uint64_t session_id, int device,
                                                           const std::string& handle) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> s, Check(caller, session_id));
  if (handle.size() != device::kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("ipc_handle: ", handle.size(),
                                                   " bytes; an event handle has ",
                                                   device::kIpcHandleBytes));
  }
  device::IpcHandleBytes h;
  std::memcpy(h.data(), handle.data(), h.size());
  absl::StatusOr<uint64_t> id = registry_->RegisterEvent(session_id, device, h);
  if (id.ok() && (s->closed() || sessions_->FindSession(session_id) == nullptr)) {
    registry_->EndSession(session_id);
    return absl::NotFoundError(absl::StrCat("session ", session_id, " ended during registration"));
  }
  return id;
}

absl::StatusOr<std::vector<device::IpcHandleBytes>> DeviceRegistration::CompletionEvents(
    const PeerCred& caller, uint64_t session_id, int device) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> s, Check(caller, session_id));
  auto handles = registry_->CompletionEvents(session_id, device, s->channel().ring_entries());
  if (handles.ok() && (s->closed() || sessions_->FindSession(session_id) == nullptr)) {
    registry_->EndSession(session_id);
    return absl::NotFoundError(absl::StrCat("session ", session_id, " ended meanwhile"));
  }
  return handles;
}

absl::Status DeviceRegistration::FreeEvent(const PeerCred& caller, uint64_t session_id,
                                           uint64_t event_id) {
  RETURN_IF_ERROR(Check(caller, session_id).status());
  return registry_->FreeEvent(session_id, event_id);
}

}  // namespace hsdp
