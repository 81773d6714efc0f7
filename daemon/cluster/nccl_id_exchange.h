// How the daemons hosting the members of a device-memory group that spans
// nodes agree on the unique id of its NCCL communicators: through the
// coordinator's key/value store, under "hsdp/nccl/<group key>#<epoch>"
// (hashed when long). The daemon hosting the group's first member creates
// the id and claims the key (first writer wins); the others wait for it. The
// last of the participating daemons to read it deletes it, so long-lived
// daemons do not fill the bounded store.
//
// The value is checked (exactly kUniqueIdBytes) before NCCL sees it.
#ifndef HSDP_DAEMON_CLUSTER_NCCL_ID_EXCHANGE_H_
#define HSDP_DAEMON_CLUSTER_NCCL_ID_EXCHANGE_H_

#include <string>

#include "daemon/engine/nccl/nccl_engine.h"

namespace hsdp {

class ClusterStore;

// The store key for the exchange `key` (at most 200 bytes).
std::string NcclIdKey(const std::string& key);

// An NcclEngineOptions::exchange_id over `coordinator` (which must outlive
// the engine).
decltype(nccl::NcclEngineOptions::exchange_id) MakeNcclIdExchange(ClusterStore* coordinator);

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_NCCL_ID_EXCHANGE_H_
