// gRPC DeviceMemory service (proto/hsdp/v1/device.proto): authenticates the
// caller and translates messages to DeviceRegistration. Never blocks:
// RegisterDeviceBuffer, which may wait for a VMM fd, is a callback method.
#ifndef HSDP_DAEMON_SERVER_DEVICE_SERVICE_H_
#define HSDP_DAEMON_SERVER_DEVICE_SERVICE_H_

#include "daemon/jobs/device_registration.h"
#include "daemon/auth/authenticator.h"
#include "daemon/server/grpc_services.h"
#include "hsdp/v1/device.grpc.pb.h"

namespace hsdp {

class DeviceMemoryServiceImpl final
    : public v1::DeviceMemory::WithCallbackMethod_RegisterDeviceBuffer<v1::DeviceMemory::Service> {
 public:
  DeviceMemoryServiceImpl(DeviceRegistration* registration, const Authenticator* auth,
                          RpcTracker* tracker)
      : registration_(registration), auth_(auth), tracker_(tracker) {}

  grpc::ServerUnaryReactor* RegisterDeviceBuffer(grpc::CallbackServerContext* ctx,
                                                 const v1::RegisterDeviceBufferRequest* req,
                                                 v1::RegisterDeviceBufferResponse* resp) override;
  grpc::Status FreeDeviceBuffer(grpc::ServerContext* ctx, const v1::FreeDeviceBufferRequest* req,
                                v1::FreeDeviceBufferResponse* resp) override;
  grpc::Status RegisterDeviceEvent(grpc::ServerContext* ctx,
                                   const v1::RegisterDeviceEventRequest* req,
                                   v1::RegisterDeviceEventResponse* resp) override;
  grpc::Status FreeDeviceEvent(grpc::ServerContext* ctx, const v1::FreeDeviceEventRequest* req,
                               v1::FreeDeviceEventResponse* resp) override;
  grpc::Status GetCompletionEvents(grpc::ServerContext* ctx,
                                   const v1::GetCompletionEventsRequest* req,
                                   v1::GetCompletionEventsResponse* resp) override;

  // The request as the registry takes it (no fd yet); INVALID_ARGUMENT
  // naming the field. Exposed for tests.
  static absl::StatusOr<DeviceBufferRequest> FromProto(const v1::RegisterDeviceBufferRequest& req);

 private:
  DeviceRegistration* const registration_;
  const Authenticator* const auth_;
  RpcTracker* const tracker_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SERVER_DEVICE_SERVICE_H_
