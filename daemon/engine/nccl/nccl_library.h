// NcclLibrary: libnccl loaded at run time (dlopen), never linked. One hsdpd
// binary serves CPU nodes (no NCCL: the device engine is not offered, and
// engine.kind nccl says why) and GPU nodes (NCCL found: the engine runs),
// and an NCCL older than the headers it was built with still loads as long
// as it has every required entry point.
//
// Where it looks, first hit wins:
//   $HSDP_NCCL_LIBRARY (a path or a file name; when set, nothing else);
//   "libnccl.so.2" through the dynamic loader (LD_LIBRARY_PATH, ld.so.cache);
//   the directory of the NCCL this binary was built against;
//   /usr/local/cuda/lib64 and /usr/local/cuda/lib.
//
// Optional entry points (ncclCommShrink, NCCL >= 2.27) are null when absent.
// Thread-safety: immutable after Open; Default() is loaded once per process.
#ifndef HSDP_DAEMON_ENGINE_NCCL_NCCL_LIBRARY_H_
#define HSDP_DAEMON_ENGINE_NCCL_NCCL_LIBRARY_H_

#include <nccl.h>

#include <string>

#include "absl/status/statusor.h"

namespace hsdp::nccl {

struct NcclLibrary {
  // The library at `name` (a path, or a file name the loader searches for).
  // Fails, naming the file and the first missing entry point, when it does
  // not load or lacks a required function. The handle is never closed.
  static absl::StatusOr<NcclLibrary> Open(const std::string& name);
  // The process's libnccl, searched as above; the result (or the error,
  // listing every place tried) is computed once.
  static absl::StatusOr<const NcclLibrary*> Default();

  std::string path;  // the file that was loaded
  int version = 0;   // ncclGetVersion

  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&::ncclCommFinalize) CommFinalize = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclCommUserRank) CommUserRank = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclRedOpCreatePreMulSum) RedOpCreatePreMulSum = nullptr;
  decltype(&::ncclRedOpDestroy) RedOpDestroy = nullptr;
  // Optional (null when the loaded NCCL lacks it).
  using ShrinkFn = ncclResult_t (*)(ncclComm_t, int*, int, ncclComm_t*, ncclConfig_t*, int);
  ShrinkFn CommShrink = nullptr;
};

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_NCCL_LIBRARY_H_
