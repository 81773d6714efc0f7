#include "daemon/util/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "hsdp/common/unique_fd.h"

namespace hsdp {

bool SdNotify(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  struct sockaddr_un addr{};
  const size_t len = std::strlen(path);
  if (len >= sizeof(addr.sun_path)) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path, len);
  if (addr.sun_path[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  UniqueFd fd(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return false;
  const socklen_t alen = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + len);
  return ::sendto(fd.get(), state.data(), state.size(), MSG_NOSIGNAL,
                  reinterpret_cast<struct sockaddr*>(&addr), alen) ==
         static_cast<ssize_t>(state.size());
}

int64_t SdWatchdogUsec() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr) return 0;
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr && std::atol(pid) != getpid()) {
    return 0;
  }
  return std::atoll(usec);
}

}  // namespace hsdp
