// RunLightCase (sim_light.h): one --members=light case against an hsdpd
// coordinator. N - kObservers light members (LightFleet) and kObservers
// real ClusterMembers join at once; the observers' views, the steady
// window, and a light member's crash as the observers see it.
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "daemon/cluster/cluster_member.h"
#include "tools/bench/sim_light.h"
#include "tools/bench/sim_process.h"

namespace hsdp::sim {
namespace {

std::string Case(int n) { return absl::StrCat("embedded (light) N=", n, ": "); }

// The kObservers real members; they run their own threads and channels.
std::vector<std::unique_ptr<ClusterMember>> MakeObservers(const std::string& coordinator,
                                                          int first_port, uint32_t cluster_nodes,
                                                          const Flags& flags) {
  std::vector<std::unique_ptr<ClusterMember>> out;
  for (int k = 0; k < kObservers; ++k) {
    ClusterMember::Options o;
    o.coordinator = coordinator;
    o.address = absl::StrCat("127.0.0.1:", first_port + k);  // never dialled
    o.data_address = "127.0.0.1";
    o.name = absl::StrCat("observer", k);
    o.nodes = cluster_nodes;
    o.join_timeout = absl::Seconds(flags.phase_timeout_s);
    o.heartbeat = absl::Milliseconds(flags.heartbeat_ms);
    o.missed_heartbeats = flags.missed_heartbeats;
    out.push_back(std::make_unique<ClusterMember>(std::move(o), nullptr));
  }
  return out;
}

}  // namespace

Result RunLightCase(int n, const Flags& flags) {
  Result res;
  res.store = "embedded (light)";
  res.n = n;
  if (n <= kObservers) {
    res.notes.push_back(absl::StrCat("--members=light needs more than ", kObservers, " nodes"));
    return res;
  }
  const absl::Duration phase_timeout = absl::Seconds(flags.phase_timeout_s);
  const absl::Duration heartbeat = absl::Milliseconds(flags.heartbeat_ms);
  const int expected_alive = n + 1;  // the coordinator daemon is node 0 of N + 1
  Progress(Case(n) + "starting the store");
  CoordinatorProcess store;
  if (absl::Status s = store.Start(expected_alive, flags); !s.ok()) {
    res.notes.push_back(absl::StrCat("the store did not start: ", s.message()));
    return res;
  }
  const pid_t store_pid = store.pids().front();
  auto store_cpu = [&] { return CpuSeconds(std::to_string(store_pid)); };

  LightFleet::Options fo;
  fo.coordinator = store.address();
  fo.cluster_nodes = expected_alive;
  fo.count = n - kObservers;
  fo.threads = flags.sim_threads;
  fo.channels = flags.channels;
  fo.heartbeat = heartbeat;
  fo.join_timeout = phase_timeout;
  LightFleet fleet(fo);
  std::vector<std::unique_ptr<ClusterMember>> observers =
      MakeObservers(store.address(), fo.first_port + fo.count, expected_alive, flags);
  std::vector<Membership*> watching;
  for (auto& o : observers) watching.push_back(o.get());
  auto total_rpcs = [&] {
    uint64_t s = fleet.rpcs();
    for (const auto& o : observers) s += o->rpcs();
    return s;
  };

  // --- join -----------------------------------------------------------------
  Progress(Case(n) + "join");
  const double join_cpu0 = store_cpu(), join_sim0 = CpuSeconds("self");
  const absl::Time t0 = absl::Now();
  std::vector<absl::Status> started(kObservers);
  std::vector<std::thread> starters;
  for (int k = 0; k < kObservers; ++k) {
    starters.emplace_back([&, k] { started[k] = observers[k]->Start(); });
  }
  fleet.Start();
  std::map<std::string, int> failures;
  int joined = 0;
  for (absl::Time next = t0 + absl::Seconds(10);; next += absl::Seconds(10)) {
    if (fleet.WaitJoined(std::min(next, t0 + phase_timeout), &joined, &failures) ||
        absl::Now() >= t0 + phase_timeout) {
      break;
    }
    Progress(absl::StrCat(Case(n), joined, " light members joined after ",
                          absl::FormatDuration(absl::Trunc(absl::Now() - t0, absl::Seconds(1)))));
  }
  for (auto& t : starters) t.join();
  const absl::Time t_joined = absl::Now();
  int observers_ok = 0;
  for (int k = 0; k < kObservers; ++k) {
    if (started[k].ok()) {
      ++observers_ok;
    } else {
      ++failures[absl::StrCat("observer: ", started[k].message().substr(0, 200))];
    }
  }
  const bool all_ok = joined == fo.count && observers_ok == kObservers;
  res.join_all = all_ok ? Secs(absl::ToDoubleSeconds(t_joined - t0))
                        : absl::StrCat("failed (", joined + observers_ok, "/", n, " joined)");
  for (const auto& [why, count] : failures) {
    res.notes.push_back(absl::StrCat("join: ", count, " x ", why));
  }
  if (all_ok) {
    WaitEpochCaughtUp(store.address(), watching, expected_alive, t0, phase_timeout, &res);
  }
  res.notes.push_back(absl::StrCat("join phase: store CPU ", Secs(store_cpu() - join_cpu0),
                                   " s, sim CPU ", Secs(CpuSeconds("self") - join_sim0), " s, ",
                                   total_rpcs(), " member calls"));
  Progress(absl::StrCat(Case(n), "join ", res.join_all, ", views ", res.views));

  if (all_ok) {
    // --- steady -------------------------------------------------------------
    absl::SleepFor(2 * heartbeat);  // let the join storm settle
    Progress(absl::StrCat(Case(n), "steady window ", flags.window_s, " s"));
    const uint64_t rpcs0 = total_rpcs(), failed0 = fleet.failed_beats();
    fleet.ResetWorstLag();
    const double cpu0 = store_cpu(), sim0 = CpuSeconds("self");
    const absl::Time w0 = absl::Now();
    absl::SleepFor(absl::Seconds(flags.window_s));
    const double window = absl::ToDoubleSeconds(absl::Now() - w0);
    const double calls = static_cast<double>(total_rpcs() - rpcs0);
    const double cpu = store_cpu() - cpu0;
    res.rps = absl::StrFormat("%.0f", calls / window);
    res.store_cpu = absl::StrFormat("%.0f%%", 100 * cpu / window);
    res.us_per_beat = UsPerCall(cpu, calls);
    res.sim_cpu = absl::StrFormat("%.0f%%", 100 * (CpuSeconds("self") - sim0) / window);
    res.notes.push_back(absl::StrFormat(
        "steady: members counted %.0f calls/s; light members' failed heartbeats in the window "
        "%d, rejoins so far %d, worst heartbeat lag in the window %s",
        calls / window, fleet.failed_beats() - failed0, fleet.rejoins(),
        absl::FormatDuration(absl::Trunc(fleet.worst_lag(), absl::Milliseconds(1)))));
    res.notes.push_back(absl::StrCat("sim process: ", CountThreads(), " threads, ", CountFds(),
                                     " fds"));
    Progress(absl::StrCat(Case(n), "steady: ", res.rps, " RPC/s, store CPU ", res.store_cpu,
                          " (", res.us_per_beat, " us/call), sim CPU ", res.sim_cpu));

    // --- loss ---------------------------------------------------------------
    const int victim_rank = fleet.rank(0);
    std::vector<uint64_t> epoch_before;
    for (Membership* m : watching) epoch_before.push_back(m->epoch());
    Progress(absl::StrCat(Case(n), "crash of light member rank ", victim_rank));
    const absl::Time crash = absl::Now();
    fleet.Crash(0);
    WatchLoss(watching, epoch_before, victim_rank, crash, phase_timeout, &res);
    res.notes.push_back(absl::StrFormat(
        "loss: %d real observers; bound heartbeat x missed = %.1f s", kObservers,
        absl::ToDoubleSeconds(heartbeat * flags.missed_heartbeats)));
    Progress(absl::StrCat(Case(n), "loss seen ", res.loss_seen, ", epoch advanced ",
                          res.epoch_advanced));
  }

  // --- teardown -------------------------------------------------------------
  const absl::Time td = absl::Now();
  ParallelFor(kObservers, kObservers, [&](int k) { observers[k]->Stop(); });
  fleet.Stop();
  if (Exited(store_pid)) res.notes.push_back("the store process exited during the run");
  res.notes.push_back(
      absl::StrFormat("teardown %.1f s", absl::ToDoubleSeconds(absl::Now() - td)));
  return res;
}

}  // namespace hsdp::sim
