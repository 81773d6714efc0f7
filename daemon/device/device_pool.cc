#include "daemon/device/device_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"

namespace hsdp::device {

absl::StatusOr<std::unique_ptr<DevicePool>> DevicePool::Create(DeviceApi* dev,
                                                               const std::vector<int>& devices,
                                                               uint64_t bytes_per_device,
                                                               double max_session_fraction) {
  if (bytes_per_device < kAlign || !(max_session_fraction > 0 && max_session_fraction <= 1)) {
    return absl::InvalidArgumentError("device pool: size or session fraction out of range");
  }
  std::unique_ptr<DevicePool> pool(new DevicePool(dev, max_session_fraction));
  const uint64_t size = bytes_per_device / kAlign * kAlign;
  for (int d : devices) {
    absl::StatusOr<DevicePtr> base = dev->Allocate(d, size, AllocSharing::kPosixFd);  // exported to clients
    if (!base.ok()) {
      return absl::Status(base.status().code(),
                          absl::StrCat("device pool on device ", d, ": ", base.status().message()));
    }
    Pool& p = pool->pools_[d];
    p.base = *base;
    p.bytes = size;
    p.free[0] = size;
  }
  return pool;
}

DevicePool::~DevicePool() {
  for (auto& [d, p] : pools_) {
    if (absl::Status s = dev_->Free(p.base); !s.ok()) {
      HSDP_LOG(Warning) << "freeing the device pool of device " << d << ": " << s.message();
    }
  }
}

absl::StatusOr<UniqueFd> DevicePool::Export(int device) const {
  DevicePtr base;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = pools_.find(device);
    if (it == pools_.end()) return absl::NotFoundError(absl::StrCat("no device pool on ", device));
    base = it->second.base;
  }
  return dev_->ExportFd(base);
}

uint64_t DevicePool::pool_bytes(int device) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pools_.find(device);
  return it == pools_.end() ? 0 : it->second.bytes;
}

absl::StatusOr<PoolRange> DevicePool::Allocate(uint64_t session, int device, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("size_bytes: must be > 0");
  std::lock_guard<std::mutex> l(mu_);
  auto it = pools_.find(device);
  if (it == pools_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("device: no device pool on device ", device));
  }
  Pool& p = it->second;
  if (bytes > p.bytes) {
    return absl::ResourceExhaustedError(absl::StrCat("device pool of device ", device, " has ",
                                                     p.bytes, " bytes; ", bytes, " requested"));
  }
  const uint64_t need = (bytes + kAlign - 1) / kAlign * kAlign;
  const uint64_t share = static_cast<uint64_t>(static_cast<double>(p.bytes) * fraction_);
  uint64_t& mine = session_bytes_[session];
  if (need > share || mine > share - need) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device pool: session ", session, " would hold ", mine + need, " bytes of device ", device,
        "'s pool, above its share of ", share));
  }
  for (auto f = p.free.begin(); f != p.free.end(); ++f) {
    if (f->second < need) continue;
    const uint64_t off = f->first;
    const uint64_t left = f->second - need;
    p.free.erase(f);
    if (left > 0) p.free[off + need] = left;
    p.used[off] = {need, session};
    p.used_bytes += need;
    mine += need;
    return PoolRange{device, off, need, p.base + off};
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "device pool of device ", device, ": no free range of ", need, " bytes (", p.used_bytes,
      " of ", p.bytes, " in use)"));
}

void DevicePool::Release(Pool& p, uint64_t offset) {
  auto u = p.used.find(offset);
  uint64_t off = offset, len = u->second.first;
  p.used_bytes -= len;
  session_bytes_[u->second.second] -= len;
  p.used.erase(u);
  auto next = p.free.lower_bound(off);
  if (next != p.free.end() && next->first == off + len) {
    len += next->second;
    p.free.erase(next);
  }
  auto prev = p.free.lower_bound(off);
  if (prev != p.free.begin()) {
    --prev;
    if (prev->first + prev->second == off) {
      off = prev->first;
      len += prev->second;
      p.free.erase(prev);
    }
  }
  p.free[off] = len;
}

absl::Status DevicePool::Free(uint64_t session, int device, uint64_t offset) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pools_.find(device);
  if (it != pools_.end()) {
    auto u = it->second.used.find(offset);
    if (u != it->second.used.end() && u->second.second == session) {
      Release(it->second, offset);
      return absl::OkStatus();
    }
  }
  return absl::NotFoundError(absl::StrCat("offset: no pool range at ", offset, " on device ",
                                          device, " for session ", session));
}

absl::StatusOr<PoolRange> DevicePool::Resolve(uint64_t session, int device, uint64_t offset,
                                              uint64_t bytes) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pools_.find(device);
  if (it != pools_.end()) {
    const Pool& p = it->second;
    auto u = p.used.upper_bound(offset);
    if (u != p.used.begin()) {
      --u;
      const uint64_t start = u->first, len = u->second.first;
      if (u->second.second == session && offset - start <= len && bytes <= len - (offset - start)) {
        return PoolRange{device, offset, bytes, p.base + offset};
      }
    }
  }
  return absl::InvalidArgumentError(absl::StrCat("offset_bytes: [", offset, ", +", bytes,
                                                 ") is not inside a pool range of session ",
                                                 session, " on device ", device));
}

void DevicePool::EndSession(uint64_t session) {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [d, p] : pools_) {
    std::vector<uint64_t> mine;
    for (const auto& [off, u] : p.used) {
      if (u.second == session) mine.push_back(off);
    }
    for (uint64_t off : mine) Release(p, off);
  }
  session_bytes_.erase(session);
}

uint64_t DevicePool::used_bytes(int device) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pools_.find(device);
  return it == pools_.end() ? 0 : it->second.used_bytes;
}

uint64_t DevicePool::session_bytes(uint64_t session) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = session_bytes_.find(session);
  return it == session_bytes_.end() ? 0 : it->second;
}

}  // namespace hsdp::device
