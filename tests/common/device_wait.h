// Waiting for a device event in tests (real GPU or the fake device): polls
// DeviceApi::EventDone, which never blocks in the driver, through
// EventuallyValue (wait.h).
#ifndef HSDP_TESTS_COMMON_DEVICE_WAIT_H_
#define HSDP_TESTS_COMMON_DEVICE_WAIT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/wait.h"
#include "daemon/device/device_api.h"

namespace hsdp::testing {

// OK once `event` completed; the error EventDone reported; or
// DEADLINE_EXCEEDED after `timeout_ms`.
inline absl::Status WaitEventDone(device::DeviceApi& api, device::EventHandle event,
                                  int timeout_ms = 10000) {
  const absl::StatusOr<bool> done = EventuallyValue(
      [&] { return api.EventDone(event); },
      [](const absl::StatusOr<bool>& d) { return !d.ok() || *d; }, timeout_ms, /*poll_ms=*/1);
  if (!done.ok()) return done.status();
  if (*done) return absl::OkStatus();
  return absl::DeadlineExceededError("event did not complete in " + std::to_string(timeout_ms) +
                                     " ms");
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_COMMON_DEVICE_WAIT_H_
