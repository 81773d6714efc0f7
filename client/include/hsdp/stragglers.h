// hsdp::QueryStragglers — which ranks of a job kept the others waiting on
// this node (they arrived last at a collective), from hsdpd's Admin RPC
// Stragglers (the same report as `hsdpctl stragglers`).
//
//   ASSIGN_OR_RETURN(hsdp::StragglerReport r, hsdp::QueryStragglers("", "llama-7b"));
//   for (const hsdp::StragglerRank& s : r.ranks) ...  // most waited-for first
//
// A non-root caller sees only its own jobs. Thread-safe; blocks for one RPC.
#ifndef HSDP_STRAGGLERS_H_
#define HSDP_STRAGGLERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hsdp {

// One operation where a rank arrived last.
struct StragglerOp {
  uint64_t event_id = 0;  // increases daemon-wide: newer events have larger ids
  uint32_t group_id = 0;
  std::string op;  // "all_reduce", ...
  uint64_t seq = 0;
  uint32_t epoch = 0;
  double waited_seconds = 0;  // how long the others waited for the rank
  double age_seconds = 0;     // how long ago
};

struct StragglerRank {
  std::string job_id;
  uint32_t owner_uid = 0;           // the job's owner (a job is its owner plus its id)
  int rank = 0;                     // global rank
  uint64_t times_last = 0;          // operations where it arrived last
  double waited_seconds_total = 0;  // the others' total wait for it
  double p50_seconds = 0, p90_seconds = 0, p99_seconds = 0, max_seconds = 0;
  std::vector<StragglerOp> recent;  // the last few, oldest first
};

struct StragglerReport {
  std::vector<StragglerRank> ranks;             // most waited-for first
  std::map<std::string, uint64_t> ops_matched;  // by job: ops with >= 2 members on the node
};

// `socket_path` "" = $HSDPD_SOCKET, else the default path; `job_id` "" =
// every job the caller may see. UNAVAILABLE when no daemon answers.
absl::StatusOr<StragglerReport> QueryStragglers(const std::string& socket_path,
                                                const std::string& job_id = "",
                                                absl::Duration timeout = absl::Seconds(10));

}  // namespace hsdp

#endif  // HSDP_STRAGGLERS_H_
