#include "daemon/engine/nccl/nccl_collectives.h"

#include "daemon/engine/nccl/nccl_library.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "hsdp/common/status_macros.h"

namespace hsdp::nccl {
namespace {

absl::Status NcclError(const NcclLibrary& lib, ncclResult_t r, ncclComm_t comm, const char* what,
                       const char* file, int line) {
  const char* last = lib.GetLastError(comm);
  const absl::StatusCode code = r == ncclInvalidArgument || r == ncclInvalidUsage
                                    ? absl::StatusCode::kInvalidArgument
                                : r == ncclRemoteError || r == ncclSystemError
                                    ? absl::StatusCode::kUnavailable
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat(what, ": ", lib.GetErrorString(r),
                                         last != nullptr && *last ? absl::StrCat(" (", last, ")") : "",
                                         " [", file, ":", line, "]"));
}

// ncclInProgress is success for non-blocking communicators.
#define NCCL_RETURN_IF_ERROR(expr, comm)                                         \
  do {                                                                           \
    ncclResult_t hsdp_nccl_rc_ = (expr);                                         \
    if (hsdp_nccl_rc_ != ncclSuccess && hsdp_nccl_rc_ != ncclInProgress)         \
      return NcclError(*lib_, hsdp_nccl_rc_, (comm), #expr, __FILE__, __LINE__);        \
  } while (0)

ncclComm_t C(CommHandle h) { return reinterpret_cast<ncclComm_t>(static_cast<uintptr_t>(h)); }
CommHandle H(ncclComm_t c) { return static_cast<CommHandle>(reinterpret_cast<uintptr_t>(c)); }
cudaStream_t S(StreamHandle s) { return reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(s)); }
void* P(DevicePtr p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

absl::StatusOr<ncclDataType_t> NcclType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kFloat16: return ncclFloat16;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt32: return ncclInt32;
    case DataType::kInt64: return ncclInt64;
    case DataType::kUInt8: return ncclUint8;
    default: return absl::InvalidArgumentError("dtype has no NCCL equivalent");
  }
}

absl::StatusOr<ncclRedOp_t> NcclOp(RedOp op) {
  switch (op.op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kProduct: return ncclProd;
    case ReduceOp::kPremulSum:
      if (op.custom < 0) return absl::InvalidArgumentError("PreMulSum op was not created");
      return static_cast<ncclRedOp_t>(op.custom);
    default: return absl::InvalidArgumentError("reduce op has no NCCL equivalent");
  }
}

ncclConfig_t NonBlockingConfig() {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  return cfg;
}

}  // namespace

NcclCollectives::NcclCollectives(const NcclLibrary* lib) : lib_(lib) {}

absl::StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::Create() {
  ASSIGN_OR_RETURN(const NcclLibrary* lib, NcclLibrary::Default());
  return std::make_unique<NcclCollectives>(lib);
}

NcclCollectives::~NcclCollectives() = default;

std::string NcclCollectives::name() const { return absl::StrCat("nccl-", lib_->version); }

bool NcclCollectives::SupportsShrink() const {
  return lib_->CommShrink != nullptr && lib_->version >= 22700;
}

absl::StatusOr<int> NcclCollectives::DeviceOf(CommHandle comm) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = devices_.find(comm);
  if (it == devices_.end()) {
    return absl::FailedPreconditionError("communicator is unknown, aborted or destroyed");
  }
  return it->second;
}

absl::Status NcclCollectives::Prepare(CommHandle comm) const {
  ASSIGN_OR_RETURN(int d, DeviceOf(comm));
  if (cudaSetDevice(d) != cudaSuccess) {
    (void)cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaSetDevice(", d, ") failed"));
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueId> NcclCollectives::NewUniqueId() {
  ncclUniqueId id;
  NCCL_RETURN_IF_ERROR(lib_->GetUniqueId(&id), nullptr);
  static_assert(sizeof(id) == kUniqueIdBytes);
  UniqueId out;
  std::memcpy(out.bytes.data(), &id, sizeof(id));
  return out;
}

absl::StatusOr<std::vector<CommHandle>> NcclCollectives::InitRanks(
    const UniqueId& uid, int nranks, const std::vector<int>& ranks,
    const std::vector<int>& devices) {
  if (ranks.size() != devices.size() || ranks.empty()) {
    return absl::InvalidArgumentError("init: ranks and devices differ in length");
  }
  ncclUniqueId id;
  std::memcpy(&id, uid.bytes.data(), sizeof(id));
  std::vector<ncclComm_t> comms(ranks.size(), nullptr);
  ncclConfig_t cfg = NonBlockingConfig();
  NCCL_RETURN_IF_ERROR(lib_->GroupStart(), nullptr);
  absl::Status first;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (cudaSetDevice(devices[i]) != cudaSuccess) {
      (void)cudaGetLastError();
      first = absl::InvalidArgumentError(absl::StrCat("device ", devices[i], " is not usable"));
      break;
    }
    ncclResult_t r = lib_->CommInitRankConfig(&comms[i], nranks, id, ranks[i], &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
      first = NcclError(*lib_, r, nullptr, "ncclCommInitRankConfig", __FILE__, __LINE__);
      break;
    }
  }
  ncclResult_t end = lib_->GroupEnd();
  if (first.ok() && end != ncclSuccess && end != ncclInProgress) {
    first = NcclError(*lib_, end, nullptr, "ncclGroupEnd (init)", __FILE__, __LINE__);
  }
  if (!first.ok()) {
    for (ncclComm_t c : comms) {
      if (c != nullptr) (void)lib_->CommAbort(c);
    }
    return first;
  }
  std::vector<CommHandle> out;
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < comms.size(); ++i) {
    devices_[H(comms[i])] = devices[i];
    out.push_back(H(comms[i]));
  }
  return out;
}

absl::StatusOr<std::vector<CommHandle>> NcclCollectives::ShrinkRanks(
    const std::vector<CommHandle>& comms, const std::vector<int>& exclude) {
  if (!SupportsShrink()) {
    return absl::UnimplementedError(
        absl::StrCat("ncclCommShrink needs NCCL >= 2.27 (loaded: ", name(), ")"));
  }
  std::vector<int> ex(exclude);
  std::vector<ncclComm_t> out(comms.size(), nullptr);
  std::vector<int> devs(comms.size(), -1);
  ncclConfig_t cfg = NonBlockingConfig();
  NCCL_RETURN_IF_ERROR(lib_->GroupStart(), nullptr);
  absl::Status first;
  for (size_t i = 0; i < comms.size() && first.ok(); ++i) {
    auto d = DeviceOf(comms[i]);
    if (!d.ok()) {
      first = d.status();
      break;
    }
    devs[i] = *d;
    (void)cudaSetDevice(*d);
    int rank = -1;
    lib_->CommUserRank(C(comms[i]), &rank);
    if (std::find(ex.begin(), ex.end(), rank) != ex.end()) continue;  // excluded: no call
    ncclResult_t r = lib_->CommShrink(C(comms[i]), ex.data(), static_cast<int>(ex.size()), &out[i], &cfg,
                            NCCL_SHRINK_DEFAULT);
    if (r != ncclSuccess && r != ncclInProgress) {
      first = NcclError(*lib_, r, C(comms[i]), "ncclCommShrink", __FILE__, __LINE__);
    }
  }
  ncclResult_t end = lib_->GroupEnd();
  if (first.ok() && end != ncclSuccess && end != ncclInProgress) {
    first = NcclError(*lib_, end, nullptr, "ncclGroupEnd (shrink)", __FILE__, __LINE__);
  }
  if (!first.ok()) {
    for (ncclComm_t c : out) {
      if (c != nullptr) (void)lib_->CommAbort(c);
    }
    return first;
  }
  std::vector<CommHandle> handles;
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == nullptr) continue;
    devices_[H(out[i])] = devs[i];
    handles.push_back(H(out[i]));
  }
  return handles;
}

absl::Status NcclCollectives::GroupStart() {
  NCCL_RETURN_IF_ERROR(lib_->GroupStart(), nullptr);
  return absl::OkStatus();
}

absl::Status NcclCollectives::GroupEnd() {
  NCCL_RETURN_IF_ERROR(lib_->GroupEnd(), nullptr);
  return absl::OkStatus();
}

absl::Status NcclCollectives::AllReduce(DevicePtr send, DevicePtr recv, uint64_t count,
                                        DataType dtype, RedOp op, CommHandle comm,
                                        StreamHandle stream) {
  RETURN_IF_ERROR(Prepare(comm));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
  ASSIGN_OR_RETURN(ncclRedOp_t o, NcclOp(op));
  NCCL_RETURN_IF_ERROR(lib_->AllReduce(P(send), P(recv), count, t, o, C(comm), S(stream)), C(comm));
  return absl::OkStatus();
}

absl::Status NcclCollectives::AllGather(DevicePtr send, DevicePtr recv, uint64_t send_count,
                                        DataType dtype, CommHandle comm, StreamHandle stream) {
  RETURN_IF_ERROR(Prepare(comm));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
  NCCL_RETURN_IF_ERROR(lib_->AllGather(P(send), P(recv), send_count, t, C(comm), S(stream)), C(comm));
  return absl::OkStatus();
}

absl::Status NcclCollectives::ReduceScatter(DevicePtr send, DevicePtr recv, uint64_t recv_count,
                                            DataType dtype, RedOp op, CommHandle comm,
                                            StreamHandle stream) {
  RETURN_IF_ERROR(Prepare(comm));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
  ASSIGN_OR_RETURN(ncclRedOp_t o, NcclOp(op));
  NCCL_RETURN_IF_ERROR(
      lib_->ReduceScatter(P(send), P(recv), recv_count, t, o, C(comm), S(stream)), C(comm));
  return absl::OkStatus();
}

absl::Status NcclCollectives::Broadcast(DevicePtr send, DevicePtr recv, uint64_t count,
                                        DataType dtype, int root, CommHandle comm,
                                        StreamHandle stream) {
  RETURN_IF_ERROR(Prepare(comm));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
  NCCL_RETURN_IF_ERROR(lib_->Broadcast(P(send), P(recv), count, t, root, C(comm), S(stream)), C(comm));
  return absl::OkStatus();
}

absl::Status NcclCollectives::Send(DevicePtr buf, uint64_t count, DataType dtype, int peer,
                                   CommHandle comm, StreamHandle stream) {
  RETURN_IF_ERROR(Prepare(comm));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
  NCCL_RETURN_IF_ERROR(lib_->Send(P(buf), count, t, peer, C(comm), S(stream)), C(comm));
  return absl::OkStatus();
}

absl::Status NcclCollectives::Recv(DevicePtr buf, uint64_t count, DataType dtype, int peer,
                                   CommHandle comm, StreamHandle stream) {
  RETURN_IF_ERROR(Prepare(comm));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
  NCCL_RETURN_IF_ERROR(lib_->Recv(P(buf), count, t, peer, C(comm), S(stream)), C(comm));
  return absl::OkStatus();
}

absl::StatusOr<RedOp> NcclCollectives::CreatePreMulSum(double scalar, DataType dtype,
                                                       CommHandle comm) {
  RETURN_IF_ERROR(Prepare(comm));
  ASSIGN_OR_RETURN(ncclDataType_t t, NcclType(dtype));
  // The scalar, in the reduction's dtype, read by NCCL during the call.
  alignas(8) unsigned char buf[8];
  switch (dtype) {
    case DataType::kFloat32: { float v = static_cast<float>(scalar); std::memcpy(buf, &v, 4); break; }
    case DataType::kFloat64: std::memcpy(buf, &scalar, 8); break;
    case DataType::kFloat16: { __half v = __float2half(static_cast<float>(scalar)); std::memcpy(buf, &v, 2); break; }
    case DataType::kBFloat16: { __nv_bfloat16 v = __float2bfloat16(static_cast<float>(scalar)); std::memcpy(buf, &v, 2); break; }
    default: return absl::InvalidArgumentError("PreMulSum: float types only");
  }
  ncclRedOp_t op;
  NCCL_RETURN_IF_ERROR(lib_->RedOpCreatePreMulSum(&op, buf, t, ncclScalarHostImmediate, C(comm)),
                       C(comm));
  return RedOp{ReduceOp::kPremulSum, static_cast<int64_t>(op)};
}

void NcclCollectives::DestroyRedOp(RedOp op, CommHandle comm) {
  if (op.op != ReduceOp::kPremulSum || op.custom < 0 || !Prepare(comm).ok()) return;
  (void)lib_->RedOpDestroy(static_cast<ncclRedOp_t>(op.custom), C(comm));
}

AsyncState NcclCollectives::Query(CommHandle comm, absl::Status* error) {
  if (absl::Status s = Prepare(comm); !s.ok()) {
    *error = s;
    return AsyncState::kFailed;
  }
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = lib_->CommGetAsyncError(C(comm), &state);
  if (r != ncclSuccess) {
    *error = NcclError(*lib_, r, C(comm), "ncclCommGetAsyncError", __FILE__, __LINE__);
    return AsyncState::kFailed;
  }
  if (state == ncclSuccess) return AsyncState::kReady;
  if (state == ncclInProgress) return AsyncState::kInProgress;
  *error = NcclError(*lib_, state, C(comm), "communicator", __FILE__, __LINE__);
  return AsyncState::kFailed;
}

absl::Status NcclCollectives::Release(const std::vector<CommHandle>& comms, bool abort) {
  if (comms.empty()) return absl::OkStatus();
  std::vector<int> devs;
  for (CommHandle c : comms) {
    ASSIGN_OR_RETURN(int d, DeviceOf(c));
    devs.push_back(d);
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    for (CommHandle c : comms) devices_.erase(c);
  }
  // One group call for all of them (see the interface): several ranks of a
  // clique driven by this thread finalize or abort together.
  auto grouped = [&](auto&& call, const char* what) {
    absl::Status first;
    ncclResult_t r = lib_->GroupStart();
    if (r != ncclSuccess) return NcclError(*lib_, r, nullptr, "ncclGroupStart", __FILE__, __LINE__);
    for (size_t i = 0; i < comms.size(); ++i) {
      (void)cudaSetDevice(devs[i]);
      r = call(C(comms[i]));
      if (r != ncclSuccess && r != ncclInProgress && first.ok()) {
        first = NcclError(*lib_, r, C(comms[i]), what, __FILE__, __LINE__);
      }
    }
    r = lib_->GroupEnd();
    if (r != ncclSuccess && r != ncclInProgress && first.ok()) {
      first = NcclError(*lib_, r, nullptr, "ncclGroupEnd", __FILE__, __LINE__);
    }
    return first;
  };
  if (abort) return grouped([this](ncclComm_t c) { return lib_->CommAbort(c); }, "ncclCommAbort");
  // Non-blocking: finalize all, wait (bounded) until every one is quiescent,
  // then destroy them; if any does not get there in time, abort them all.
  absl::Status s = grouped([this](ncclComm_t c) { return lib_->CommFinalize(c); },
                           "ncclCommFinalize");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool quiet = s.ok();
  for (size_t i = 0; i < comms.size() && quiet; ++i) {
    (void)cudaSetDevice(devs[i]);
    for (;;) {
      ncclResult_t state = ncclInProgress;
      if (lib_->CommGetAsyncError(C(comms[i]), &state) != ncclSuccess || state != ncclInProgress) {
        quiet = state == ncclSuccess;
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        quiet = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  if (!quiet) {
    absl::Status a = grouped([this](ncclComm_t c) { return lib_->CommAbort(c); }, "ncclCommAbort");
    return s.ok() ? a : s;
  }
  return grouped([this](ncclComm_t c) { return lib_->CommDestroy(c); }, "ncclCommDestroy");
}

}  // namespace hsdp::nccl
