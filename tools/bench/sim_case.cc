#include "tools/bench/sim_case.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "daemon/cluster/cluster_client.h"

namespace hsdp::sim {

std::string Secs(double s) { return absl::StrFormat("%.2f", s); }

void Progress(const std::string& what) {
  std::fprintf(stderr, "[%s] %s\n",
               absl::FormatTime("%H:%M:%S", absl::Now(), absl::LocalTimeZone()).c_str(),
               what.c_str());
  std::fflush(stderr);
}

std::string UsPerCall(double cpu_s, double calls) {
  return calls > 0 ? absl::StrFormat("%.1f", 1e6 * cpu_s / calls) : "-";
}

int AliveCount(const v1::NodesResponse& v) {
  int n = 0;
  for (const auto& s : v.nodes()) n += s.state() == "alive";
  return n;
}

bool SeesLost(const v1::NodesResponse& v, int rank) {
  for (const auto& s : v.nodes()) {
    if (s.node_rank() == rank) return s.state() == "lost";
  }
  return false;
}

void ParallelFor(int n, int threads, const std::function<void(int)>& fn) {
  std::atomic<int> next{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < std::min(n, threads); ++t) {
    ts.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < n;) fn(i);
    });
  }
  for (auto& t : ts) t.join();
}

void WaitEpochCaughtUp(const std::string& coordinator, const std::vector<Membership*>& members,
                       int expected, absl::Time t0, absl::Duration timeout, Result* res) {
  ClusterClient client(coordinator, "");
  const absl::Time deadline = absl::Now() + timeout;
  uint64_t target = 0;
  int alive = 0;
  while (target == 0 && absl::Now() < deadline) {
    absl::StatusOr<v1::ListResponse> list = client.List(absl::Seconds(5));
    if (list.status().code() == absl::StatusCode::kUnimplemented) {
      res->views = "-";
      res->notes.push_back("views: not measured (a coordinator without Cluster.List)");
      return;
    }
    if (list.ok()) {
      alive = 0;
      for (const v1::ClusterNode& n : list->nodes()) alive += n.state() == "alive";
      if (alive == expected) target = list->epoch();
    }
    if (target == 0) absl::SleepFor(absl::Milliseconds(50));
  }
  if (target == 0) {
    res->views = "timeout (the coordinator's list)";
    res->notes.push_back(absl::StrCat("views: the coordinator's list showed ", alive, "/",
                                      expected, " alive"));
    return;
  }
  std::vector<Membership*> pending = members;
  while (!pending.empty() && absl::Now() < deadline) {
    std::erase_if(pending, [&](Membership* m) { return m->epoch() >= target; });
    if (!pending.empty()) absl::SleepFor(absl::Milliseconds(20));
  }
  if (pending.empty()) {
    res->views = Secs(absl::ToDoubleSeconds(absl::Now() - t0));
    res->notes.push_back(absl::StrCat("views: sparse; every member reached epoch ", target,
                                      ", the one with all ", expected, " nodes alive"));
    return;
  }
  res->views = absl::StrCat("timeout (", members.size() - pending.size(), "/", members.size(),
                            ")");
  res->notes.push_back(absl::StrCat("views: ", pending.size(), " member(s) never reached epoch ",
                                    target));
}

void WatchLoss(const std::vector<Membership*>& observers,
               const std::vector<uint64_t>& epoch_before, int victim_rank, absl::Time crash,
               absl::Duration timeout, Result* res) {
  const size_t n = observers.size();
  std::vector<bool> seen(n), advanced(n);
  size_t seen_count = 0, advanced_count = 0;
  absl::Time seen_all = absl::InfiniteFuture(), advanced_all = absl::InfiniteFuture();
  const absl::Time deadline = crash + timeout;
  while ((seen_count < n || advanced_count < n) && absl::Now() < deadline) {
    for (size_t k = 0; k < n; ++k) {
      Membership& m = *observers[k];
      if (!seen[k] && SeesLost(m.View(), victim_rank)) {
        seen[k] = true;
        if (++seen_count == n) seen_all = absl::Now();
      }
      if (!advanced[k] && m.epoch() > epoch_before[k]) {
        advanced[k] = true;
        if (++advanced_count == n) advanced_all = absl::Now();
      }
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  res->loss_seen = seen_all == absl::InfiniteFuture()
                       ? absl::StrCat("timeout (", seen_count, "/", n, ")")
                       : Secs(absl::ToDoubleSeconds(seen_all - crash));
  res->epoch_advanced = advanced_all == absl::InfiniteFuture()
                            ? absl::StrCat("timeout (", advanced_count, "/", n, ")")
                            : Secs(absl::ToDoubleSeconds(advanced_all - crash));
}

}  // namespace hsdp::sim
