// The narrow device interface: every CUDA driver/runtime call the daemon
// makes goes through DeviceApi (memory, handle export/import, mapping,
// streams, events, copies and the few element-wise kernels the NCCL engine
// needs). Two implementations: FakeDeviceApi (fake_device_api.h: a "device"
// is a host arena, streams are threads) for CI, and CudaDeviceApi
// (cuda_device_api.h, built when the toolkit is found) for real GPUs.
//
// Handles (streams, events) are opaque 64-bit values owned by the
// implementation; 0 is never a valid handle. Device pointers are addresses
// in the calling process's device address space, carried as uint64_t so no
// CUDA type leaks out. IPC handles (legacy memory and event handles) are 64
// plain bytes, as they travel in the protocol.
//
// Thread-safety: every method of every implementation is thread-safe.
// Asynchronous calls (…Async, RecordEvent, StreamWaitEvent) only enqueue on
// the stream; errors of the enqueued work surface through EventDone.
#ifndef HSDP_DAEMON_DEVICE_DEVICE_API_H_
#define HSDP_DAEMON_DEVICE_DEVICE_API_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hsdp/common/unique_fd.h"
#include "hsdp/types.h"

namespace hsdp::device {

using DevicePtr = uint64_t;
using StreamHandle = uint64_t;
using EventHandle = uint64_t;

inline constexpr size_t kIpcHandleBytes = 64;
using IpcHandleBytes = std::array<uint8_t, kIpcHandleBytes>;
// A GPU's UUID (cuDeviceGetUuid): names one GPU in every process, whatever
// CUDA_VISIBLE_DEVICES or CUDA_DEVICE_ORDER make its ordinal there.
inline constexpr size_t kDeviceUuidBytes = 16;
using DeviceUuid = std::array<uint8_t, kDeviceUuidBytes>;

// How a client shares an allocation with the daemon.
enum class HandleKind : uint8_t {
  kInvalid = 0,
  kVmmFd = 1,      // cuMem allocation exported as a POSIX fd (SCM_RIGHTS)
  kLegacyIpc = 2,  // cudaIpcGetMemHandle of the allocation base (+ offset)
};

// Whether an allocation can be exported (cuMem requestedHandleTypes).
enum class AllocSharing : uint8_t {
  kPrivate = 0,  // never exported (engine scratch)
  kPosixFd = 1,  // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR (the device pool)
};

enum class StreamPriority : uint8_t { kDefault = 0, kHigh = 1 };

// An allocation as cuMemGetAddressRange reports it.
struct AddressRange {
  DevicePtr base = 0;
  uint64_t bytes = 0;
};

// An imported (mapped) allocation in this process. `token` identifies the
// mapping to Unmap (the implementation's bookkeeping).
struct Mapping {
  DevicePtr ptr = 0;
  uint64_t bytes = 0;
  int device = -1;
  uint64_t token = 0;
};

class DeviceApi {
 public:
  virtual ~DeviceApi() = default;
  virtual std::string name() const = 0;
  // Devices visible to this process (0 when none; never an error).
  virtual int DeviceCount() const = 0;
  // The UUID of ordinal `device` in this process (INVALID_ARGUMENT when out
  // of range).
  virtual absl::StatusOr<DeviceUuid> UuidOf(int device) const = 0;

  // --- memory ---
  // An allocation on `device` (VMM). Only kPosixFd asks for a shareable
  // handle type (ExportFd works on it and on nothing else); device memory
  // nobody exports (scratch) must not ask for one: a device or container
  // without POSIX-fd handle support would refuse the allocation for nothing.
  // INVALID_ARGUMENT for a bad device or 0 bytes, RESOURCE_EXHAUSTED when it
  // does not fit, FAILED_PRECONDITION when kPosixFd is not supported.
  virtual absl::StatusOr<DevicePtr> Allocate(int device, uint64_t bytes,
                                             AllocSharing sharing = AllocSharing::kPrivate) = 0;
  // NOT_FOUND when `base` is not an allocation of this API.
  virtual absl::Status Free(DevicePtr base) = 0;
  // The allocation containing `ptr` (cuMemGetAddressRange).
  virtual absl::StatusOr<AddressRange> GetAddressRange(DevicePtr ptr) = 0;
  // Export the allocation at `base` (which must be a base address).
  virtual absl::StatusOr<IpcHandleBytes> ExportLegacy(DevicePtr base) = 0;
  virtual absl::StatusOr<UniqueFd> ExportFd(DevicePtr base) = 0;
  // Map a peer's allocation into this process on `device`. The fd is only
  // read (the caller keeps ownership). `bytes` is the size the peer claims;
  // INVALID_ARGUMENT when it exceeds the allocation.
  virtual absl::StatusOr<Mapping> ImportLegacy(int device, const IpcHandleBytes& handle) = 0;
  virtual absl::StatusOr<Mapping> ImportFd(int device, int fd, uint64_t bytes) = 0;
  // Releases a mapping made by Import*. NOT_FOUND for an unknown token.
  virtual absl::Status Unmap(const Mapping& mapping) = 0;

  // --- streams ---
  virtual absl::StatusOr<StreamHandle> CreateStream(int device, StreamPriority priority) = 0;
  // Releases the stream without waiting for its work: pending work still runs,
  // a wait that can never be satisfied is abandoned. Unknown handles are ignored.
  virtual void DestroyStream(StreamHandle stream) = 0;

  // --- events ---
  // `interprocess`: exportable (cudaEventInterprocess | cudaEventDisableTiming).
  virtual absl::StatusOr<EventHandle> CreateEvent(int device, bool interprocess) = 0;
  virtual void DestroyEvent(EventHandle event) = 0;
  virtual absl::StatusOr<IpcHandleBytes> ExportEvent(EventHandle event) = 0;
  // Opens a peer's interprocess event (release with DestroyEvent).
  virtual absl::StatusOr<EventHandle> ImportEvent(int device, const IpcHandleBytes& handle) = 0;
  virtual absl::Status RecordEvent(EventHandle event, StreamHandle stream) = 0;
  // Work enqueued on `stream` after this call starts only after the work
  // captured by the event's latest record has finished.
  virtual absl::Status StreamWaitEvent(StreamHandle stream, EventHandle event) = 0;
  // True when the work captured by the latest record is done (or the event
  // was never recorded); an error when that work failed.
  virtual absl::StatusOr<bool> EventDone(EventHandle event) = 0;

  // --- copies and element-wise kernels (stream-ordered) ---
  virtual absl::Status MemcpyAsync(DevicePtr dst, DevicePtr src, uint64_t bytes,
                                   StreamHandle stream) = 0;
  // dst[i] = (to) ((from) src[i] * scale), float types only (scale 1: a plain
  // cast). One fused pass; `src` and `dst` may be the same pointer when the
  // types have the same size.
  virtual absl::Status ScaleCastAsync(DevicePtr src, DataType from, DevicePtr dst, DataType to,
                                      uint64_t count, double scale, StreamHandle stream) = 0;
  // The intra-device reduction (several members of a collective on one
  // GPU): dst[i] = (to) op(acc, op_k ((from) srcs[k][i] * scale)), where
  // acc is dst[i] itself when `accumulate`, else nothing. op: kSum, kMin,
  // kMax or kProduct. Float types compute in float (double with float64);
  // integer types need from == to and scale 1 and wrap as the CPU kernels do.
  // `dst` may be one of `srcs` (exactly, never partially). One pass over the
  // inputs (implementations may split many inputs into a few launches).
  virtual absl::Status ReduceAsync(const std::vector<DevicePtr>& srcs, DataType from,
                                   DevicePtr dst, DataType to, uint64_t count, ReduceOp op,
                                   double scale, bool accumulate, StreamHandle stream) = 0;
  // The reduction written where the members want it: every dsts[j][i] =
  // (to) (op_k ((from) srcs[k][i] * in_scale) * out_scale). Each of `dsts`
  // may be one of `srcs` (exactly, never partially), so an in-place
  // all-reduce of members sharing a GPU reads n buffers and writes n: no
  // scratch, no copies. The default is ReduceAsync into dsts[0], an in-place
  // scale and copies; CudaDeviceApi runs one fused kernel.
  virtual absl::Status ReduceToManyAsync(const std::vector<DevicePtr>& srcs, DataType from,
                                         const std::vector<DevicePtr>& dsts, DataType to,
                                         uint64_t count, ReduceOp op, double in_scale,
                                         double out_scale, StreamHandle stream);
  // Synchronous copies between host and device memory (tests, tools).
  virtual absl::Status CopyToDevice(DevicePtr dst, const void* src, uint64_t bytes) = 0;
  virtual absl::Status CopyToHost(void* dst, DevicePtr src, uint64_t bytes) = 0;
};

// An implementation that reduces at most kMaxReduceInputs inputs per pass
// folds later passes into dst; when dst is one of the inputs, that input must
// be read in the first pass, before dst is first written. Returns `srcs` with
// the input equal to `dst` (if any) moved to the front (the ops commute).
std::vector<DevicePtr> InputsDstFirst(std::vector<DevicePtr> srcs, DevicePtr dst);

// The reduce kernels' argument rule, shared by every implementation of
// ReduceAsync and ReduceToManyAsync: at least one input, a combining op (sum,
// min, max, product), and float types wherever a cast or a scale is asked for.
absl::Status CheckReduceArgs(size_t inputs, ReduceOp op, DataType from, DataType to, bool scaled);

// ReduceToManyAsync's argument rule, shared by its implementations.
absl::Status CheckReduceToMany(const std::vector<DevicePtr>& srcs, DataType from,
                               const std::vector<DevicePtr>& dsts, DataType to);

// Names for logs and errors: "vmm_fd", "legacy_ipc", "invalid".
const char* HandleKindName(HandleKind kind);

// "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi -L prints it.
std::string UuidName(const DeviceUuid& uuid);

// The daemon's ordinal for what a client sent: `uuid` (16 bytes) when not
// empty — the ordinal of the GPU with that UUID, INVALID_ARGUMENT naming it
// when this process sees no such GPU —, else `device` as it is (a client
// that predates UUIDs; checked by the caller like any ordinal).
absl::StatusOr<int> ResolveDevice(const DeviceApi& api, int device, const std::string& uuid);

}  // namespace hsdp::device

#endif  // HSDP_DAEMON_DEVICE_DEVICE_API_H_
