// FakeDeviceApi, memory and IPC handles: allocation, address ranges,
// export and import of VMM fds and legacy handles (in-process and across
// processes), unmapping, device UUIDs. Streams, events and copies are in
// fake_device_api.cc. Where the driver is less kind than a naive fake, this
// follows the driver (docs/gpu.md): exported VMM fds are open files
// of one file (same inode), a legacy handle opened again is the same pointer
// with one more reference, only exportable allocations export.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "daemon/device/fake_device_api.h"
#include "daemon/device/fake_device_arena.h"
#include "daemon/device/fake_shm.h"

namespace hsdp::device {
namespace {

constexpr uint64_t kAlign = 256;
constexpr uint64_t kMemMagic = 0x4D454D454B414646ull;  // "FFAKEMEM"

// Layout of a fake memory handle (legacy bytes and the VMM fd's contents).
struct MemRecordFields {
  uint64_t magic;
  uint64_t base;
  uint64_t bytes;
  uint64_t generation;
  int32_t device;
  int32_t pad;
};
static_assert(sizeof(MemRecordFields) <= kIpcHandleBytes);

}  // namespace

absl::StatusOr<DevicePtr> FakeDeviceApi::Allocate(int device, uint64_t bytes,
                                                   AllocSharing sharing) {
  if (device < 0 || device >= DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrCat("fake device ", device, " does not exist"));
  }
  if (bytes == 0) return absl::InvalidArgumentError("allocation of 0 bytes");
  const uint64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  std::lock_guard<std::mutex> l(mu_);
  if (sharing == AllocSharing::kPosixFd && !posix_fd_supported_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "fake device ", device,
        " has no POSIX-fd handle support (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_"
        "SUPPORTED is 0)"));
  }
  Arena& a = *arenas_[device];
  for (auto it = a.free_ranges.begin(); it != a.free_ranges.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t off = it->first;
    const uint64_t left = it->second - need;
    a.free_ranges.erase(it);
    if (left > 0) a.free_ranges[off + need] = left;
    const DevicePtr base = reinterpret_cast<uintptr_t>(a.mem) + off;
    allocations_[base] =
        Allocation{device, need, next_generation_++, sharing == AllocSharing::kPosixFd};
    return base;
  }
  return absl::ResourceExhaustedError(
      absl::StrCat("fake device ", device, ": no free range of ", need, " bytes"));
}

absl::Status FakeDeviceApi::Free(DevicePtr base) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = allocations_.find(base);
  if (it == allocations_.end()) return absl::NotFoundError("free of an unknown device pointer");
  Arena& a = *arenas_[it->second.device];
  uint64_t off = base - reinterpret_cast<uintptr_t>(a.mem);
  uint64_t len = it->second.bytes;
  allocations_.erase(it);
  // Coalesce with the neighbours so the same address comes back first.
  auto next = a.free_ranges.lower_bound(off);
  if (next != a.free_ranges.end() && next->first == off + len) {
    len += next->second;
    a.free_ranges.erase(next);
  }
  auto prev = a.free_ranges.lower_bound(off);
  if (prev != a.free_ranges.begin()) {
    --prev;
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      a.free_ranges.erase(prev);
    }
  }
  a.free_ranges[off] = len;
  return absl::OkStatus();
}

absl::StatusOr<AddressRange> FakeDeviceApi::GetAddressRange(DevicePtr ptr) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = allocations_.upper_bound(ptr);
  if (it != allocations_.begin()) {
    --it;
    if (ptr < it->first + it->second.bytes) return AddressRange{it->first, it->second.bytes};
  }
  return absl::NotFoundError("pointer is not inside a fake device allocation");
}

IpcHandleBytes FakeDeviceApi::MemRecord(DevicePtr base, const Allocation& a) const {
  MemRecordFields f{kMemMagic, base, a.bytes, a.generation, a.device, 0};
  IpcHandleBytes out{};
  std::memcpy(out.data(), &f, sizeof(f));
  return out;
}

absl::StatusOr<IpcHandleBytes> FakeDeviceApi::ExportLegacy(DevicePtr base) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = allocations_.find(base);
  if (it == allocations_.end()) {
    return absl::InvalidArgumentError("export: not the base of a fake device allocation");
  }
  return MemRecord(base, it->second);
}

absl::StatusOr<UniqueFd> FakeDeviceApi::ExportFd(DevicePtr base) {
  // Like the driver: every exported fd is a new open file of ONE file (the
  // driver's control device), so (st_dev, st_ino) is the same for all of
  // them; what tells allocations apart is the open file itself. Here the
  // open file's position names the allocation's record in that file.
  IpcHandleBytes record;
  off_t at;
  std::lock_guard<std::mutex> l(mu_);
  auto it = allocations_.find(base);
  if (it == allocations_.end()) {
    return absl::InvalidArgumentError("export: not the base of a fake device allocation");
  }
  if (!it->second.exportable) {
    return absl::InvalidArgumentError(
        "export: the allocation was not created with a shareable handle type "
        "(cuMemExportToShareableHandle refuses it)");
  }
  record = MemRecord(base, it->second);
  if (!control_.valid()) {
    control_.Reset(::memfd_create("hsdp-fake-nvidiactl", MFD_CLOEXEC));
    if (!control_.valid()) return absl::InternalError("memfd_create failed");
  }
  at = static_cast<off_t>(next_record_++ * kIpcHandleBytes);
  if (::pwrite(control_.get(), record.data(), record.size(), at) !=
      static_cast<ssize_t>(record.size())) {
    return absl::InternalError("writing the fake VMM handle failed");
  }
  const std::string path = absl::StrCat("/proc/self/fd/", control_.get());
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid()) return absl::InternalError("re-opening the fake control file failed");
  if (::lseek(fd.get(), at, SEEK_SET) != at) return absl::InternalError("lseek failed");
  return fd;
}

absl::StatusOr<Mapping> FakeDeviceApi::ImportRecord(int device, const IpcHandleBytes& record,
                                                    uint64_t claimed_bytes) {
  MemRecordFields f;
  std::memcpy(&f, record.data(), sizeof(f));
  if (f.magic != kMemMagic) return absl::InvalidArgumentError("not a fake device memory handle");
  std::lock_guard<std::mutex> l(mu_);
  auto it = allocations_.find(f.base);
  if (it == allocations_.end() || it->second.generation != f.generation) {
    return absl::InvalidArgumentError(
        "the allocation this handle names was freed (stale device memory handle)");
  }
  if (f.device != device || it->second.device != device) {
    return absl::InvalidArgumentError(absl::StrCat("handle names an allocation on device ",
                                                   it->second.device, ", not ", device));
  }
  if (claimed_bytes > it->second.bytes) {
    return absl::InvalidArgumentError(absl::StrCat("claimed size ", claimed_bytes,
                                                   " exceeds the allocation (", it->second.bytes,
                                                   " bytes)"));
  }
  Mapping m{f.base, it->second.bytes, device, next_handle_++};
  mappings_[m.token] = m;
  ++imports_;
  return m;
}

absl::StatusOr<Mapping> FakeDeviceApi::ImportForeign(int device, int fd, uint64_t bytes,
                                                     bool vmm) {
  if (device < 0 || device >= DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrCat("fake device ", device, " does not exist"));
  }
  absl::StatusOr<fakeshm::MappedFile> m =
      vmm ? fakeshm::MapVmmHandle(fd, bytes) : fakeshm::MapFile(fd, bytes);
  if (!m.ok()) return m.status();
  std::lock_guard<std::mutex> l(mu_);
  Mapping out{reinterpret_cast<uintptr_t>(m->data), m->bytes, device, next_handle_++};
  mappings_[out.token] = out;
  foreign_[out.ptr] = m->bytes;
  ++imports_;
  return out;
}

absl::StatusOr<Mapping> FakeDeviceApi::ImportLegacy(int device, const IpcHandleBytes& handle) {
  if (cross_process_) {
    absl::StatusOr<std::string> name = fakeshm::HandleName(fakeshm::kLegacyMagic, handle);
    if (!name.ok()) return name.status();
    UniqueFd fd(::shm_open(name->c_str(), O_RDWR | O_CLOEXEC, 0));
    if (!fd.valid()) return absl::InvalidArgumentError("legacy handle names no live allocation");
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return absl::InvalidArgumentError("fstat failed");
    const std::string key = absl::StrCat(*name, "#", st.st_dev, ":", st.st_ino);
    {
      std::lock_guard<std::mutex> l(mu_);
      if (auto it = legacy_open_.find(key); it != legacy_open_.end()) {
        if (device < 0 || device >= DeviceCount()) {
          return absl::InvalidArgumentError(absl::StrCat("fake device ", device, " does not exist"));
        }
        ++it->second.refs;  // the same pointer, one more reference
        Mapping out{it->second.ptr, it->second.bytes, device, next_handle_++};
        mappings_[out.token] = out;
        legacy_tokens_[out.token] = key;
        ++imports_;
        return out;
      }
    }
    absl::StatusOr<Mapping> m = ImportForeign(device, fd.get(), 0, /*vmm=*/false);
    if (!m.ok()) return m;
    std::lock_guard<std::mutex> l(mu_);
    legacy_open_[key] = LegacyOpen{m->ptr, m->bytes, 1};
    legacy_tokens_[m->token] = key;
    return m;
  }
  return ImportRecord(device, handle, 0);
}

absl::StatusOr<Mapping> FakeDeviceApi::ImportFd(int device, int fd, uint64_t bytes) {
  if (cross_process_) return ImportForeign(device, fd, bytes, /*vmm=*/true);
  IpcHandleBytes record{};
  const off_t at = ::lseek(fd, 0, SEEK_CUR);  // the open file names the allocation
  if (at < 0 || ::pread(fd, record.data(), record.size(), at) !=
                    static_cast<ssize_t>(record.size())) {
    return absl::InvalidArgumentError("fd is not a fake VMM handle (short read)");
  }
  return ImportRecord(device, record, bytes);
}

absl::Status FakeDeviceApi::Unmap(const Mapping& mapping) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = mappings_.find(mapping.token);
  if (it == mappings_.end()) return absl::NotFoundError("unmap of an unknown mapping");
  if (auto t = legacy_tokens_.find(mapping.token); t != legacy_tokens_.end()) {
    auto open = legacy_open_.find(t->second);
    legacy_tokens_.erase(t);
    if (open != legacy_open_.end() && --open->second.refs > 0) {
      mappings_.erase(it);  // other opens of the handle still use the memory
      return absl::OkStatus();
    }
    if (open != legacy_open_.end()) legacy_open_.erase(open);
  }
  if (auto f = foreign_.find(it->second.ptr); f != foreign_.end()) {
    ::munmap(reinterpret_cast<void*>(f->first), f->second);
    foreign_.erase(f);
  }
  mappings_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<DeviceUuid> FakeDeviceApi::UuidOf(int device) const {
  if (device < 0 || device >= DeviceCount()) {
    return absl::InvalidArgumentError(absl::StrCat("fake device ", device, " does not exist"));
  }
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = uuids_.find(device); it != uuids_.end()) return it->second;
  return FakeUuid(device);
}

DeviceUuid FakeUuid(int device) {
  DeviceUuid u{};
  std::memcpy(u.data(), "hsdp-fake-gpu", 13);
  u[13] = static_cast<uint8_t>(device >> 16);
  u[14] = static_cast<uint8_t>(device >> 8);
  u[15] = static_cast<uint8_t>(device);
  return u;
}

void FakeDeviceApi::set_uuid(int device, const DeviceUuid& uuid) {
  std::lock_guard<std::mutex> l(mu_);
  uuids_[device] = uuid;
}

void FakeDeviceApi::set_posix_fd_supported(bool supported) {
  std::lock_guard<std::mutex> l(mu_);
  posix_fd_supported_ = supported;
}

}  // namespace hsdp::device
