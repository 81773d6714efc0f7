// The control-plane side of device memory: checks that the caller owns the
// session and that the session negotiated kFeatureDeviceMemory, waits (never
// blocking) for a VMM fd passed over the data connection, and registers
// buffers and events in the DeviceBufferRegistry. The gRPC service
// (device_service.h) only translates messages to these calls.
//
// Session end: OnSessionEnded (installed with SessionManager::
// AddSessionEndHook) unmaps everything of the session; a registration that
// completes after its session ended is undone at once, so a client that dies
// mid-registration leaks nothing.
//
// Thread-safety: all methods are thread-safe; `done` callbacks run on the
// thread that resolves the fd (the data-connection server) or the caller's.
#ifndef HSDP_DAEMON_JOBS_DEVICE_REGISTRATION_H_
#define HSDP_DAEMON_JOBS_DEVICE_REGISTRATION_H_

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/session/device_buffers.h"
#include "daemon/jobs/session_manager.h"
#include "hsdp/common/unix_socket.h"

namespace hsdp {

class DeviceRegistration {
 public:
  // Both must outlive this object. Installs the session-end hook.
  DeviceRegistration(SessionManager* sessions, DeviceBufferRegistry* registry,
                     absl::Duration fd_timeout = absl::Seconds(10));

  using Done = std::function<void(absl::StatusOr<uint64_t>)>;
  // `request.fd` is ignored: for kVmmFd the fd tagged `fd_tag` on the
  // session's data connection is used. `done` runs exactly once.
  void RegisterBuffer(const PeerCred& caller, uint64_t session_id, DeviceBufferRequest request,
                      uint64_t fd_tag, Done done);
  absl::Status FreeBuffer(const PeerCred& caller, uint64_t session_id, uint64_t buffer_id);
  absl::StatusOr<uint64_t> RegisterEvent(const PeerCred& caller, uint64_t session_id, int device,
                                         const std::string& handle);
  absl::Status FreeEvent(const PeerCred& caller, uint64_t session_id, uint64_t event_id);

  // The session's completion events on `device`, one per ring slot.
  absl::StatusOr<std::vector<device::IpcHandleBytes>> CompletionEvents(const PeerCred& caller,
                                                                      uint64_t session_id,
                                                                      int device);

  void OnSessionEnded(uint64_t session_id) { registry_->EndSession(session_id); }

  // The daemon's ordinal for a client's (device, device_uuid): the UUID wins
  // when sent (device::ResolveDevice).
  absl::StatusOr<int> ResolveDevice(int device, const std::string& uuid) const {
    return device::ResolveDevice(registry_->device_api(), device, uuid);
  }

 private:
  // The session, if `caller` may use it for device memory.
  absl::StatusOr<std::shared_ptr<Session>> Check(const PeerCred& caller,
                                                 uint64_t session_id) const;
  // Registers and undoes it if the session ended meanwhile.
  absl::StatusOr<uint64_t> Finish(const std::shared_ptr<Session>& s, DeviceBufferRequest request);

  SessionManager* const sessions_;
  DeviceBufferRegistry* const registry_;
  const absl::Duration fd_timeout_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_JOBS_DEVICE_REGISTRATION_H_
