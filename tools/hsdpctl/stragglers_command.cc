// hsdpctl stragglers [--job J] [--json]: ranks ordered by the total time the
// other members on this node waited for them (they arrived last), with
// counts, percentiles and the last operations where it happened.
#include <cstdio>
#include <iostream>

#include "commands.h"

namespace hsdpctl {

int RunStragglers(Context& c) {
  hsdp::v1::StragglersRequest req;
  req.set_job_id(c.job);
  grpc::ClientContext ctx;
  SetDeadline(&ctx, c);
  hsdp::v1::StragglersResponse r;
  grpc::Status s = c.admin->Stragglers(&ctx, req, &r);
  if (!s.ok()) return Fail(c, s);
  if (c.json) {
    std::cout << ToJson(r);
    return 0;
  }
  for (const auto& j : r.jobs()) {
    std::printf(
        "job %s (uid %u): %llu operations matched with two or more members on this node\n",
        j.job_id().c_str(), j.owner_uid(), static_cast<unsigned long long>(j.ops_matched()));
  }
  if (r.ranks_size() == 0) {
    std::printf("no rank has kept others waiting yet\n");
    return 0;
  }
  std::printf("%-24s %6s %8s %12s %9s %9s %9s %9s  %s\n", "JOB", "RANK", "LAST", "WAITED(s)",
              "P50(ms)", "P90(ms)", "P99(ms)", "MAX(ms)", "LATEST");
  for (const auto& rk : r.ranks()) {
    std::string latest = "-";
    if (rk.recent_size() > 0) {
      const auto& e = rk.recent(rk.recent_size() - 1);
      char buf[160];
      std::snprintf(buf, sizeof(buf), "%s group %u seq %llu: %.1f ms, %.1f s ago", e.op().c_str(),
                    e.group_id(), static_cast<unsigned long long>(e.seq()),
                    e.waited_seconds() * 1e3, e.age_seconds());
      latest = buf;
    }
    std::printf("%-24s %6d %8llu %12.3f %9.2f %9.2f %9.2f %9.2f  %s\n", rk.job_id().c_str(),
                rk.rank(), static_cast<unsigned long long>(rk.times_last()),
                rk.waited_seconds_total(), rk.p50_seconds() * 1e3, rk.p90_seconds() * 1e3,
                rk.p99_seconds() * 1e3, rk.max_seconds() * 1e3, latest.c_str());
  }
  return 0;
}

}  // namespace hsdpctl
