#include "hsdp/common/status_macros.h"

namespace hsdp {

absl::StatusCode ErrnoToCode(int err) {
  switch (err) {
    case 0: return absl::StatusCode::kOk;
    case EINVAL: case EBADF: case ENAMETOOLONG: return absl::StatusCode::kInvalidArgument;
    case ENOENT: return absl::StatusCode::kNotFound;
    case EEXIST: return absl::StatusCode::kAlreadyExists;
    case EACCES: case EPERM: return absl::StatusCode::kPermissionDenied;
    case ENOMEM: case ENOSPC: case EMFILE: case ENFILE: case EFBIG:
      return absl::StatusCode::kResourceExhausted;
    case ETIMEDOUT: return absl::StatusCode::kDeadlineExceeded;
    case ECONNREFUSED: case ECONNRESET: case EPIPE: case EAGAIN:
      return absl::StatusCode::kUnavailable;
    default: return absl::StatusCode::kInternal;
  }
}

absl::Status ErrnoStatus(int err, std::string_view what, const char* file, int line) {
  const char* slash = std::strrchr(file, '/');
  const std::string base = slash != nullptr ? slash + 1 : file;
  const std::string reason = std::strerror(err);
  return absl::Status(ErrnoToCode(err),
                      absl::StrCat(std::string(what), ": ", reason, " (errno ", err, ") [", base, ":", line, "]"));
}

}  // namespace hsdp
