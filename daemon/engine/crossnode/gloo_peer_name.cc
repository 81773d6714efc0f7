// See gloo_peer_name.h: why this file defines a function of Gloo's.
#include "daemon/engine/crossnode/gloo_peer_name.h"

#include <dlfcn.h>
#include <sys/socket.h>

#include <cstring>

#include "gloo/transport/tcp/address.h"

namespace gloo::transport::tcp {

// Same contract as Gloo's own (the peer's address of a connected socket),
// except that a socket that is no longer connected gives an address of
// family AF_UNSPEC (Gloo prints it "[none]") instead of an exception on
// Gloo's IO thread. Runs on that thread: no allocation beyond Address's,
// no logging (a hostile host could flood the log).
Address Address::fromPeerName(int fd) {
  struct sockaddr_storage ss;
  std::memset(&ss, 0, sizeof(ss));
  socklen_t length = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<struct sockaddr*>(&ss), &length) != 0) {
    std::memset(&ss, 0, sizeof(ss));
  }
  return Address(ss);
}

}  // namespace gloo::transport::tcp

namespace hsdp {

bool GlooPeerNameGuardActive() {
  // The Itanium ABI name of gloo::transport::tcp::Address::fromPeerName(int).
  void* bound = dlsym(RTLD_DEFAULT, "_ZN4gloo9transport3tcp7Address12fromPeerNameEi");
  return bound != nullptr &&
         bound == reinterpret_cast<void*>(&gloo::transport::tcp::Address::fromPeerName);
}

}  // namespace hsdp
