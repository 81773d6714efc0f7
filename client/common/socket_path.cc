#include "hsdp/common/socket_path.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {
namespace {

bool IsWritableDir(const std::string& dir) {
  struct stat st;
  return ::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && ::access(dir.c_str(), W_OK) == 0;
}

constexpr char kSystemSocketDir[] = "/run/hsdpd";

std::vector<std::string> CandidateDirs() {
  std::vector<std::string> dirs = {kSystemSocketDir};
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && *xdg != '\0') {
    dirs.push_back(std::string(xdg) + "/hsdpd");
  }
  dirs.push_back("/tmp/hsdpd-" + std::to_string(::getuid()));
  return dirs;
}

std::string OctalMode(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

// Who may change what is inside a directory: its owner, and anyone it lets
// write unless the sticky bit restricts renames and deletes to their owners.
absl::Status CheckComponent(const std::string& path, const struct stat& st, bool last) {
  const uid_t me = ::geteuid();
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  if (st.st_uid != me && st.st_uid != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " is owned by uid ", st.st_uid, ", not by root or this process (uid ", me,
        "); another user could replace the socket or plant files in it. Remove it, or choose "
        "a directory owned by uid ",
        me, " (node.socket / --socket)"));
  }
  const bool shared_write = (st.st_mode & (S_IWGRP | S_IWOTH)) != 0;
  if (shared_write && (last || (st.st_mode & S_ISVTX) == 0)) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " has mode ", OctalMode(st.st_mode), ": writable by ",
        (st.st_mode & S_IWOTH) ? "every user" : "its group",
        last ? "; the socket's directory must not be (chmod go-w it, or choose another)"
             : " without the sticky bit"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<UniqueFd> OpenTrustedDir(const std::string& dir) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat("directory ", dir, " is not absolute"));
  }
  UniqueFd fd(::open("/", O_DIRECTORY | O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, "open /", __FILE__, __LINE__);
  std::vector<std::string> parts = absl::StrSplit(dir, '/', absl::SkipEmpty());
  std::string path;
  struct stat st;
  SYSCALL_OR_RETURN(::fstat(fd.get(), &st));
  RETURN_IF_ERROR(CheckComponent("/", st, parts.empty()));
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& name = parts[i];
    if (name == "." || name == "..") {
      return absl::InvalidArgumentError(
          absl::StrCat("directory ", dir, " has a \"", name, "\" component"));
    }
    path += "/" + name;
    const bool last = i + 1 == parts.size();
    constexpr int kFlags = O_DIRECTORY | O_NOFOLLOW | O_RDONLY | O_CLOEXEC;
    UniqueFd next(::openat(fd.get(), name.c_str(), kFlags));
    bool created = false;
    if (!next.valid() && errno == ENOENT) {
      if (::mkdirat(fd.get(), name.c_str(), 0700) == 0) {
        created = true;
      } else if (errno != EEXIST) {
        return ErrnoStatus(errno, absl::StrCat("mkdir ", path), __FILE__, __LINE__);
      }
      next.Reset(::openat(fd.get(), name.c_str(), kFlags));
    }
    if (!next.valid()) {
      if (errno == ELOOP || errno == ENOTDIR) {
        return absl::FailedPreconditionError(
            absl::StrCat(path, " is a symbolic link or not a directory; refusing to follow it"));
      }
      return ErrnoStatus(errno, absl::StrCat("open ", path), __FILE__, __LINE__);
    }
    SYSCALL_OR_RETURN(::fstat(next.get(), &st));
    if (created && st.st_uid == ::geteuid()) {
      // Made 0700 and widened only now: nobody could use it in between.
      SYSCALL_OR_RETURN(::fchmod(next.get(), 0755));
      st.st_mode = (st.st_mode & ~07777) | 0755;
    }
    RETURN_IF_ERROR(CheckComponent(path, st, last));
    fd = std::move(next);
  }
  return fd;
}

std::string DaemonDefaultSocketPath() {
  // Root never picks a directory another user could have created first.
  if (::geteuid() == 0) return kSystemSocketPath;
  const std::vector<std::string> dirs = CandidateDirs();
  if (IsWritableDir(dirs[0])) return dirs[0] + "/hsdpd.sock";
  return dirs[1] + "/hsdpd.sock";
}

std::string ClientDefaultSocketPath() {
  if (const char* env = std::getenv("HSDPD_SOCKET"); env != nullptr && *env != '\0') return env;
  for (const std::string& dir : CandidateDirs()) {
    struct stat st;
    // A socket in a directory another user controls may be theirs, not
    // hsdpd's (say, /tmp/hsdpd-$UID made first by someone else): skip it.
    if (::lstat(dir.c_str(), &st) != 0 || !CheckComponent(dir, st, /*last=*/true).ok()) continue;
    const std::string path = dir + "/hsdpd.sock";
    if (::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) return path;
  }
  return DaemonDefaultSocketPath();
}

}  // namespace hsdp
