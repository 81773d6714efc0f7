// Unix-domain socket helpers: connect, exact reads/writes, fd passing with
// SCM_RIGHTS, peer credentials. All return absl::Status; none throw.
#ifndef HSDP_COMMON_UNIX_SOCKET_H_
#define HSDP_COMMON_UNIX_SOCKET_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hsdp/common/unique_fd.h"

namespace hsdp {

// Connects a SOCK_STREAM socket to `path`. UNAVAILABLE when nobody listens.
absl::StatusOr<UniqueFd> ConnectUnix(const std::string& path);

// The most fds one message may carry (SendWithFds refuses more; a receiver
// given more sees MSG_CTRUNC and fails).
inline constexpr size_t kMaxFdsPerMessage = 8;

// Writes exactly `len` bytes, attaching `fds` (may be empty) to the first chunk.
// On a non-blocking socket a full send buffer is an error (EAGAIN), not a wait.
absl::Status SendWithFds(int sock, const void* data, size_t len, const std::vector<int>& fds);

// Reads exactly `len` bytes; fds that arrive are appended to `fds` (owned;
// closed when `fds` is null). `timeout_ms` < 0 waits forever; it applies to
// each wait for more bytes. Returns UNAVAILABLE on EOF before `len`,
// DEADLINE_EXCEEDED on timeout, INVALID_ARGUMENT when a message carried more
// than kMaxFdsPerMessage fds (MSG_CTRUNC). On any error no fd is appended
// (those received are closed). Fds are received close-on-exec.
absl::Status RecvWithFds(int sock, void* data, size_t len, std::vector<UniqueFd>* fds,
                         int timeout_ms);

// One non-blocking recvmsg of at most `len` bytes, for event-driven servers.
// Returns the number of bytes read, 0 when nothing is available yet (EAGAIN),
// UNAVAILABLE on EOF, INVALID_ARGUMENT on MSG_CTRUNC (more than
// kMaxFdsPerMessage fds; every fd of that recvmsg is closed). Fds that arrive
// with the bytes are appended to `fds` (owned; closed when `fds` is null),
// close-on-exec. Never blocks.
absl::StatusOr<size_t> RecvSomeWithFds(int sock, void* data, size_t len,
                                       std::vector<UniqueFd>* fds);

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCred> GetPeerCred(int sock);

}  // namespace hsdp

#endif  // HSDP_COMMON_UNIX_SOCKET_H_
