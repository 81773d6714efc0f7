#include "daemon/session/mapped_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "hsdp/common/status_macros.h"

namespace hsdp {

absl::StatusOr<std::shared_ptr<MappedBuffer>> MappedBuffer::Map(UniqueFd fd, uint64_t size,
                                                                std::string name) {
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) {
    return absl::InvalidArgumentError(
        "buffer fd: not a sealable memfd (create it with memfd_create(MFD_ALLOW_SEALING))");
  }
  if ((seals & F_SEAL_SHRINK) == 0) {
    return absl::InvalidArgumentError("buffer fd: must be sealed with F_SEAL_SHRINK");
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, "fstat(buffer)", __FILE__, __LINE__);
  if (static_cast<uint64_t>(st.st_size) < size) {
    return absl::InvalidArgumentError(absl::StrCat("size_bytes: ", size,
                                                   " exceeds the memfd's size of ", st.st_size));
  }
  // MAP_POPULATE: fault the (already allocated) pages in now, at
  // registration, not during the first collective.
  void* m = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(), 0);
  if (m == MAP_FAILED) return ErrnoStatus(errno, "mmap(buffer)", __FILE__, __LINE__);
  std::shared_ptr<MappedBuffer> b(new MappedBuffer());
  b->data_ = static_cast<char*>(m);
  b->size_ = size;
  b->name_ = std::move(name);
  return b;  // the mapping keeps the memory alive; the fd closes here
}

MappedBuffer::~MappedBuffer() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace hsdp
