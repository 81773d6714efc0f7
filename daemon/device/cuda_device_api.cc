#include "daemon/device/cuda_device_api.h"

#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/device/scale_cast.h"
#include "daemon/device/intra_device_reduce.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

namespace hsdp::device {
namespace {

absl::Status CudaError(cudaError_t e, const char* what, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  const absl::StatusCode code = e == cudaErrorMemoryAllocation ? absl::StatusCode::kResourceExhausted
                                : e == cudaErrorInvalidValue ||
                                          e == cudaErrorInvalidDevice ||
                                          e == cudaErrorInvalidResourceHandle
                                    ? absl::StatusCode::kInvalidArgument
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(what, ": ", cudaGetErrorName(e), " (",
                                         cudaGetErrorString(e), ") [", file, ":", line, "]"));
}

// One macro per foreign error source (STYLE.md): CUDA runtime and driver.
#define CUDA_RETURN_IF_ERROR(expr)                                            \
  do {                                                                        \
    cudaError_t hsdp_cuda_rc_ = (expr);                                       \
    if (hsdp_cuda_rc_ != cudaSuccess)                                         \
      return CudaError(hsdp_cuda_rc_, #expr, __FILE__, __LINE__);             \
  } while (0)

#define CU_RETURN_IF_ERROR(expr)                                                          \
  do {                                                                                    \
    CUresult hsdp_cu_rc_ = (expr);                                                        \
    if (hsdp_cu_rc_ != CUDA_SUCCESS)                                                      \
      return absl::InternalError(absl::StrCat(#expr, ": CUresult ",                      \
                                              static_cast<int>(hsdp_cu_rc_), " [", __FILE__, \
                                              ":", __LINE__, "]"));                      \
  } while (0)

template <typename T>
T FromHandle(uint64_t h) {
  return reinterpret_cast<T>(static_cast<uintptr_t>(h));
}
template <typename T>
uint64_t ToHandle(T p) {
  return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p));
}

}  // namespace

struct CudaDeviceApi::Driver {
  decltype(&::cuMemCreate) mem_create = nullptr;
  decltype(&::cuMemRelease) mem_release = nullptr;
  decltype(&::cuMemAddressReserve) address_reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;
  decltype(&::cuMemRetainAllocationHandle) retain_handle = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemGetAddressRange) address_range = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_attribute = nullptr;
  decltype(&::cuDeviceGetUuid) device_uuid = nullptr;

  absl::Status Load() {
    auto get = [](const char* name, void** fn) -> absl::Status {
      cudaDriverEntryPointQueryResult q;
      cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &q);
      if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || *fn == nullptr) {
        (void)cudaGetLastError();
        return absl::UnavailableError(absl::StrCat("driver entry point ", name, " not found"));
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(get("cuMemCreate", reinterpret_cast<void**>(&mem_create)));
    RETURN_IF_ERROR(get("cuMemRelease", reinterpret_cast<void**>(&mem_release)));
    RETURN_IF_ERROR(get("cuMemAddressReserve", reinterpret_cast<void**>(&address_reserve)));
    RETURN_IF_ERROR(get("cuMemAddressFree", reinterpret_cast<void**>(&address_free)));
    RETURN_IF_ERROR(get("cuMemMap", reinterpret_cast<void**>(&map)));
    RETURN_IF_ERROR(get("cuMemUnmap", reinterpret_cast<void**>(&unmap)));
    RETURN_IF_ERROR(get("cuMemSetAccess", reinterpret_cast<void**>(&set_access)));
    RETURN_IF_ERROR(get("cuMemExportToShareableHandle", reinterpret_cast<void**>(&export_handle)));
    RETURN_IF_ERROR(get("cuMemImportFromShareableHandle", reinterpret_cast<void**>(&import_handle)));
    RETURN_IF_ERROR(get("cuMemRetainAllocationHandle", reinterpret_cast<void**>(&retain_handle)));
    RETURN_IF_ERROR(get("cuMemGetAllocationGranularity", reinterpret_cast<void**>(&granularity)));
    RETURN_IF_ERROR(get("cuMemGetAddressRange", reinterpret_cast<void**>(&address_range)));
    RETURN_IF_ERROR(get("cuDeviceGet", reinterpret_cast<void**>(&device_get)));
    RETURN_IF_ERROR(get("cuDeviceGetAttribute", reinterpret_cast<void**>(&device_attribute)));
    RETURN_IF_ERROR(get("cuDeviceGetUuid", reinterpret_cast<void**>(&device_uuid)));
    return absl::OkStatus();
  }
};

std::unique_ptr<CudaDeviceApi> CudaDeviceApi::Create() {
  std::unique_ptr<CudaDeviceApi> api(new CudaDeviceApi());
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    (void)cudaGetLastError();
    api->unavailable_ = e != cudaSuccess ? absl::StrCat("no usable CUDA driver or device (",
                                                        cudaGetErrorName(e), ": ",
                                                        cudaGetErrorString(e), ")")
                                         : "no CUDA device";
    return api;
  }
  api->drv_ = std::make_unique<Driver>();
  if (absl::Status s = api->drv_->Load(); !s.ok()) {
    api->unavailable_ = std::string(s.message());
    return api;
  }
  api->device_count_ = n;
  return api;
}

CudaDeviceApi::~CudaDeviceApi() {
  std::map<StreamHandle, int> streams;
  {
    std::lock_guard<std::mutex> l(mu_);
    streams = streams_;
  }
  for (const auto& [s, d] : streams) DestroyStream(s);
}

absl::Status CudaDeviceApi::SetDevice(int device) const {
  if (device < 0 || device >= device_count_) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " does not exist (",
                                                   device_count_, " visible)"));
  }
  CUDA_RETURN_IF_ERROR(cudaSetDevice(device));
  return absl::OkStatus();
}

absl::StatusOr<DeviceUuid> CudaDeviceApi::UuidOf(int device) const {
  if (device < 0 || device >= device_count_) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " does not exist (",
                                                   device_count_, " visible)"));
  }
  CUdevice cu_dev = 0;
  CUuuid uuid;
  CU_RETURN_IF_ERROR(drv_->device_get(&cu_dev, device));
  CU_RETURN_IF_ERROR(drv_->device_uuid(&uuid, cu_dev));
  static_assert(sizeof(uuid.bytes) == kDeviceUuidBytes);
  DeviceUuid out;
  std::memcpy(out.data(), uuid.bytes, out.size());
  return out;
}

absl::StatusOr<int> CudaDeviceApi::StreamDevice(StreamHandle s) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = streams_.find(s);
  if (it == streams_.end()) return absl::NotFoundError("unknown stream handle");
  return it->second;
}

absl::StatusOr<int> CudaDeviceApi::EventDevice(EventHandle e) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = events_.find(e);
  if (it == events_.end()) return absl::NotFoundError("unknown event handle");
  return it->second;
}

namespace {

// `shareable`: ask for a POSIX-fd handle type (only for memory that is
// exported; cuMemCreate refuses the request where the device or the
// container has no such support, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_
// DESCRIPTOR_SUPPORTED).
CUmemAllocationProp VmmProp(int device, bool shareable) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof(prop));
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes =
      shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return prop;
}

}  // namespace

absl::StatusOr<DevicePtr> CudaDeviceApi::MapVmm(int device, uint64_t handle, uint64_t bytes) {
  CUdeviceptr ptr = 0;
  CU_RETURN_IF_ERROR(drv_->address_reserve(&ptr, bytes, 0, 0, 0));
  CUresult rc = drv_->map(ptr, bytes, 0, static_cast<CUmemGenericAllocationHandle>(handle), 0);
  if (rc == CUDA_SUCCESS) {
    CUmemAccessDesc access;
    std::memset(&access, 0, sizeof(access));
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    rc = drv_->set_access(ptr, bytes, &access, 1);
    if (rc != CUDA_SUCCESS) (void)drv_->unmap(ptr, bytes);
  }
  if (rc != CUDA_SUCCESS) {
    (void)drv_->address_free(ptr, bytes);
    return absl::InternalError(absl::StrCat("mapping a VMM allocation of ", bytes,
                                            " bytes failed: CUresult ", static_cast<int>(rc)));
  }
  return static_cast<DevicePtr>(ptr);
}

absl::StatusOr<DevicePtr> CudaDeviceApi::Allocate(int device, uint64_t bytes,
                                                   AllocSharing sharing) {
  RETURN_IF_ERROR(SetDevice(device));
  if (bytes == 0) return absl::InvalidArgumentError("allocation of 0 bytes");
  const bool shareable = sharing == AllocSharing::kPosixFd;
  if (shareable) {
    CUdevice cu_dev = 0;
    int supported = 0;
    CU_RETURN_IF_ERROR(drv_->device_get(&cu_dev, device));
    CU_RETURN_IF_ERROR(drv_->device_attribute(
        &supported, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cu_dev));
    if (supported == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "CUDA device ", device, " has no POSIX-fd handle support for cuMem allocations"));
    }
  }
  CUmemAllocationProp prop = VmmProp(device, shareable);
  size_t gran = 0;
  CU_RETURN_IF_ERROR(drv_->granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  const uint64_t size = (bytes + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h;
  CU_RETURN_IF_ERROR(drv_->mem_create(&h, size, &prop, 0));
  absl::StatusOr<DevicePtr> ptr = MapVmm(device, h, size);
  if (!ptr.ok()) {
    (void)drv_->mem_release(h);
    return ptr.status();
  }
  std::lock_guard<std::mutex> l(mu_);
  allocations_[*ptr] = Vmm{device, size, static_cast<uint64_t>(h), false};
  return *ptr;
}

absl::Status CudaDeviceApi::Free(DevicePtr base) {
  Vmm v;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = allocations_.find(base);
    if (it == allocations_.end()) return absl::NotFoundError("free of an unknown device pointer");
    v = it->second;
    allocations_.erase(it);
  }
  RETURN_IF_ERROR(SetDevice(v.device));
  CU_RETURN_IF_ERROR(drv_->unmap(static_cast<CUdeviceptr>(base), v.bytes));
  CU_RETURN_IF_ERROR(drv_->address_free(static_cast<CUdeviceptr>(base), v.bytes));
  CU_RETURN_IF_ERROR(drv_->mem_release(static_cast<CUmemGenericAllocationHandle>(v.handle)));
  return absl::OkStatus();
}

absl::StatusOr<AddressRange> CudaDeviceApi::GetAddressRange(DevicePtr ptr) {
  if (device_count_ == 0) return absl::FailedPreconditionError("no CUDA device");
  cudaPointerAttributes attr;
  CUDA_RETURN_IF_ERROR(cudaPointerGetAttributes(&attr, FromHandle<const void*>(ptr)));
  if (attr.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError("pointer is not device memory");
  }
  RETURN_IF_ERROR(SetDevice(attr.device));
  CUdeviceptr base = 0;
  size_t size = 0;
  CU_RETURN_IF_ERROR(drv_->address_range(&base, &size, static_cast<CUdeviceptr>(ptr)));
  return AddressRange{static_cast<DevicePtr>(base), static_cast<uint64_t>(size)};
}

absl::StatusOr<IpcHandleBytes> CudaDeviceApi::ExportLegacy(DevicePtr base) {
  if (device_count_ == 0) return absl::FailedPreconditionError("no CUDA device");
  cudaIpcMemHandle_t h;
  CUDA_RETURN_IF_ERROR(cudaIpcGetMemHandle(&h, FromHandle<void*>(base)));
  static_assert(sizeof(h) == kIpcHandleBytes);
  IpcHandleBytes out;
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

absl::StatusOr<UniqueFd> CudaDeviceApi::ExportFd(DevicePtr base) {
  if (device_count_ == 0) return absl::FailedPreconditionError("no CUDA device");
  CUmemGenericAllocationHandle h;
  CU_RETURN_IF_ERROR(drv_->retain_handle(&h, FromHandle<void*>(base)));
  int fd = -1;
  CUresult rc = drv_->export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  (void)drv_->mem_release(h);  // drop the reference the retain added
  CU_RETURN_IF_ERROR(rc);
  return UniqueFd(fd);
}

absl::StatusOr<Mapping> CudaDeviceApi::ImportLegacy(int device, const IpcHandleBytes& handle) {
  RETURN_IF_ERROR(SetDevice(device));
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* p = nullptr;
  CUDA_RETURN_IF_ERROR(cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
  CUdeviceptr base = 0;
  size_t size = 0;
  if (drv_->address_range(&base, &size, ToHandle(p)) != CUDA_SUCCESS) {
    (void)cudaIpcCloseMemHandle(p);
    return absl::InternalError("cuMemGetAddressRange on an IPC-opened allocation failed");
  }
  std::lock_guard<std::mutex> l(mu_);
  Mapping m{ToHandle(p), static_cast<uint64_t>(size) - (ToHandle(p) - base), device,
            next_token_++};
  mappings_[m.token] = Vmm{device, m.bytes, 0, true, m.ptr};
  return m;
}

absl::StatusOr<Mapping> CudaDeviceApi::ImportFd(int device, int fd, uint64_t bytes) {
  RETURN_IF_ERROR(SetDevice(device));
  if (bytes == 0) return absl::InvalidArgumentError("import of 0 bytes");
  CUmemGenericAllocationHandle h;
  CU_RETURN_IF_ERROR(drv_->import_handle(&h, FromHandle<void*>(static_cast<uint64_t>(fd)),
                                         CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
  CUmemAllocationProp prop = VmmProp(device, /*shareable=*/true);
  size_t gran = 0;
  (void)drv_->granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  if (gran == 0) gran = 2 << 20;
  const uint64_t size = (bytes + gran - 1) / gran * gran;
  absl::StatusOr<DevicePtr> ptr = MapVmm(device, h, size);
  if (!ptr.ok()) {
    (void)drv_->mem_release(h);
    return absl::InvalidArgumentError(absl::StrCat(
        "mapping the exported allocation failed (is it smaller than the ", bytes,
        " bytes claimed?): ", ptr.status().message()));
  }
  std::lock_guard<std::mutex> l(mu_);
  Mapping m{*ptr, bytes, device, next_token_++};
  mappings_[m.token] = Vmm{device, size, static_cast<uint64_t>(h), false, *ptr};
  return m;
}

absl::Status CudaDeviceApi::Unmap(const Mapping& mapping) {
  Vmm v;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = mappings_.find(mapping.token);
    if (it == mappings_.end()) return absl::NotFoundError("unmap of an unknown mapping");
    v = it->second;
    mappings_.erase(it);
  }
  RETURN_IF_ERROR(SetDevice(v.device));
  if (v.legacy) {
    // One close per open: the driver unmaps when the last reference goes.
    CUDA_RETURN_IF_ERROR(cudaIpcCloseMemHandle(FromHandle<void*>(v.ptr)));
    return absl::OkStatus();
  }
  CU_RETURN_IF_ERROR(drv_->unmap(static_cast<CUdeviceptr>(v.ptr), v.bytes));
  CU_RETURN_IF_ERROR(drv_->address_free(static_cast<CUdeviceptr>(v.ptr), v.bytes));
  CU_RETURN_IF_ERROR(drv_->mem_release(static_cast<CUmemGenericAllocationHandle>(v.handle)));
  return absl::OkStatus();
}

absl::StatusOr<StreamHandle> CudaDeviceApi::CreateStream(int device, StreamPriority priority) {
  RETURN_IF_ERROR(SetDevice(device));
  int least = 0, greatest = 0;
  CUDA_RETURN_IF_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s;
  CUDA_RETURN_IF_ERROR(cudaStreamCreateWithPriority(
      &s, cudaStreamNonBlocking, priority == StreamPriority::kHigh ? greatest : least));
  std::lock_guard<std::mutex> l(mu_);
  streams_[ToHandle(s)] = device;
  return ToHandle(s);
}

void CudaDeviceApi::DestroyStream(StreamHandle stream) {
  int device;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = streams_.find(stream);
    if (it == streams_.end()) return;
    device = it->second;
    streams_.erase(it);
  }
  if (!SetDevice(device).ok()) return;
  // No synchronize: the stream may be stuck (an aborted collective, a
  // producer event that never fires); CUDA releases it once its work ends.
  (void)cudaStreamDestroy(FromHandle<cudaStream_t>(stream));
  (void)cudaGetLastError();
}

absl::StatusOr<EventHandle> CudaDeviceApi::CreateEvent(int device, bool interprocess) {
  RETURN_IF_ERROR(SetDevice(device));
  cudaEvent_t e;
  CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(
      &e, cudaEventDisableTiming | (interprocess ? cudaEventInterprocess : 0)));
  std::lock_guard<std::mutex> l(mu_);
  events_[ToHandle(e)] = device;
  return ToHandle(e);
}

void CudaDeviceApi::DestroyEvent(EventHandle event) {
  int device;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = events_.find(event);
    if (it == events_.end()) return;
    device = it->second;
    events_.erase(it);
  }
  if (!SetDevice(device).ok()) return;
  (void)cudaEventDestroy(FromHandle<cudaEvent_t>(event));
  (void)cudaGetLastError();
}

absl::StatusOr<IpcHandleBytes> CudaDeviceApi::ExportEvent(EventHandle event) {
  ASSIGN_OR_RETURN(int device, EventDevice(event));
  RETURN_IF_ERROR(SetDevice(device));
  cudaIpcEventHandle_t h;
  CUDA_RETURN_IF_ERROR(cudaIpcGetEventHandle(&h, FromHandle<cudaEvent_t>(event)));
  static_assert(sizeof(h) == kIpcHandleBytes);
  IpcHandleBytes out;
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

absl::StatusOr<EventHandle> CudaDeviceApi::ImportEvent(int device, const IpcHandleBytes& handle) {
  RETURN_IF_ERROR(SetDevice(device));
  cudaIpcEventHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  cudaEvent_t e;
  CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(&e, h));
  std::lock_guard<std::mutex> l(mu_);
  events_[ToHandle(e)] = device;
  return ToHandle(e);
}

absl::Status CudaDeviceApi::RecordEvent(EventHandle event, StreamHandle stream) {
  ASSIGN_OR_RETURN(int device, StreamDevice(stream));
  RETURN_IF_ERROR(SetDevice(device));
  CUDA_RETURN_IF_ERROR(cudaEventRecord(FromHandle<cudaEvent_t>(event), FromHandle<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::StreamWaitEvent(StreamHandle stream, EventHandle event) {
  ASSIGN_OR_RETURN(int device, StreamDevice(stream));
  RETURN_IF_ERROR(SetDevice(device));
  CUDA_RETURN_IF_ERROR(
      cudaStreamWaitEvent(FromHandle<cudaStream_t>(stream), FromHandle<cudaEvent_t>(event), 0));
  return absl::OkStatus();
}

absl::StatusOr<bool> CudaDeviceApi::EventDone(EventHandle event) {
  ASSIGN_OR_RETURN(int device, EventDevice(event));
  RETURN_IF_ERROR(SetDevice(device));
  const cudaError_t e = cudaEventQuery(FromHandle<cudaEvent_t>(event));
  if (e == cudaSuccess) return true;
  if (e == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  return CudaError(e, "cudaEventQuery", __FILE__, __LINE__);
}

absl::Status CudaDeviceApi::MemcpyAsync(DevicePtr dst, DevicePtr src, uint64_t bytes,
                                        StreamHandle stream) {
  ASSIGN_OR_RETURN(int device, StreamDevice(stream));
  RETURN_IF_ERROR(SetDevice(device));
  CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(FromHandle<void*>(dst), FromHandle<const void*>(src), bytes,
                                       cudaMemcpyDefault, FromHandle<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::ScaleCastAsync(DevicePtr src, DataType from, DevicePtr dst, DataType to,
                                           uint64_t count, double scale, StreamHandle stream) {
  if (!IsFloatingPoint(from) || !IsFloatingPoint(to)) {
    return absl::InvalidArgumentError("scale/cast: float types only");
  }
  ASSIGN_OR_RETURN(int device, StreamDevice(stream));
  RETURN_IF_ERROR(SetDevice(device));
  if (count == 0) return absl::OkStatus();
  const auto rc = static_cast<cudaError_t>(
      LaunchScaleCast(FromHandle<const void*>(src), static_cast<int>(from), FromHandle<void*>(dst),
                      static_cast<int>(to), count, scale, FromHandle<void*>(stream)));
  if (rc != cudaSuccess) return CudaError(rc, "scale/cast kernel launch", __FILE__, __LINE__);
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::ReduceAsync(const std::vector<DevicePtr>& srcs, DataType from,
                                        DevicePtr dst, DataType to, uint64_t count, ReduceOp op,
                                        double scale, bool accumulate, StreamHandle stream) {
  RETURN_IF_ERROR(CheckReduceArgs(srcs.size(), op, from, to, scale != 1.0));
  ASSIGN_OR_RETURN(int device, StreamDevice(stream));
  RETURN_IF_ERROR(SetDevice(device));
  if (count == 0) return absl::OkStatus();
  // kMaxReduceInputs per launch; later launches fold the rest into dst, so
  // an input that is dst goes into the first (a 10-member in-place
  // reduce-scatter on an H200 read its own partial sum before this).
  const std::vector<DevicePtr> ordered = InputsDstFirst(srcs, dst);
  for (size_t k = 0; k < ordered.size(); k += kMaxReduceInputs) {
    const int n = static_cast<int>(std::min<size_t>(kMaxReduceInputs, srcs.size() - k));
    const void* ins[kMaxReduceInputs];
    for (int j = 0; j < n; ++j) ins[j] = FromHandle<const void*>(ordered[k + j]);
    const auto rc = static_cast<cudaError_t>(LaunchIntraDeviceReduce(
        ins, n, static_cast<int>(from), FromHandle<void*>(dst), static_cast<int>(to), count,
        static_cast<int>(op), scale, accumulate || k > 0, FromHandle<void*>(stream)));
    if (rc != cudaSuccess) return CudaError(rc, "reduce kernel launch", __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::ReduceToManyAsync(const std::vector<DevicePtr>& srcs, DataType from,
                                              const std::vector<DevicePtr>& dsts, DataType to,
                                              uint64_t count, ReduceOp op, double in_scale,
                                              double out_scale, StreamHandle stream) {
  if (srcs.size() > static_cast<size_t>(kMaxReduceInputs) ||
      dsts.size() > static_cast<size_t>(kMaxReduceInputs)) {
    // More members than one launch takes: the composed default.
    return DeviceApi::ReduceToManyAsync(srcs, from, dsts, to, count, op, in_scale, out_scale,
                                        stream);
  }
  RETURN_IF_ERROR(CheckReduceToMany(srcs, from, dsts, to));
  RETURN_IF_ERROR(
      CheckReduceArgs(srcs.size(), op, from, to, in_scale != 1.0 || out_scale != 1.0));
  ASSIGN_OR_RETURN(int device, StreamDevice(stream));
  RETURN_IF_ERROR(SetDevice(device));
  if (count == 0) return absl::OkStatus();
  const void* ins[kMaxReduceInputs];
  void* outs[kMaxReduceInputs];
  for (size_t k = 0; k < srcs.size(); ++k) ins[k] = FromHandle<const void*>(srcs[k]);
  for (size_t j = 0; j < dsts.size(); ++j) outs[j] = FromHandle<void*>(dsts[j]);
  const auto rc = static_cast<cudaError_t>(LaunchIntraDeviceReduceMany(
      ins, static_cast<int>(srcs.size()), static_cast<int>(from), outs,
      static_cast<int>(dsts.size()), static_cast<int>(to), count, static_cast<int>(op), in_scale,
      out_scale, FromHandle<void*>(stream)));
  if (rc != cudaSuccess) return CudaError(rc, "reduce kernel launch", __FILE__, __LINE__);
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::CopyToDevice(DevicePtr dst, const void* src, uint64_t bytes) {
  if (device_count_ == 0) return absl::FailedPreconditionError("no CUDA device");
  CUDA_RETURN_IF_ERROR(cudaMemcpy(FromHandle<void*>(dst), src, bytes, cudaMemcpyDefault));
  return absl::OkStatus();
}

absl::Status CudaDeviceApi::CopyToHost(void* dst, DevicePtr src, uint64_t bytes) {
  if (device_count_ == 0) return absl::FailedPreconditionError("no CUDA device");
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, FromHandle<const void*>(src), bytes, cudaMemcpyDefault));
  return absl::OkStatus();
}

}  // namespace hsdp::device
