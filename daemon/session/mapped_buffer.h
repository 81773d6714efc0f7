// A client's host buffer mapped into the daemon. Shared by the session's
// registry and by every in-flight operation that reads or writes it, so
// freeing a buffer or ending a session never unmaps memory under a running
// collective.
#ifndef HSDP_DAEMON_SESSION_MAPPED_BUFFER_H_
#define HSDP_DAEMON_SESSION_MAPPED_BUFFER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "hsdp/common/unique_fd.h"

namespace hsdp {

class MappedBuffer {
 public:
  // Maps `size` bytes of `fd`. The fd must be a memfd sealed against
  // shrinking (F_SEAL_SHRINK) and at least `size` bytes long, so the client
  // cannot truncate it under us (which would SIGBUS the daemon).
  // INVALID_ARGUMENT otherwise, naming what is wrong.
  static absl::StatusOr<std::shared_ptr<MappedBuffer>> Map(UniqueFd fd, uint64_t size,
                                                           std::string name);
  ~MappedBuffer();
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;

  char* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

 private:
  MappedBuffer() = default;
  char* data_ = nullptr;
  uint64_t size_ = 0;
  std::string name_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SESSION_MAPPED_BUFFER_H_
