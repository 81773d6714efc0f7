// systemd readiness and watchdog notifications without libsystemd: one
// datagram to $NOTIFY_SOCKET per call. No-ops when it is unset.
#ifndef HSDP_DAEMON_UTIL_SD_NOTIFY_H_
#define HSDP_DAEMON_UTIL_SD_NOTIFY_H_

#include <cstdint>
#include <string>

namespace hsdp {

// Sends `state` (e.g. "READY=1", "WATCHDOG=1", "STOPPING=1"). Returns false
// when NOTIFY_SOCKET is unset or the send failed.
bool SdNotify(const std::string& state);

// The watchdog interval from $WATCHDOG_USEC (0 when unset or not for us).
int64_t SdWatchdogUsec();

}  // namespace hsdp

#endif  // HSDP_DAEMON_UTIL_SD_NOTIFY_H_
