#include "hsdp/common/socket_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

namespace hsdp {
namespace {

bool IsWritableDir(const std::string& dir) {
  struct stat st;
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::access(dir.c_str(), W_OK) == 0;
}

std::vector<std::string> CandidateDirs() {
  std::vector<std::string> dirs = {"/run/hsdpd"};
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    dirs.push_back(std::string(xdg) + "/hsdpd");
  }
  dirs.push_back("/tmp/hsdpd-" + std::to_string(::getuid()));
  return dirs;
}

}  // namespace

std::string DaemonDefaultSocketPath() {
  const std::vector<std::string> dirs = CandidateDirs();
  if (IsWritableDir(dirs[0])) return dirs[0] + "/hsdpd.sock";
  return dirs[1] + "/hsdpd.sock";
}

std::string ClientDefaultSocketPath() {
  if (const char* env = std::getenv("HSDPD_SOCKET"); env != nullptr && *env != '\0') return env;
  for (const std::string& dir : CandidateDirs()) {
    struct stat st;
    const std::string path = dir + "/hsdpd.sock";
    if (::stat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return path;
  }
  return DaemonDefaultSocketPath();
}

}  // namespace hsdp
