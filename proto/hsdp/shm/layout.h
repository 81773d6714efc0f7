// The shared-memory data-plane ABI between a trainer and hsdpd.
//
// One channel per session: a memfd created by the daemon and mapped by both
// sides. It holds a versioned header, a single-producer (client) /
// single-consumer (daemon) ring of fixed-size operation descriptors, and one
// completion record per ring slot. Nothing in a channel is shared with any
// other session: a client that scribbles over its channel can only hurt its
// own session. The client wakes a sleeping daemon by writing to the kick
// eventfd it received with the channel (see data_conn.h), only when the
// daemon has published `daemon_sleeping` in this channel.
//
// Every struct is standard-layout and fixed-size; its size is recorded in the
// header and checked by both sides, so a daemon and trainers built at different
// times refuse each other with a clear message instead of misreading memory.
// Everything the daemon reads from here is untrusted input.
//
// Evolving the ABI: reserved fields and unknown flag bits must be zero (the
// daemon rejects the operation otherwise), so a later version can give them
// meaning behind a feature bit negotiated at Attach (Feature below) without
// bumping kLayoutVersion.
#ifndef HSDP_SHM_LAYOUT_H_
#define HSDP_SHM_LAYOUT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hsdp/types.h"

namespace hsdp::shm {

inline constexpr uint64_t kChannelMagic = 0x324E484350445348ull;  // "HSDPCHN2"
// Version 2: per-session wake-up (no node page), epochs, feature bits,
// 192-byte descriptors with checked reserved fields.
inline constexpr uint32_t kLayoutVersion = 2;

// Capabilities negotiated at Attach: the client offers its set, the daemon
// answers with the intersection; a descriptor may only use what was agreed.
enum Feature : uint64_t {
  kFeatureEpochs = 1ull << 0,        // descriptors carry group epochs (baseline of v2)
  kFeatureDeviceMemory = 1ull << 1,  // device buffers and device events (GPU engine)
  kFeaturePointToPoint = 1ull << 2,  // peer / tag / splits fields (send, recv, all-to-all)
  kFeatureOpPriority = 1ull << 3,    // kFlagLatencyCritical (a daemon without it never sees it)
  // Groups' small-operation arenas (arena.h) at NewGroup, of kArenaVersion
  // 2 (the settle word). Bit 4 offered them at version 1, where members could
  // disagree on an operation's outcome: retired, never granted, so a client
  // library from before arena version 2 (say, still running in a job while
  // its node's package is upgraded under it) gets no arena and its groups
  // run through the daemon instead of failing NewGroup.
  kFeatureSmallOpArena = 1ull << 5,
};
inline constexpr uint64_t kFeatureRetiredArenaV1 = 1ull << 4;
// Features this build implements (client and daemon).
inline constexpr uint64_t kFeaturesImplemented =
    kFeatureEpochs | kFeaturePointToPoint | kFeatureOpPriority | kFeatureSmallOpArena;
// Features a peer must offer to be accepted at all.
inline constexpr uint64_t kFeaturesRequired = kFeatureEpochs;

// A futex-backed event count. `seq` changes on every Ring(); `waiters` counts
// sleepers so that Ring() skips the syscall when nobody sleeps.
struct alignas(64) Doorbell {
  std::atomic<uint32_t> seq;
  std::atomic<uint32_t> waiters;
  uint8_t pad[56];
};
static_assert(sizeof(Doorbell) == 64);
static_assert(std::atomic<uint32_t>::is_always_lock_free);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Buffer ids with this bit name device buffers (RegisterDeviceBuffer), the
// others host buffers (RegisterBuffer).
inline constexpr uint64_t kDeviceBufferIdBit = 1ull << 62;
constexpr bool IsDeviceBufferId(uint64_t id) { return (id & kDeviceBufferIdBit) != 0; }

// Names a byte range in a registered buffer.
struct BufRef {
  uint64_t buffer_id;
  uint64_t offset_bytes;
};

enum DescriptorFlags : uint32_t {
  kFlagNone = 0,
  // Wait for device event `event_id` before starting (needs kFeatureDeviceMemory).
  kFlagWaitEvent = 1u << 0,
  // Latency-critical (needs kFeatureOpPriority): the engine runs the
  // operation ahead of the job's other queued work (an FSDP all-gather that
  // gates the next layer's compute). A hint within the job: never ahead of
  // another job's fair share or class. Any member setting it marks the op.
  kFlagLatencyCritical = 1u << 1,
};
inline constexpr uint32_t kKnownFlags = kFlagWaitEvent | kFlagLatencyCritical;

// One queued collective. `count` is in elements of `dtype` (0 is allowed: the
// members still match and agree, nothing moves):
//   all-reduce, broadcast: elements per rank (send and recv have `count`);
//   all-gather: elements each rank contributes (recv has count * group size);
//   reduce-scatter: elements each rank receives (send has count * group size);
//   reduce-scatter+all-reduce: as reduce-scatter in the shard group `group_id`,
//   then all-reduce in the replicate group `group2_id` (sequence `seq2`);
//   send / recv: elements sent / received (the same on both sides); they use
//   no sequence number (seq 0): they match in posting order instead;
//   all-to-all: elements sent to each rank (send and recv have count * group
//   size), unless `splits` names per-rank counts.
// In-place when send and recv name the same range. barrier ignores buffers.
// (epoch, seq) identify the operation in its group: sequence numbers restart
// at 1 in every epoch (a group enters a new epoch when it is re-formed after
// a failure; NewGroup tells the member which epoch to use).
struct OpDescriptor {
  uint64_t op_id;  // session-wide, 1, 2, 3, ... in ring order
  uint64_t seq;    // per-group, per-epoch sequence number, 1, 2, 3, ...
  uint64_t seq2;   // sequence number in group2 (composite ops only)
  uint64_t count;
  BufRef send;
  BufRef recv;
  double premul_factor;
  double pre_divide;
  double post_divide;
  uint32_t group_id;
  uint32_t group2_id;
  int32_t root;          // broadcast: rank in the group
  uint8_t collective;    // hsdp::Collective
  uint8_t dtype;         // hsdp::DataType
  uint8_t reduce_op;     // hsdp::ReduceOp
  uint8_t reduce_dtype;  // hsdp::DataType, 0 = same as dtype
  uint32_t flags;        // DescriptorFlags; unknown bits are rejected
  uint32_t epoch;        // epoch of group_id
  uint32_t epoch2;       // epoch of group2_id (composite ops only)
  // kFeaturePointToPoint; 0 for every other collective.
  int32_t peer;          // send: destination, recv: source group rank (kAnySource: any)
  int32_t tag;           // send / recv: matched with the peer's tag
  uint32_t reserved0;    // must be 0
  uint64_t event_id;     // kFlagWaitEvent: device event to wait on; else 0
  // All-to-all with uneven blocks: 2 * group size uint64 element counts in
  // a registered buffer — what this rank sends to each rank, then what it
  // receives from each. {0, 0}: equal blocks of `count`.
  BufRef splits;
  uint64_t reserved1[5];  // must be 0
};
static_assert(sizeof(OpDescriptor) == 192);
static_assert(std::is_trivially_copyable_v<OpDescriptor>);

// Written by the daemon when op `op_id` ends. `op_id` is stored last with
// release order; a reader that sees its op id with acquire sees the rest.
struct alignas(64) Completion {
  std::atomic<uint64_t> op_id;
  int32_t code;          // absl::StatusCode
  uint32_t message_len;  // bytes of message used
  uint64_t queued_ns;    // time from the first member's arrival to start
  uint64_t exec_ns;      // time the daemon spent executing
  uint64_t event_id;     // device completion event (kFeatureDeviceMemory); else 0
  int32_t peer;          // recv: the group rank the data came from; else -1
  uint32_t reserved;
  char message[208];
};
static_assert(sizeof(Completion) == 256);

// Bytes an operation reads from `send` and writes to `recv` for one member
// of a group of `group_size` (see OpDescriptor for what `count` means).
// Callers bound count (<= 2^40), elem_size (<= 8) and group_size so the
// products cannot overflow.
struct OpExtents {
  uint64_t send_bytes;
  uint64_t recv_bytes;
};
constexpr OpExtents ComputeOpExtents(Collective c, uint64_t count, uint64_t elem_size,
                                     uint64_t group_size) {
  const uint64_t unit = count * elem_size;
  switch (c) {
    case Collective::kAllGather: return {unit, unit * group_size};
    case Collective::kReduceScatter:
    case Collective::kReduceScatterAllReduce: return {unit * group_size, unit};
    case Collective::kBarrier: return {0, 0};
    case Collective::kSend: return {unit, 0};
    case Collective::kRecv: return {0, unit};
    case Collective::kAllToAll: return {unit * group_size, unit * group_size};
    default: return {unit, unit};
  }
}

// Any state but kChannelOpen means the session ended: once the daemon lets
// go of a channel it releases its memory even where the client still maps
// it (the pages read as zeros, state 0).
enum ChannelState : uint32_t {
  kChannelOpen = 1,
  kChannelClosed = 2,  // the daemon ended the session; every op fails
};

struct alignas(64) ChannelHeader {
  // Immutable after creation by the daemon.
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint32_t descriptor_bytes;
  uint32_t completion_bytes;
  uint32_t doorbell_bytes;
  uint32_t ring_entries;  // power of two
  uint64_t session_id;
  uint64_t ring_offset;
  uint64_t completion_offset;
  uint64_t total_bytes;
  uint64_t features;  // negotiated at Attach (Feature bits)
  // Producer index: written by the client only.
  alignas(64) std::atomic<uint64_t> head;
  // Consumer index: written by the daemon only (the daemon never reads it back).
  alignas(64) std::atomic<uint64_t> tail;
  // The daemon rings this after writing completions.
  Doorbell client_bell;
  alignas(64) std::atomic<uint32_t> state;  // ChannelState
  // SpinMode: how the client's spinning waits share a CPU, written by the
  // daemon (data_plane.spin_mode) when it first sees the session. Added in
  // layout 2 without a version change: it sits in padding, and a daemon
  // that never writes it leaves 0, the default (kSpinYield).
  std::atomic<uint32_t> spin_mode;
  // 1 while the daemon's dispatcher may sleep: a client that advanced `head`
  // must then write to its kick eventfd. Written by the daemon only.
  alignas(64) std::atomic<uint32_t> daemon_sleeping;
};

// How a waiter that polls shared memory shares its CPU while it spins
// (shm::SpinOnce). Measured in docs/benchmarks.md §15: on the 2-core VM a
// sched_yield costs ~1.5 us, a hand-off to a running peer ~60 ns.
enum SpinMode : uint32_t {
  // Poll with `pause` for kPollsBeforeYield polls (a peer on another CPU
  // answers within them), then yield the CPU between polls, so that a peer
  // that shares this CPU gets to run. The default, and what 0 (no hint
  // written: a daemon before this field) means.
  kSpinYield = 0,
  // Never yield: poll with `pause` until the spin budget ends. Only for a
  // dedicated CPU per spinner (with more spinners than CPUs, a waiter can
  // hold the CPU its peer needs until the scheduler preempts it: ms).
  kSpinPause = 1,
};
inline constexpr uint32_t kMaxSpinMode = kSpinPause;
inline constexpr uint32_t kPollsBeforeYield = 32;

// Byte layout of a channel with `ring_entries` slots.
struct ChannelLayout {
  uint64_t ring_offset;
  uint64_t completion_offset;
  uint64_t total_bytes;
};
constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
constexpr ChannelLayout ComputeChannelLayout(uint32_t ring_entries) {
  ChannelLayout l{};
  l.ring_offset = AlignUp(sizeof(ChannelHeader), 4096);
  l.completion_offset = AlignUp(l.ring_offset + uint64_t{ring_entries} * sizeof(OpDescriptor), 4096);
  l.total_bytes = AlignUp(l.completion_offset + uint64_t{ring_entries} * sizeof(Completion), 4096);
  return l;
}

inline OpDescriptor* RingSlots(ChannelHeader* h) {
  return reinterpret_cast<OpDescriptor*>(reinterpret_cast<char*>(h) + h->ring_offset);
}
inline Completion* CompletionSlots(ChannelHeader* h) {
  return reinterpret_cast<Completion*>(reinterpret_cast<char*>(h) + h->completion_offset);
}

}  // namespace hsdp::shm

#endif  // HSDP_SHM_LAYOUT_H_
