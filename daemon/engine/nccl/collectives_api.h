// The collective interface the NCCL engine drives: communicators created from
// a unique id (several local ranks at once), group start/end, the collectives
// and point-to-point calls, PreMulSum reduction ops, and the non-blocking
// error model (AsyncState / Abort). Two implementations: FakeCollectives
// (fake_collectives.h: runs the collectives in host memory over a
// FakeDeviceApi, across all communicators of a clique) and NcclCollectives
// (nccl_collectives.h: libnccl, built when the toolkit is found).
//
// Semantics follow NCCL: a call only enqueues work on `stream`; several
// ranks driven by one thread must be issued between GroupStart and GroupEnd
// (the fake refuses otherwise, because real NCCL would deadlock); group
// calls nest. Communicators are non-blocking: after InitRanks, GroupEnd or a
// failure, AsyncState says whether the communicator is ready, still in
// progress, or failed; Release(abort) ends everything they have in flight
// (the work completes with an error, never hangs).
//
// Thread-safety: calls on different communicators may come from different
// threads; one group (GroupStart..GroupEnd) belongs to the thread that
// opened it. The engine issues every call from its launcher thread.
#ifndef HSDP_DAEMON_ENGINE_NCCL_COLLECTIVES_API_H_
#define HSDP_DAEMON_ENGINE_NCCL_COLLECTIVES_API_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "daemon/device/device_api.h"
#include "hsdp/types.h"

namespace hsdp::nccl {

using device::DevicePtr;
using device::StreamHandle;
using CommHandle = uint64_t;  // 0 is never valid

inline constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct UniqueId {
  std::array<uint8_t, kUniqueIdBytes> bytes{};
};

// A reduction as NCCL sees it: a built-in op, or a PreMulSum op created for
// one communicator (release with DestroyRedOp).
struct RedOp {
  ReduceOp op = ReduceOp::kSum;  // kSum, kAvg, kMin, kMax, kProduct or kPremulSum
  int64_t custom = -1;           // kPremulSum: the op CreatePreMulSum returned
};

enum class AsyncState { kReady, kInProgress, kFailed };

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual std::string name() const = 0;
  // Whether ShrinkRanks can be used (ncclCommShrink, NCCL >= 2.27).
  virtual bool SupportsShrink() const = 0;

  virtual absl::StatusOr<UniqueId> NewUniqueId() = 0;
  // Creates ranks `ranks[i]` (on device `devices[i]`) of an `nranks`-rank
  // communicator named by `id`, all hosted by this process, in one group
  // call. Non-blocking: poll AsyncState until kReady. INVALID_ARGUMENT for
  // a bad rank, device, or two ranks on one device.
  virtual absl::StatusOr<std::vector<CommHandle>> InitRanks(const UniqueId& id, int nranks,
                                                            const std::vector<int>& ranks,
                                                            const std::vector<int>& devices) = 0;
  // The communicators of the survivors of `comms` (one clique) without the
  // ranks in `exclude` (old numbering); ranks are renumbered densely.
  // UNIMPLEMENTED when !SupportsShrink().
  virtual absl::StatusOr<std::vector<CommHandle>> ShrinkRanks(
      const std::vector<CommHandle>& comms, const std::vector<int>& exclude) = 0;

  virtual absl::Status GroupStart() = 0;
  virtual absl::Status GroupEnd() = 0;

  // Counts are in elements of `dtype`, as in NCCL (all-gather: elements each
  // rank sends; reduce-scatter: elements each rank receives).
  virtual absl::Status AllReduce(DevicePtr send, DevicePtr recv, uint64_t count, DataType dtype,
                                 RedOp op, CommHandle comm, StreamHandle stream) = 0;
  virtual absl::Status AllGather(DevicePtr send, DevicePtr recv, uint64_t send_count,
                                 DataType dtype, CommHandle comm, StreamHandle stream) = 0;
  virtual absl::Status ReduceScatter(DevicePtr send, DevicePtr recv, uint64_t recv_count,
                                     DataType dtype, RedOp op, CommHandle comm,
                                     StreamHandle stream) = 0;
  virtual absl::Status Broadcast(DevicePtr send, DevicePtr recv, uint64_t count, DataType dtype,
                                 int root, CommHandle comm, StreamHandle stream) = 0;
  virtual absl::Status Send(DevicePtr buf, uint64_t count, DataType dtype, int peer,
                            CommHandle comm, StreamHandle stream) = 0;
  virtual absl::Status Recv(DevicePtr buf, uint64_t count, DataType dtype, int peer,
                            CommHandle comm, StreamHandle stream) = 0;

  // ncclRedOpCreatePreMulSum with a host scalar of `dtype` (float types).
  virtual absl::StatusOr<RedOp> CreatePreMulSum(double scalar, DataType dtype,
                                                CommHandle comm) = 0;
  virtual void DestroyRedOp(RedOp op, CommHandle comm) = 0;

  // ncclCommGetAsyncError: kReady, kInProgress, or kFailed with `error` set.
  virtual AsyncState Query(CommHandle comm, absl::Status* error) = 0;
  // Ends `comms`, all in one group call: ncclCommAbort (ends everything they
  // have in flight; the work completes with an error), or ncclCommFinalize,
  // a bounded wait until they are quiescent, and ncclCommDestroy (one that
  // does not get there in time is aborted). One call for all of them because
  // NCCL needs it when one thread drives several ranks of a clique: finalize
  // waits until the communicator is globally quiescent, and recent NCCL
  // synchronises a clique's local ranks in abort too, so ending them one at a
  // time from one thread hangs (NVIDIA/nccl#1013, #863). The handles are
  // invalid afterwards, even on error.
  virtual absl::Status Release(const std::vector<CommHandle>& comms, bool abort) = 0;
};

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_COLLECTIVES_API_H_
