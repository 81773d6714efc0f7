// Validation of descriptors read from a session's ring. Everything in a
// descriptor is untrusted: each check names the offending field.
#ifndef HSDP_DAEMON_DATAPLANE_VALIDATE_H_
#define HSDP_DAEMON_DATAPLANE_VALIDATE_H_

#include "absl/status/status.h"
#include "daemon/dataplane/group.h"
#include "daemon/session/device_buffers.h"
#include "daemon/session/session.h"
#include "hsdp/shm/layout.h"

namespace hsdp {

// Checks the fields that do not depend on a group (shm::CheckDescriptorFields,
// the rules the clients apply too) against the session's negotiated
// `features`. INVALID_ARGUMENT naming the field.
absl::Status ValidateFields(const shm::OpDescriptor& d, uint64_t features);

// Checks buffers and ranges for a member of a group of `group_size` and
// fills arrival->send/recv and the keep-alive references. Buffer ids with
// kDeviceBufferIdBit are device buffers of `device_buffers` (null when the
// daemon runs no device engine): they fill the arrival's device fields
// (kind, device, producer event, completion event). INVALID_ARGUMENT naming
// the field ("send.buffer_id", "recv.offset_bytes", "event_id", ...).
absl::Status ResolveBuffers(const shm::OpDescriptor& d, int group_rank, int group_size,
                            const Session& session, const DeviceBufferRegistry* device_buffers,
                            Arrival* arrival);

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_VALIDATE_H_
