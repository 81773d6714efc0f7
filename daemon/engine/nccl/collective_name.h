// The name of a collective in the NCCL engine's messages ("all-reduce",
// "reduce-scatter", ...). Pure; thread-safe.
#ifndef HSDP_DAEMON_ENGINE_NCCL_COLLECTIVE_NAME_H_
#define HSDP_DAEMON_ENGINE_NCCL_COLLECTIVE_NAME_H_

#include "daemon/engine/engine.h"

namespace hsdp::nccl {

inline const char* CollName(Collective c) {
  switch (c) {
    case Collective::kAllReduce: return "all-reduce";
    case Collective::kAllGather: return "all-gather";
    case Collective::kReduceScatter: return "reduce-scatter";
    case Collective::kBroadcast: return "broadcast";
    case Collective::kBarrier: return "barrier";
    case Collective::kAllToAll: return "all-to-all";
    default: return "unsupported collective";
  }
}

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_COLLECTIVE_NAME_H_
