// Where hsdpd listens when nobody says otherwise. Shared by the daemon (to
// choose) and the clients (to find it), so both agree.
#ifndef HSDP_COMMON_SOCKET_PATH_H_
#define HSDP_COMMON_SOCKET_PATH_H_

#include <string>

namespace hsdp {

// The daemon's choice: /run/hsdpd/hsdpd.sock when /run/hsdpd is a writable
// directory, else $XDG_RUNTIME_DIR/hsdpd/hsdpd.sock when XDG_RUNTIME_DIR is
// set, else /tmp/hsdpd-$UID/hsdpd.sock.
std::string DaemonDefaultSocketPath();

// The client's choice: $HSDPD_SOCKET when set; otherwise the first of the
// candidates above whose socket file exists; otherwise DaemonDefaultSocketPath().
std::string ClientDefaultSocketPath();

}  // namespace hsdp

#endif  // HSDP_COMMON_SOCKET_PATH_H_
