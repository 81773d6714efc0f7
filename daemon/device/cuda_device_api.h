// CudaDeviceApi: DeviceApi on real GPUs (built only with HSDP_WITH_CUDA).
// Runtime API for streams, events, legacy IPC and copies; driver API (VMM:
// cuMemCreate / export to a POSIX fd / import / map, cuMemGetAddressRange)
// through cudaGetDriverEntryPointByVersion, so nothing links libcuda and a
// machine without a driver or a GPU simply reports DeviceCount() == 0 (with
// the reason in unavailable_reason()).
//
// Handles: a StreamHandle / EventHandle is the cudaStream_t / cudaEvent_t
// value; the device each was created on is remembered so every call sets
// the right device first (calls may come from any thread).
//
// Thread-safety: all methods are thread-safe (bookkeeping under mu_; CUDA
// calls are made outside it).
#ifndef HSDP_DAEMON_DEVICE_CUDA_DEVICE_API_H_
#define HSDP_DAEMON_DEVICE_CUDA_DEVICE_API_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "daemon/device/device_api.h"

namespace hsdp::device {

class CudaDeviceApi : public DeviceApi {
 public:
  // Never fails: without a usable driver or device, DeviceCount() is 0.
  static std::unique_ptr<CudaDeviceApi> Create();
  ~CudaDeviceApi() override;

  std::string name() const override { return "cuda"; }
  int DeviceCount() const override { return device_count_; }
  absl::StatusOr<DeviceUuid> UuidOf(int device) const override;  // cuDeviceGetUuid
  // Why DeviceCount() is 0 ("" when devices were found).
  const std::string& unavailable_reason() const { return unavailable_; }

  absl::StatusOr<DevicePtr> Allocate(int device, uint64_t bytes,
                                     AllocSharing sharing = AllocSharing::kPrivate) override;
  absl::Status Free(DevicePtr base) override;
  absl::StatusOr<AddressRange> GetAddressRange(DevicePtr ptr) override;
  absl::StatusOr<IpcHandleBytes> ExportLegacy(DevicePtr base) override;
  absl::StatusOr<UniqueFd> ExportFd(DevicePtr base) override;
  absl::StatusOr<Mapping> ImportLegacy(int device, const IpcHandleBytes& handle) override;
  absl::StatusOr<Mapping> ImportFd(int device, int fd, uint64_t bytes) override;
  absl::Status Unmap(const Mapping& mapping) override;

  absl::StatusOr<StreamHandle> CreateStream(int device, StreamPriority priority) override;
  void DestroyStream(StreamHandle stream) override;

  absl::StatusOr<EventHandle> CreateEvent(int device, bool interprocess) override;
  void DestroyEvent(EventHandle event) override;
  absl::StatusOr<IpcHandleBytes> ExportEvent(EventHandle event) override;
  absl::StatusOr<EventHandle> ImportEvent(int device, const IpcHandleBytes& handle) override;
  absl::Status RecordEvent(EventHandle event, StreamHandle stream) override;
  absl::Status StreamWaitEvent(StreamHandle stream, EventHandle event) override;
  absl::StatusOr<bool> EventDone(EventHandle event) override;

  absl::Status MemcpyAsync(DevicePtr dst, DevicePtr src, uint64_t bytes,
                           StreamHandle stream) override;
  absl::Status ScaleCastAsync(DevicePtr src, DataType from, DevicePtr dst, DataType to,
                              uint64_t count, double scale, StreamHandle stream) override;
  absl::Status ReduceAsync(const std::vector<DevicePtr>& srcs, DataType from, DevicePtr dst,
                           DataType to, uint64_t count, ReduceOp op, double scale,
                           bool accumulate, StreamHandle stream) override;
  absl::Status ReduceToManyAsync(const std::vector<DevicePtr>& srcs, DataType from,
                                 const std::vector<DevicePtr>& dsts, DataType to, uint64_t count,
                                 ReduceOp op, double in_scale, double out_scale,
                                 StreamHandle stream) override;
  absl::Status CopyToDevice(DevicePtr dst, const void* src, uint64_t bytes) override;
  absl::Status CopyToHost(void* dst, DevicePtr src, uint64_t bytes) override;

  struct Driver;  // driver entry points (cuda_device_api.cc)

 private:
  CudaDeviceApi() = default;
  absl::Status SetDevice(int device) const;
  absl::StatusOr<int> StreamDevice(StreamHandle s) const;
  absl::StatusOr<int> EventDevice(EventHandle e) const;
  // Maps a VMM handle of `bytes` on `device`; returns the address.
  absl::StatusOr<DevicePtr> MapVmm(int device, uint64_t handle, uint64_t bytes);

  struct Vmm {
    int device;
    uint64_t bytes;   // mapped size (granularity-aligned)
    uint64_t handle;  // CUmemGenericAllocationHandle
    bool legacy;      // an IPC-opened mapping (cudaIpcCloseMemHandle)
    DevicePtr ptr = 0;  // the mapped address
  };

  int device_count_ = 0;
  std::string unavailable_;
  std::unique_ptr<Driver> drv_;
  mutable std::mutex mu_;
  std::map<DevicePtr, Vmm> allocations_;     // ours; guarded by mu_
  // By token, one per Import* call. Not by address: opening a legacy handle
  // that is already open returns the same pointer and counts a reference in
  // the driver (cuIpcOpenMemHandle), so each open needs its own entry and
  // its own close.
  std::map<uint64_t, Vmm> mappings_;         // guarded by mu_
  uint64_t next_token_ = 1;                  // guarded by mu_
  std::map<StreamHandle, int> streams_;      // guarded by mu_
  std::map<EventHandle, int> events_;        // guarded by mu_
};

}  // namespace hsdp::device

#endif  // HSDP_DAEMON_DEVICE_CUDA_DEVICE_API_H_
