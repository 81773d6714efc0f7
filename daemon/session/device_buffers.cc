#include "daemon/session/device_buffers.h"

#include <fcntl.h>
#include <linux/kcmp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp {
namespace {

absl::Status Invalid(const char* field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// kcmp(2) KCMP_FILE: 0 when fds a and b of this process are the same open
// file, 1 or 2 when they differ, -1 (errno) when the kernel refuses.
int CompareOpenFiles(int a, int b) {
  const pid_t self = ::getpid();
  return static_cast<int>(::syscall(SYS_kcmp, self, self, KCMP_FILE, a, b));
}

}  // namespace

bool DeviceBufferRegistry::CanCompareOpenFiles() {
  static const bool ok = [] {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return false;
    UniqueFd r(fds[0]), w(fds[1]);
    UniqueFd r2(::dup(r.get()));
    return r2.valid() && CompareOpenFiles(r.get(), r2.get()) == 0 &&
           CompareOpenFiles(r.get(), w.get()) > 0;
  }();
  return ok;
}

struct DeviceBufferRegistry::MappingHold {
  MappingHold(device::DeviceApi* d, device::Mapping m, UniqueFd f)
      : dev(d), mapping(m), fd(std::move(f)) {}
  ~MappingHold() {
    if (absl::Status st = dev->Unmap(mapping); !st.ok()) {
      HSDP_LOG(Warning) << "unmapping a device allocation failed: " << st.message();
    }
  }
  device::DeviceApi* const dev;
  const device::Mapping mapping;
  UniqueFd fd;  // VMM: the open file buffers of this allocation are compared with
};

DeviceBufferRegistry::DeviceBufferRegistry(device::DeviceApi* dev, DeviceBufferLimits limits)
    : dev_(dev), limits_(limits) {}

DeviceBufferRegistry::~DeviceBufferRegistry() {
  std::vector<uint64_t> ids;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [id, s] : sessions_) ids.push_back(id);
  }
  for (uint64_t id : ids) EndSession(id);
}

absl::StatusOr<DeviceBufferRegistry::MappingKey> DeviceBufferRegistry::KeyOf(
    PerSession& s, const DeviceBufferRequest& r) const {
  switch (r.kind) {
    case device::HandleKind::kLegacyIpc:
      return MappingKey{static_cast<int>(r.kind), r.device,
                        std::string(reinterpret_cast<const char*>(r.handle.data()),
                                    r.handle.size()),
                        r.generation};
    case device::HandleKind::kVmmFd: {
      // Never the inode: every exported cuMem fd is an open file of the
      // driver's control device, so (st_dev, st_ino) names no allocation.
      if (!r.fd.valid()) {
        return Invalid("fd", "no valid file descriptor was passed for the VMM handle");
      }
      const bool can_compare = CanCompareOpenFiles();
      if (r.allocation_id != 0) {
        std::string id = "id:";
        id.append(reinterpret_cast<const char*>(&r.allocation_id), sizeof(r.allocation_id));
        MappingKey key{static_cast<int>(r.kind), r.device, id, r.generation};
        auto it = s.mappings.find(key);
        if (it != s.mappings.end() && can_compare &&
            CompareOpenFiles(it->second.hold->fd.get(), r.fd.get()) != 0) {
          return Invalid("allocation_id",
                         absl::StrCat("allocation ", r.allocation_id, " (generation ",
                                      r.generation, ") of this session was registered with "
                                      "another exported file; send the fd it was registered "
                                      "with, or a new allocation id"));
        }
        return key;
      }
      // No id: the same open file (kcmp) is the same allocation; without
      // kcmp every registration maps its own (correct, only costlier).
      if (can_compare) {
        for (const auto& [key, e] : s.mappings) {
          if (std::get<0>(key) == static_cast<int>(r.kind) && std::get<1>(key) == r.device &&
              std::get<3>(key) == r.generation && std::get<2>(key).rfind("file:", 0) == 0 &&
              CompareOpenFiles(e.hold->fd.get(), r.fd.get()) == 0) {
            return key;
          }
        }
      }
      std::string file = "file:";
      const uint64_t n = s.next_file_key++;
      file.append(reinterpret_cast<const char*>(&n), sizeof(n));
      return MappingKey{static_cast<int>(r.kind), r.device, file, r.generation};
    }
    default:
      return Invalid("handle_kind", absl::StrCat("unknown device handle kind ",
                                                 static_cast<int>(r.kind)));
  }
}

absl::StatusOr<uint64_t> DeviceBufferRegistry::Register(uint64_t session_id,
                                                        DeviceBufferRequest r) {
  if (r.device < 0 || r.device >= dev_->DeviceCount()) {
    return Invalid("device", absl::StrCat("device ", r.device, " is not one of the ",
                                          dev_->DeviceCount(), " devices this daemon sees"));
  }
  if (r.size_bytes == 0) return Invalid("size_bytes", "must be > 0");
  if (r.offset > (1ull << 50) || r.size_bytes > (1ull << 50)) {
    return Invalid("offset", "offset or size is beyond any device allocation");
  }
  if (r.kind == device::HandleKind::kVmmFd &&
      (r.allocation_bytes == 0 || r.offset + r.size_bytes > r.allocation_bytes)) {
    return Invalid("allocation_bytes", absl::StrCat("buffer [", r.offset, ", +", r.size_bytes,
                                                    ") does not fit the exported allocation of ",
                                                    r.allocation_bytes, " bytes"));
  }
  std::lock_guard<std::mutex> l(mu_);
  PerSession& s = sessions_[session_id];
  auto key = KeyOf(s, r);
  if (!key.ok()) return key.status();
  if (s.buffers.size() >= limits_.max_buffers_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device buffers per session: the limit of ", limits_.max_buffers_per_session, " is reached"));
  }
  auto it = s.mappings.find(*key);
  if (it == s.mappings.end()) {
    // A new allocation: check every limit before importing it.
    if (s.mappings.size() >= limits_.max_mappings_per_session) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device mappings per session: the limit of ", limits_.max_mappings_per_session,
          " is reached"));
    }
    if (node_mappings_ >= limits_.max_node_mappings) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device mappings on this node: the limit of ", limits_.max_node_mappings, " is reached"));
    }
    const uint64_t claimed = r.kind == device::HandleKind::kVmmFd ? r.allocation_bytes
                                                                  : r.offset + r.size_bytes;
    if (claimed > limits_.max_mapped_bytes_per_session - std::min(s.mapped_bytes, limits_.max_mapped_bytes_per_session)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "device bytes per session: mapping ", claimed, " more bytes exceeds the limit of ",
          limits_.max_mapped_bytes_per_session));
    }
    absl::StatusOr<device::Mapping> m =
        r.kind == device::HandleKind::kVmmFd
            ? dev_->ImportFd(r.device, r.fd.get(), r.allocation_bytes)
            : dev_->ImportLegacy(r.device, r.handle);
    if (!m.ok()) {
      return absl::Status(m.status().code(),
                          absl::StrCat("importing the ", device::HandleKindName(r.kind),
                                       " handle on device ", r.device, ": ", m.status().message()));
    }
    if (s.mapped_bytes + m->bytes > limits_.max_mapped_bytes_per_session) {
      (void)dev_->Unmap(*m);
      return absl::ResourceExhaustedError(absl::StrCat(
          "device bytes per session: the allocation of ", m->bytes,
          " bytes exceeds the limit of ", limits_.max_mapped_bytes_per_session));
    }
    MappingEntry e;
    e.mapping = *m;
    e.hold = std::make_shared<MappingHold>(dev_, *m, std::move(r.fd));
    it = s.mappings.emplace(*key, std::move(e)).first;
    s.mapped_bytes += m->bytes;
    ++node_mappings_;
  }
  MappingEntry& e = it->second;
  if (r.offset > e.mapping.bytes || r.size_bytes > e.mapping.bytes - r.offset) {
    const absl::Status bad = Invalid(
        "offset", absl::StrCat("buffer [", r.offset, ", +", r.size_bytes,
                               ") is outside the allocation of ", e.mapping.bytes, " bytes"));
    if (e.refs == 0) Unmap(s, it);  // `e` is gone after this
    return bad;
  }
  ++e.refs;
  const uint64_t id = kDeviceBufferIdBit | s.next_buffer++;
  s.buffers[id] = Buffer{*key, r.device, e.mapping.ptr + r.offset, r.size_bytes, e.hold};
  return id;
}

void DeviceBufferRegistry::Unmap(PerSession& s,
                                 std::map<MappingKey, MappingEntry>::iterator it) {
  // The hold unmaps now, or when the last operation using it completes.
  s.mapped_bytes -= std::min(s.mapped_bytes, it->second.mapping.bytes);
  --node_mappings_;
  s.mappings.erase(it);
}

absl::StatusOr<uint64_t> DeviceBufferRegistry::RegisterOwned(uint64_t session_id, int device,
                                                             device::DevicePtr ptr, uint64_t bytes,
                                                             std::function<void()> release) {
  std::lock_guard<std::mutex> l(mu_);
  PerSession& s = sessions_[session_id];
  if (s.buffers.size() >= limits_.max_buffers_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device buffers per session: the limit of ", limits_.max_buffers_per_session, " is reached"));
  }
  const uint64_t id = kDeviceBufferIdBit | s.next_buffer++;
  std::shared_ptr<const void> keep(nullptr, [release = std::move(release)](const void*) {
    if (release) release();
  });
  s.buffers[id] = Buffer{MappingKey{}, device, ptr, bytes, std::move(keep)};
  return id;
}

absl::Status DeviceBufferRegistry::Free(uint64_t session_id, uint64_t buffer_id) {
  // Dropped after the lock: the last holder unmaps or gives a range back.
  std::shared_ptr<const void> release;
  std::shared_ptr<MappingHold> hold;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto si = sessions_.find(session_id);
    if (si == sessions_.end() || si->second.buffers.count(buffer_id) == 0) {
      return absl::NotFoundError(absl::StrCat("buffer_id: no device buffer ", buffer_id,
                                              " in session ", session_id));
    }
    PerSession& s = si->second;
    auto bi = s.buffers.find(buffer_id);
    release = std::move(bi->second.keep);
    auto mi = s.mappings.find(bi->second.key);
    s.buffers.erase(bi);
    if (mi != s.mappings.end() && --mi->second.refs == 0) {
      hold = std::move(mi->second.hold);
      Unmap(s, mi);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceRange> DeviceBufferRegistry::Resolve(uint64_t session_id, uint64_t buffer_id,
                                                          uint64_t offset, uint64_t bytes,
                                                          const char* field) const {
  std::lock_guard<std::mutex> l(mu_);
  auto si = sessions_.find(session_id);
  const Buffer* b = nullptr;
  if (si != sessions_.end()) {
    auto bi = si->second.buffers.find(buffer_id);
    if (bi != si->second.buffers.end()) b = &bi->second;
  }
  if (b == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".buffer_id: unknown device buffer ",
                                                   buffer_id, " in session ", session_id));
  }
  if (offset > b->bytes || bytes > b->bytes - offset) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".offset_bytes: range [", offset, ", +",
                                                   bytes, ") is outside device buffer ",
                                                   buffer_id, " of ", b->bytes, " bytes"));
  }
  return DeviceRange{b->device, b->ptr + offset, bytes, b->keep};
}

absl::StatusOr<uint64_t> DeviceBufferRegistry::RegisterEvent(uint64_t session_id, int device,
                                                             const device::IpcHandleBytes& handle) {
  if (device < 0 || device >= dev_->DeviceCount()) {
    return Invalid("device", absl::StrCat("device ", device, " does not exist"));
  }
  std::lock_guard<std::mutex> l(mu_);
  PerSession& s = sessions_[session_id];
  if (s.events.size() >= limits_.max_events_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "device events per session: the limit of ", limits_.max_events_per_session,
        " is reached"));
  }
  absl::StatusOr<device::EventHandle> e = dev_->ImportEvent(device, handle);
  if (!e.ok()) {
    return absl::Status(e.status().code(),
                        absl::StrCat("opening the event handle: ", e.status().message()));
  }
  const uint64_t id = s.next_event++;
  s.events[id] = {device, *e};
  return id;
}

absl::Status DeviceBufferRegistry::FreeEvent(uint64_t session_id, uint64_t event_id) {
  std::lock_guard<std::mutex> l(mu_);
  auto si = sessions_.find(session_id);
  if (si == sessions_.end() || si->second.events.count(event_id) == 0) {
    return absl::NotFoundError(absl::StrCat("event_id: no device event ", event_id,
                                            " in session ", session_id));
  }
  dev_->DestroyEvent(si->second.events[event_id].second);
  si->second.events.erase(event_id);
  return absl::OkStatus();
}

absl::StatusOr<device::EventHandle> DeviceBufferRegistry::FindEvent(uint64_t session_id,
                                                                    uint64_t event_id,
                                                                    int device) const {
  std::lock_guard<std::mutex> l(mu_);
  auto si = sessions_.find(session_id);
  if (si != sessions_.end()) {
    auto ei = si->second.events.find(event_id);
    if (ei != si->second.events.end()) {
      if (ei->second.first != device) {
        return absl::InvalidArgumentError(absl::StrCat("event_id: event ", event_id,
                                                       " is on device ", ei->second.first,
                                                       ", the buffers on ", device));
      }
      return ei->second.second;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("event_id: unknown device event ", event_id, " in session ", session_id));
}

absl::StatusOr<std::vector<device::IpcHandleBytes>> DeviceBufferRegistry::CompletionEvents(
    uint64_t session_id, int device, uint32_t slots) {
  if (device < 0 || device >= dev_->DeviceCount()) {
    return Invalid("device", absl::StrCat("device ", device, " does not exist"));
  }
  if (slots == 0 || slots > 4096) {
    return absl::ResourceExhaustedError(
        absl::StrCat("completion events: ", slots, " slots (1 to 4096 allowed)"));
  }
  std::lock_guard<std::mutex> l(mu_);
  PerSession& s = sessions_[session_id];
  std::vector<device::EventHandle>& evs = s.completion[device];
  if (!evs.empty() && evs.size() != slots) {
    return absl::FailedPreconditionError(absl::StrCat(
        "completion events of device ", device, " exist with ", evs.size(), " slots"));
  }
  while (evs.size() < slots) {
    absl::StatusOr<device::EventHandle> e = dev_->CreateEvent(device, /*interprocess=*/true);
    if (!e.ok()) {
      for (device::EventHandle h : evs) dev_->DestroyEvent(h);
      evs.clear();
      return e.status();
    }
    evs.push_back(*e);
  }
  std::vector<device::IpcHandleBytes> out;
  for (device::EventHandle h : evs) {
    absl::StatusOr<device::IpcHandleBytes> bytes = dev_->ExportEvent(h);
    if (!bytes.ok()) return bytes.status();
    out.push_back(*bytes);
  }
  return out;
}

absl::StatusOr<device::EventHandle> DeviceBufferRegistry::CompletionEventFor(
    uint64_t session_id, int device, uint64_t op_id, uint64_t* event_id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto si = sessions_.find(session_id);
  if (si != sessions_.end()) {
    auto ci = si->second.completion.find(device);
    if (ci != si->second.completion.end() && !ci->second.empty()) {
      const uint64_t slot = op_id % ci->second.size();
      if (event_id != nullptr) *event_id = slot + 1;
      return ci->second[slot];
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "session ", session_id, " has no completion events on device ", device));
}

void DeviceBufferRegistry::EndSession(uint64_t session_id) {
  std::vector<std::shared_ptr<const void>> releases;  // dropped after the lock
  {
    std::lock_guard<std::mutex> l(mu_);
    auto si = sessions_.find(session_id);
    if (si == sessions_.end()) return;
    PerSession& s = si->second;
    for (auto& [id, b] : s.buffers) releases.push_back(std::move(b.keep));
    s.buffers.clear();
    while (!s.mappings.empty()) {
      releases.push_back(std::move(s.mappings.begin()->second.hold));
      Unmap(s, s.mappings.begin());
    }
    for (auto& [id, e] : s.events) dev_->DestroyEvent(e.second);
    for (auto& [d, evs] : s.completion) {
      for (device::EventHandle h : evs) dev_->DestroyEvent(h);
    }
    sessions_.erase(si);
  }
  releases.clear();
}

DeviceBufferStats DeviceBufferRegistry::Stats(uint64_t session_id) const {
  std::lock_guard<std::mutex> l(mu_);
  DeviceBufferStats out;
  auto si = sessions_.find(session_id);
  if (si == sessions_.end()) return out;
  out.buffers = static_cast<uint32_t>(si->second.buffers.size());
  out.mappings = static_cast<uint32_t>(si->second.mappings.size());
  out.mapped_bytes = si->second.mapped_bytes;
  out.events = static_cast<uint32_t>(si->second.events.size());
  return out;
}

uint32_t DeviceBufferRegistry::node_mappings() const {
  std::lock_guard<std::mutex> l(mu_);
  return node_mappings_;
}

absl::StatusOr<DeviceOperands> ResolveDeviceOperands(const DeviceBufferRegistry& registry,
                                                     uint64_t session_id,
                                                     const shm::OpDescriptor& d,
                                                     uint64_t send_bytes, uint64_t recv_bytes,
                                                     int group_rank, bool device_memory) {
  if (!device_memory) {
    return Invalid("send.buffer_id", "device buffers need the device-memory feature, which "
                                     "this session did not negotiate");
  }
  DeviceOperands out;
  const bool send_dev = IsDeviceBufferId(d.send.buffer_id);
  const bool recv_dev = IsDeviceBufferId(d.recv.buffer_id);
  if ((send_bytes > 0 && !send_dev) || (recv_bytes > 0 && !recv_dev)) {
    return Invalid(send_bytes > 0 && !send_dev ? "send.buffer_id" : "recv.buffer_id",
                   "one side names a device buffer and the other a host buffer");
  }
  if (send_bytes > 0) {
    auto r = registry.Resolve(session_id, d.send.buffer_id, d.send.offset_bytes, send_bytes, "send");
    if (!r.ok()) return r.status();
    out.send = *r;
  }
  if (recv_bytes > 0) {
    auto r = registry.Resolve(session_id, d.recv.buffer_id, d.recv.offset_bytes, recv_bytes, "recv");
    if (!r.ok()) return r.status();
    out.recv = *r;
  }
  const int device = send_bytes > 0 ? out.send.device : out.recv.device;
  if (send_bytes > 0 && recv_bytes > 0) {
    if (out.send.device != out.recv.device) {
      return Invalid("recv.buffer_id", absl::StrCat("send is on device ", out.send.device,
                                                    ", recv on device ", out.recv.device));
    }
    // Overlap: exact in-place layouts only (as for host buffers).
    const uint64_t s = out.send.ptr, r = out.recv.ptr;
    const uint64_t unit = d.count * DataTypeSize(static_cast<DataType>(d.dtype));
    if (s < r + recv_bytes && r < s + send_bytes &&
        !shm::InPlaceLayout(static_cast<Collective>(d.collective), s, r, unit, group_rank)) {
      return Invalid("recv.offset_bytes", shm::kNotInPlaceMessage);
    }
  }
  if ((d.flags & shm::kFlagWaitEvent) != 0) {
    auto e = registry.FindEvent(session_id, d.event_id, device);
    if (!e.ok()) return e.status();
    out.wait_event = *e;
  } else if (d.event_id != 0) {
    return Invalid("event_id", "set without kFlagWaitEvent");
  }
  return out;
}

}  // namespace hsdp
