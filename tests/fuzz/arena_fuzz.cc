// A member's view of a hostile small-operation arena (client/src/arena.h):
// the fuzzer plays the other members of the group, who may write anything
// anywhere in the shared arena at any moment (geometry words, lanes, keys,
// the broken word and its reason), and the daemon (which breaks it). This
// member submits valid operations (as the client library would, its own
// arguments checked) and polls, waits and drains them.
//
// Checks besides "no crash, no sanitizer report": this member's input and
// output buffers sit between inaccessible guard pages, so a read or write
// outside them faults; whatever the others write, every operation ends
// (done) once drained, and the daemon's metric read stays in bounds.
//
// Input: byte 0 picks the geometry (members 1..4 from bits 0-1, slots 1..8
// from bits 2-3), then records (fuzz_input.h):
//   0 write   [offset u32][bytes...]       the others write at arena offset % size
//   1 submit  [collective u8][dtype u8][count u16][root u8][reduce_op u8][wire u8]
//   2 lanes   [member u8][arrived u64][consumed u64]   another member's lane
//   3 poll    the oldest submitted operation
//   4 wait    [micros u8] the newest operation, that long
//   5 break   [code u8]    the daemon marks the arena broken
//   6 drain
//   7 metric  the daemon reads the operations completed
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "arena.h"
#include "daemon/dataplane/small_op_arena.h"
#include "fuzz_input.h"
#include "hsdp/types.h"

namespace {

using hsdp::Collective;
using hsdp::DataType;
using hsdp::fuzz::Fields;
using hsdp::fuzz::Record;
using hsdp::fuzz::Script;

constexpr uint64_t kSlotBytes = 256;
constexpr size_t kPage = 4096;
constexpr size_t kIoBytes = 4 * kPage;  // >= kSlotBytes * kArenaMaxMembers output

// `bytes` of read-write memory with an inaccessible page on each side.
class Guarded {
 public:
  explicit Guarded(size_t bytes) : bytes_(bytes) {
    void* m = ::mmap(nullptr, bytes + 2 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) std::abort();
    base_ = static_cast<unsigned char*>(m);
    if (::mprotect(base_ + kPage, bytes, PROT_READ | PROT_WRITE) != 0) std::abort();
  }
  ~Guarded() { ::munmap(base_, bytes_ + 2 * kPage); }
  unsigned char* data() const { return base_ + kPage; }

 private:
  size_t bytes_;
  unsigned char* base_;
};

const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                           DataType::kBFloat16, DataType::kInt32, DataType::kInt64,
                           DataType::kUInt8};
const Collective kKinds[] = {Collective::kAllReduce, Collective::kAllGather,
                             Collective::kReduceScatter, Collective::kBroadcast,
                             Collective::kBarrier};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint32_t members = 1 + (data[0] & 3);
  const uint32_t slots = 1u << ((data[0] >> 2) & 3);
  auto budget = hsdp::NewArenaBudget(64 << 20, 100);
  auto daemon_side = hsdp::SmallOpArena::Create(members, slots, kSlotBytes, 1, budget, 0);
  if (!daemon_side.ok()) std::abort();
  const uint64_t bytes = (*daemon_side)->bytes();
  // The other members' mapping of the same memfd.
  void* theirs_map = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                            (*daemon_side)->fd(), 0);
  if (theirs_map == MAP_FAILED) std::abort();
  auto* theirs = static_cast<unsigned char*>(theirs_map);
  std::vector<int> ranks(members);
  for (uint32_t m = 0; m < members; ++m) ranks[m] = static_cast<int>(m);
  auto mine = hsdp::internal::GroupArena::Map(hsdp::UniqueFd(::dup((*daemon_side)->fd())), bytes,
                                              ranks, 0, absl::Microseconds(500), 0,
                                              hsdp::shm::kSpinYield, nullptr);
  if (!mine.ok()) std::abort();  // the daemon's own arena must map
  Guarded send(kIoBytes), recv(kIoBytes);
  std::deque<hsdp::Work> works;
  Script script(data + 1, size - 1);
  Record r;
  int records = 0;
  while (script.Next(&r) && ++records <= 64) {
    Fields f(r.payload);
    switch (r.op % 8) {
      case 0: {
        const uint64_t off = f.Get<uint32_t>() % bytes;
        const std::string_view b = f.Rest();
        if (!b.empty()) std::memcpy(theirs + off, b.data(), std::min<uint64_t>(b.size(), bytes - off));
        break;
      }
      case 1: {
        hsdp::internal::ArenaOp op;
        op.collective = kKinds[f.Get<uint8_t>() % std::size(kKinds)];
        op.dtype = kTypes[f.Get<uint8_t>() % std::size(kTypes)];
        op.count = f.Get<uint16_t>();
        op.root = static_cast<int>(f.Get<uint8_t>() % members);
        op.reduce.op = static_cast<hsdp::ReduceOp>(1 + f.Get<uint8_t>() % 6);
        if (op.reduce.op == hsdp::ReduceOp::kPremulSum && !hsdp::IsFloatingPoint(op.dtype)) {
          op.reduce.op = hsdp::ReduceOp::kSum;
        }
        if (f.Get<uint8_t>() & 1) op.reduce.reduce_dtype = DataType::kBFloat16;
        if (op.collective == Collective::kBarrier) op.count = 0;
        // Only what the client library would hand the arena: it fits the
        // buffers and the arena takes it.
        const uint64_t unit = op.count * hsdp::DataTypeSize(op.dtype);
        const uint64_t in = op.collective == Collective::kReduceScatter ? unit * members : unit;
        const uint64_t out = op.collective == Collective::kAllGather ? unit * members : unit;
        if (in > kIoBytes || out > kIoBytes) break;
        if (!(*mine)->Takes(op.collective, op.count, op.dtype)) break;
        op.send = send.data();
        op.recv = recv.data();
        auto w = (*mine)->Submit(op);
        if (w.ok()) works.push_back(*std::move(w));
        if (works.size() > 16) works.pop_front();
        break;
      }
      case 2: {
        const uint32_t m = f.Get<uint8_t>() % members;
        auto* lanes = reinterpret_cast<hsdp::shm::ArenaLane*>(
            theirs + hsdp::shm::ComputeArenaLayout(members, slots, kSlotBytes).lanes_offset);
        lanes[m].arrived.store(f.Get<uint64_t>());
        lanes[m].consumed.store(f.Get<uint64_t>());
        break;
      }
      case 3:
        if (!works.empty()) (void)works.front().Test();
        break;
      case 4:
        if (!works.empty()) (void)works.back().Wait(absl::Microseconds(f.Get<uint8_t>()));
        break;
      case 5:
        (*daemon_side)->MarkBroken(absl::Status(static_cast<absl::StatusCode>(f.Get<uint8_t>() % 17),
                                                "broken by the fuzzer"));
        break;
      case 6:
        (void)(*mine)->Drain();
        break;
      case 7:
        (void)(*daemon_side)->OpsCompleted();
        break;
    }
  }
  (void)(*mine)->Drain();
  for (hsdp::Work& w : works) {
    HSDP_FUZZ_CHECK(w.Test(), "an operation of a drained arena is not done");
  }
  (*mine)->Close(absl::CancelledError("fuzz input done"));
  works.clear();
  ::munmap(theirs_map, bytes);
  return 0;
}
