// Fuzz target: one operation descriptor as a client writes it into its ring,
// through the rules the daemon applies (shm::CheckDescriptorFields via
// ValidateFields, then ResolveBuffers against a session's real buffers).
//
// Input: [features: u8][group_rank: u8][group_size: u8][OpDescriptor: 192
// bytes][bytes written at the start of buffer 3, where an all-to-all's
// split counts are read]. Missing bytes are zero.
//
// Oracles beyond "no crash, no sanitizer report":
// - an accepted descriptor names a known collective, dtype (except barrier),
//   count <= 2^40 and only known flags;
// - a resolved operation's send and recv ranges lie inside the buffers the
//   session registered, and overlap only in the collective's in-place layout.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "daemon/dataplane/validate.h"
#include "daemon/session/mapped_buffer.h"
#include "daemon/session/session.h"
#include "daemon/session/shm_channel.h"
#include "fuzz_input.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp::fuzz {
namespace {

constexpr uint64_t kSizes[] = {4096, 64, 65536};  // buffers 1, 2, 3

struct Fixture {
  std::shared_ptr<Session> session;
  std::shared_ptr<MappedBuffer> bufs[3];

  Fixture() {
    auto ch = ShmChannel::Create(1, 16);
    if (!ch.ok()) Fail("cannot create a channel: " + ch.status().ToString());
    SessionInfo info;
    info.job_id = "fuzz";
    info.device = "cpu";
    info.features = shm::kFeaturesImplemented;
    session = std::make_shared<Session>(1, info, SessionToken{}, std::move(*ch));
    for (int i = 0; i < 3; ++i) {
      // Sealed, as the client library makes them (MappedBuffer insists).
      UniqueFd fd(::memfd_create("fuzz-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING));
      if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(kSizes[i])) != 0) {
        Fail("cannot create a memfd");
      }
      ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
      auto b = MappedBuffer::Map(std::move(fd), kSizes[i], "fuzz");
      if (!b.ok()) Fail("cannot map a buffer: " + b.status().ToString());
      bufs[i] = *b;
      if (session->AddBuffer(*b) != static_cast<uint64_t>(i + 1)) Fail("unexpected buffer id");
    }
  }

  // Whether [p, p + bytes) lies inside one registered buffer.
  bool Inside(const void* p, uint64_t bytes) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    for (const auto& b : bufs) {
      const auto lo = reinterpret_cast<uintptr_t>(b->data());
      if (a >= lo && a <= lo + b->size() && bytes <= lo + b->size() - a) return true;
    }
    return false;
  }
};

}  // namespace
}  // namespace hsdp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hsdp;
  using namespace hsdp::fuzz;
  static Fixture* fx = new Fixture();
  Fields f(std::string_view(reinterpret_cast<const char*>(data), size));
  const uint64_t features = f.Get<uint8_t>() & (shm::kFeaturesImplemented | shm::kFeatureDeviceMemory);
  const int group_rank = f.Get<uint8_t>();
  const int group_size = f.Get<uint8_t>() + 1;
  shm::OpDescriptor d = f.Get<shm::OpDescriptor>();
  const std::string_view splits = f.Rest();
  std::memset(fx->bufs[2]->data(), 0, 4096);
  if (!splits.empty()) std::memcpy(fx->bufs[2]->data(), splits.data(), std::min<size_t>(splits.size(), 4096));

  const absl::Status fields = ValidateFields(d, features);
  if (!fields.ok()) {
    HSDP_FUZZ_CHECK(fields.code() == absl::StatusCode::kInvalidArgument, fields.ToString());
    return 0;
  }
  const auto c = static_cast<Collective>(d.collective);
  HSDP_FUZZ_CHECK(d.collective >= 1 && d.collective <= kMaxCollective, "collective accepted");
  HSDP_FUZZ_CHECK((d.flags & ~shm::kKnownFlags) == 0, "unknown flags accepted");
  if (c == Collective::kBarrier) return 0;
  HSDP_FUZZ_CHECK(d.dtype >= 1 && d.dtype <= kMaxDataType, "dtype accepted");
  HSDP_FUZZ_CHECK(d.count <= shm::kMaxCount, "count accepted");
  if (group_rank >= group_size) return 0;  // the group gives the member a rank below its size

  Arrival a;
  const absl::Status resolved = ResolveBuffers(d, group_rank, group_size, *fx->session, nullptr, &a);
  if (!resolved.ok()) {
    HSDP_FUZZ_CHECK(resolved.code() == absl::StatusCode::kInvalidArgument, resolved.ToString());
    return 0;
  }
  const uint64_t es = DataTypeSize(static_cast<DataType>(d.dtype));
  shm::OpExtents ext = shm::ComputeOpExtents(c, d.count, es, group_size);
  if (a.splits_send_bytes != 0 || a.splits_recv_bytes != 0 || !a.send_counts.empty()) {
    ext = {a.splits_send_bytes, a.splits_recv_bytes};
  }
  if (ext.send_bytes > 0) {
    HSDP_FUZZ_CHECK(a.send != nullptr && fx->Inside(a.send, ext.send_bytes),
                    "send range outside the session's buffers");
  }
  if (ext.recv_bytes > 0) {
    HSDP_FUZZ_CHECK(a.recv != nullptr && fx->Inside(a.recv, ext.recv_bytes),
                    "recv range outside the session's buffers");
  }
  if (ext.send_bytes > 0 && ext.recv_bytes > 0) {
    const auto s = reinterpret_cast<uintptr_t>(a.send), r = reinterpret_cast<uintptr_t>(a.recv);
    if (s < r + ext.recv_bytes && r < s + ext.send_bytes) {
      HSDP_FUZZ_CHECK(shm::InPlaceLayout(c, s, r, d.count * es, group_rank),
                      "overlapping send and recv accepted outside the in-place layout");
    }
  }
  return 0;
}
