// What every case of hsdp-membership-sim shares, whichever way its members
// run (a thread per member, or light members sharing threads): the result
// row, progress lines, and the rules a phase is judged by (a view complete,
// a crash seen lost and the epoch advanced), one definition each.
#ifndef HSDP_TOOLS_BENCH_SIM_CASE_H_
#define HSDP_TOOLS_BENCH_SIM_CASE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "daemon/cluster/membership.h"
#include "hsdp/v1/admin.pb.h"

namespace hsdp::sim {

struct Result {
  std::string store;
  int n = 0;
  std::string join_all = "-", views = "-", rps = "-", store_cpu = "-", sim_cpu = "-",
              us_per_beat = "-", loss_seen = "-", epoch_advanced = "-";
  std::vector<std::string> notes;
};

std::string Secs(double s);
// A timestamped line on stderr.
void Progress(const std::string& what);
int AliveCount(const v1::NodesResponse& v);
bool SeesLost(const v1::NodesResponse& v, int rank);
// The store's CPU per call counted by the members, in microseconds ("-"
// without calls).
std::string UsPerCall(double cpu_s, double calls);
// Runs fn(i) for i in [0, n) on `threads` threads.
void ParallelFor(int n, int threads, const std::function<void(int)>& fn);

// Sparse views (ClusterMember; the embedded store): members do not hold
// every node, so "views complete" is when every member's epoch reached the
// epoch that published the last join (the first epoch whose list, as
// `coordinator`'s List shows it, has `expected` nodes alive). Sets
// res->views: seconds from `t0`, or "timeout (k/n)" and a note.
void WaitEpochCaughtUp(const std::string& coordinator, const std::vector<Membership*>& members,
                       int expected, absl::Time t0, absl::Duration timeout, Result* res);

// After node `victim_rank` crashed at `crash`: waits (up to `timeout`)
// until every observer shows it "lost" and until every observer's epoch
// moved past its `epoch_before`; sets res->loss_seen and res->epoch_advanced.
void WatchLoss(const std::vector<Membership*>& observers,
               const std::vector<uint64_t>& epoch_before, int victim_rank, absl::Time crash,
               absl::Duration timeout, Result* res);

}  // namespace hsdp::sim

#endif  // HSDP_TOOLS_BENCH_SIM_CASE_H_
