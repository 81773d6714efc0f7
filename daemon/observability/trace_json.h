// Renders a TraceSnapshot as Chrome trace-event JSON (chrome://tracing,
// ui.perfetto.dev). Layout:
//   - one process per job ("job J"), one thread per session in it
//     ("rank R (session S)"): per member operation a slice "<op> seq N"
//     from arrival to completion, with nested slices "wait for peers"
//     (arrival -> matched), "queued" (matched -> launched) and "executing"
//     (launched -> completed), and an instant "arrived last" on the
//     straggler's track with how long the others waited;
//   - process "hsdpd engine": one slice per operation from launch to
//     completion.
// Slices that overlap on one track (pipelined submissions) go to extra
// lanes ("... #2"). Times are microseconds from `from_ns`. Every slice's
// args carry job, group, op, dtype, bytes, seq and epoch.
#ifndef HSDP_DAEMON_OBSERVABILITY_TRACE_JSON_H_
#define HSDP_DAEMON_OBSERVABILITY_TRACE_JSON_H_

#include <cstdint>
#include <string>

#include "daemon/observability/trace_ring.h"

namespace hsdp {

struct TraceSummary {
  uint64_t member_ops = 0;  // member slices written
  uint64_t ops = 0;         // engine slices written
};

// Operations still running at `to_ns` end there, marked "incomplete".
std::string RenderChromeTrace(const TraceSnapshot& snapshot, int64_t from_ns, int64_t to_ns,
                              TraceSummary* summary = nullptr);

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_TRACE_JSON_H_
