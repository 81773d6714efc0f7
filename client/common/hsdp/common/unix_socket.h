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

// Writes exactly `len` bytes, attaching `fds` (may be empty) to the first chunk.
absl::Status SendWithFds(int sock, const void* data, size_t len, const std::vector<int>& fds);

// Reads exactly `len` bytes; fds that arrive are appended to `fds` (owned).
// `timeout_ms` < 0 waits forever. Returns UNAVAILABLE on EOF before `len`,
// DEADLINE_EXCEEDED on timeout.
absl::Status RecvWithFds(int sock, void* data, size_t len, std::vector<UniqueFd>* fds,
                         int timeout_ms);

struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
absl::StatusOr<PeerCred> GetPeerCred(int sock);

}  // namespace hsdp

#endif  // HSDP_COMMON_UNIX_SOCKET_H_
