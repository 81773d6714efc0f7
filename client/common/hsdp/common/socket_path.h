// Where hsdpd listens when nobody says otherwise. Shared by the daemon (to
// choose) and the clients (to find it), so both agree.
#ifndef HSDP_COMMON_SOCKET_PATH_H_
#define HSDP_COMMON_SOCKET_PATH_H_

#include <string>

#include "absl/status/statusor.h"
#include "hsdp/common/unique_fd.h"

namespace hsdp {

// The system socket: root's daemon always uses it.
inline constexpr char kSystemSocketPath[] = "/run/hsdpd/hsdpd.sock";

// The daemon's choice. Root (effective uid 0): always kSystemSocketPath; the
// daemon creates /run/hsdpd itself and refuses to start if it cannot make it
// safe, never falling back to a shared directory such as /tmp. Other users:
// kSystemSocketPath when /run/hsdpd is a writable directory, else
// $XDG_RUNTIME_DIR/hsdpd/hsdpd.sock when XDG_RUNTIME_DIR is set, else
// /tmp/hsdpd-$UID/hsdpd.sock (which the daemon refuses if another user
// created that directory first).
std::string DaemonDefaultSocketPath();

// The client's choice: $HSDPD_SOCKET when set; otherwise the first of the
// candidates above whose socket file exists in a directory that is no
// symlink, is owned by root or the caller and is not writable by group or
// others; otherwise DaemonDefaultSocketPath().
std::string ClientDefaultSocketPath();

// Opens the directory `dir` (absolute; no "." or ".." components) for use
// with openat/unlinkat, creating the components that are missing (mode 0755,
// owned by the effective uid). Resolves one component at a time with
// O_NOFOLLOW, so a symlink anywhere on the path is refused and a component
// swapped after the check cannot redirect the caller. Every existing
// component must be owned by root or the effective uid and, if writable by
// group or others, carry the sticky bit (as /tmp does); the directory itself
// must not be writable by group or others at all. FAILED_PRECONDITION naming
// the component and what is wrong with it otherwise; errno statuses for
// other failures. The fd is O_DIRECTORY | O_CLOEXEC.
absl::StatusOr<UniqueFd> OpenTrustedDir(const std::string& dir);

}  // namespace hsdp

#endif  // HSDP_COMMON_SOCKET_PATH_H_
