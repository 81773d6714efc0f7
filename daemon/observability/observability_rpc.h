// Observability's glue to the rest of the daemon: the Admin RPCs (Trace,
// Stragglers, Activity) — request checks and proto translation, so the gRPC
// handlers only authenticate and call these; none blocks (Trace reads a
// window of the past from the ring) — and the node gauges read from the
// session manager at scrape time.
#ifndef HSDP_DAEMON_OBSERVABILITY_OBSERVABILITY_RPC_H_
#define HSDP_DAEMON_OBSERVABILITY_OBSERVABILITY_RPC_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "daemon/observability/observability.h"
#include "daemon/jobs/session_manager.h"
#include "hsdp/v1/admin.pb.h"

namespace hsdp {

// `only_uid`: the caller's uid unless it is an admin (then unset).
// INVALID_ARGUMENT for negative or too long durations; FAILED_PRECONDITION
// when tracing is off (trace.buffer_events: 0).
absl::Status HandleTrace(Observability& obs, const v1::TraceRequest& req,
                         std::optional<uint32_t> only_uid, v1::TraceResponse* resp);

void HandleStragglers(const Observability& obs, const v1::StragglersRequest& req,
                      std::optional<uint32_t> only_uid, v1::StragglersResponse* resp);

// Sessions, groups, registered bytes and per-job ring use, now.
NodeGauges CollectNodeGauges(const SessionManager& sessions);

void HandleActivity(const Observability& obs, const SessionManager& sessions,
                    std::optional<uint32_t> only_uid, v1::ActivityResponse* resp);

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_OBSERVABILITY_RPC_H_
