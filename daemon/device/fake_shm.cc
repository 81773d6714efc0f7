#include "daemon/device/fake_shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <chrono>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace hsdp::device::fakeshm {
namespace {

constexpr char kNamePrefix[] = "/hsdp-fake";

std::atomic<uint64_t> g_next_name{1};

std::string UniqueName(const char* what) {
  return absl::StrCat(kNamePrefix, what, "-", ::getpid(), "-", g_next_name.fetch_add(1));
}

}  // namespace

absl::StatusOr<IpcHandleBytes> NameHandle(uint64_t magic, const std::string& name) {
  if (name.size() + 1 > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("fake handle name too long: ", name));
  }
  IpcHandleBytes out{};
  std::memcpy(out.data(), &magic, sizeof(magic));
  std::memcpy(out.data() + 8, name.data(), name.size());
  return out;
}

absl::StatusOr<std::string> HandleName(uint64_t magic, const IpcHandleBytes& handle) {
  uint64_t m;
  std::memcpy(&m, handle.data(), sizeof(m));
  if (m != magic) return absl::InvalidArgumentError("not a fake device handle of this kind");
  const char* p = reinterpret_cast<const char*>(handle.data() + 8);
  const size_t n = strnlen(p, kMaxNameBytes);
  if (n == kMaxNameBytes) return absl::InvalidArgumentError("fake handle name is not terminated");
  std::string name(p, n);
  // Only names this module makes: no "/", "..", or other objects.
  if (!absl::StartsWith(name, kNamePrefix) || name.find('/', 1) != std::string::npos) {
    return absl::InvalidArgumentError("fake handle names no fake device object");
  }
  return name;
}

absl::StatusOr<MappedFile> MapFile(int fd, uint64_t min_bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::InvalidArgumentError("fake device fd: fstat failed");
  if (!S_ISREG(st.st_mode) || st.st_size <= 0) {
    return absl::InvalidArgumentError("fake device fd is not a shared-memory file");
  }
  const uint64_t bytes = static_cast<uint64_t>(st.st_size);
  if (bytes < min_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("claimed size ", min_bytes,
                                                   " exceeds the allocation (", bytes, " bytes)"));
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return absl::InvalidArgumentError("fake device fd cannot be mapped");
  return MappedFile{p, bytes};
}

absl::StatusOr<MappedFile> MapVmmHandle(int fd, uint64_t bytes) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return absl::InvalidArgumentError("fake device fd: fstat failed");
  if (!S_ISREG(st.st_mode) || st.st_size <= 0) {
    return absl::InvalidArgumentError("fake device fd is not a shared-memory file");
  }
  const off_t at = ::lseek(fd, 0, SEEK_CUR);
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (at < 0 || static_cast<uint64_t>(at) % page != 0 || static_cast<uint64_t>(at) >= size) {
    return absl::InvalidArgumentError("fake VMM fd: its position names no allocation");
  }
  const uint64_t left = size - static_cast<uint64_t>(at);
  const uint64_t want = bytes == 0 ? left : bytes;
  if (want > left) {
    return absl::InvalidArgumentError(absl::StrCat("claimed size ", want,
                                                   " exceeds the allocation (", left, " bytes)"));
  }
  void* p = ::mmap(nullptr, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, at);
  if (p == MAP_FAILED) return absl::InvalidArgumentError("fake device fd cannot be mapped");
  return MappedFile{p, want};
}

SharedEvent::~SharedEvent() {
  if (block_ != nullptr) ::munmap(block_, sizeof(EventBlock));
  if (owner_) ::shm_unlink(name_.c_str());
}

absl::StatusOr<std::unique_ptr<SharedEvent>> SharedEvent::Create() {
  std::unique_ptr<SharedEvent> e(new SharedEvent());
  e->name_ = UniqueName("ev");
  UniqueFd fd(::shm_open(e->name_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) return absl::InternalError("shm_open of a fake event failed");
  e->owner_ = true;
  if (::ftruncate(fd.get(), sizeof(EventBlock)) != 0) {
    return absl::InternalError("ftruncate of a fake event failed");
  }
  absl::StatusOr<MappedFile> m = MapFile(fd.get(), sizeof(EventBlock));
  if (!m.ok()) return m.status();
  e->block_ = static_cast<EventBlock*>(m->data);
  auto h = NameHandle(kEventMagic, e->name_);
  if (!h.ok()) return h.status();
  e->handle_ = *h;
  return e;
}

absl::StatusOr<std::unique_ptr<SharedEvent>> SharedEvent::Open(const IpcHandleBytes& handle) {
  absl::StatusOr<std::string> name = HandleName(kEventMagic, handle);
  if (!name.ok()) return name.status();
  UniqueFd fd(::shm_open(name->c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd.valid()) return absl::InvalidArgumentError("fake event handle names no live event");
  absl::StatusOr<MappedFile> m = MapFile(fd.get(), sizeof(EventBlock));
  if (!m.ok()) return m.status();
  if (m->bytes != sizeof(EventBlock)) {
    ::munmap(m->data, m->bytes);
    return absl::InvalidArgumentError("fake event handle names an object of the wrong size");
  }
  std::unique_ptr<SharedEvent> e(new SharedEvent());
  e->block_ = static_cast<EventBlock*>(m->data);
  e->handle_ = handle;
  e->name_ = *name;
  return e;
}

FakeTrainerDevice::~FakeTrainerDevice() = default;

absl::StatusOr<std::unique_ptr<FakeTrainerDevice::Allocation>> FakeTrainerDevice::AllocateVmm(
    uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("allocation of 0 bytes");
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t size = (bytes + page - 1) / page * page;
  auto a = std::make_unique<Allocation>();
  std::lock_guard<std::mutex> l(mu_);
  if (!control_.valid()) {
    control_.Reset(::memfd_create("hsdp-fake-device", MFD_CLOEXEC));
    if (!control_.valid()) return absl::InternalError("memfd_create failed");
  }
  const uint64_t off = next_off_;
  if (::ftruncate(control_.get(), static_cast<off_t>(off + size)) != 0) {
    return absl::InternalError("ftruncate failed");
  }
  next_off_ += size;
  const std::string path = absl::StrCat("/proc/self/fd/", control_.get());
  a->fd.Reset(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!a->fd.valid()) return absl::InternalError("re-opening the fake control memfd failed");
  if (::lseek(a->fd.get(), static_cast<off_t>(off), SEEK_SET) != static_cast<off_t>(off)) {
    return absl::InternalError("lseek failed");
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, control_.get(),
                   static_cast<off_t>(off));
  if (p == MAP_FAILED) return absl::InternalError("mmap of the fake allocation failed");
  a->data = p;
  a->bytes = size;
  return a;
}

absl::StatusOr<std::unique_ptr<FakeTrainerDevice::Allocation>> FakeTrainerDevice::AllocateLegacy(
    uint64_t bytes, int slot) {
  auto a = std::make_unique<Allocation>();
  a->name = absl::StrCat(kNamePrefix, "dev-", ::getpid(), "-", slot);
  UniqueFd fd(::shm_open(a->name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) return absl::InternalError(absl::StrCat("shm_open ", a->name, " failed"));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    ::shm_unlink(a->name.c_str());
    return absl::InternalError("ftruncate failed");
  }
  absl::StatusOr<MappedFile> m = MapFile(fd.get(), bytes);
  if (!m.ok()) {
    ::shm_unlink(a->name.c_str());
    return m.status();
  }
  a->data = m->data;
  a->bytes = m->bytes;
  auto h = NameHandle(kLegacyMagic, a->name);
  if (!h.ok()) return h.status();
  a->handle = *h;
  return a;
}

void FakeTrainerDevice::Free(std::unique_ptr<Allocation> a) {
  if (a == nullptr) return;
  if (a->data != nullptr) ::munmap(a->data, a->bytes);
  if (!a->name.empty()) ::shm_unlink(a->name.c_str());
}

absl::StatusOr<std::unique_ptr<FakeTrainerDevice::ProducerEvent>>
FakeTrainerDevice::CreateEvent() {
  auto shared = SharedEvent::Create();
  if (!shared.ok()) return shared.status();
  auto e = std::make_unique<ProducerEvent>();
  e->shared = *std::move(shared);
  return e;
}

absl::Status FakeTrainerDevice::WaitEvent(const IpcHandleBytes& handle, absl::Duration timeout) {
  auto e = SharedEvent::Open(handle);
  if (!e.ok()) return e.status();
  const absl::Time deadline = absl::Now() + timeout;
  EventBlock* b = (*e)->block();
  while (b->completed.load() < b->recorded.load()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("fake completion event not reached in time");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return absl::OkStatus();
}

}  // namespace hsdp::device::fakeshm
