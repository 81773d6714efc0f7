// RunLightCase (sim_light.h): one --members=light case against an hsdpd
// coordinator or a 3-member etcd. N - kObservers light members
// (CoordinatorFleet, EtcdFleet) and kObservers real members (ClusterMember,
// EtcdMember) join at once; the observers' views, the steady window, and a
// light member's crash as the observers see it.
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "tools/bench/sim_light.h"
#include "tools/bench/sim_light_etcd.h"
#include "tools/bench/sim_nodes.h"
#include "tools/bench/sim_process.h"

namespace hsdp::sim {

Result RunLightCase(const std::string& kind, int n, const Flags& flags) {
  const bool embedded = kind == "embedded";
  auto Case = [&](int n) { return absl::StrCat(kind, " (light) N=", n, ": "); };
  Result res;
  res.store = absl::StrCat(kind, " (light)");
  res.n = n;
  if (n <= kObservers) {
    res.notes.push_back(absl::StrCat("--members=light needs more than ", kObservers, " nodes"));
    return res;
  }
  const absl::Duration phase_timeout = absl::Seconds(flags.phase_timeout_s);
  const absl::Duration heartbeat = absl::Milliseconds(flags.heartbeat_ms);
  // The coordinator daemon is node 0 of N + 1.
  const int expected_alive = embedded ? n + 1 : n;
  Progress(Case(n) + "starting the store");
  std::unique_ptr<Store> store;
  CoordinatorProcess* coordinator = nullptr;
  EtcdCluster* etcd_cluster = nullptr;
  if (embedded) {
    auto c = std::make_unique<CoordinatorProcess>();
    coordinator = c.get();
    store = std::move(c);
  } else {
    auto c = std::make_unique<EtcdCluster>(flags.etcd_data);
    etcd_cluster = c.get();
    store = std::move(c);
  }
  if (absl::Status s = store->Start(expected_alive, flags); !s.ok()) {
    res.notes.push_back(absl::StrCat("the store did not start: ", s.message()));
    return res;
  }
  const std::vector<pid_t> store_pids = store->pids();
  auto store_cpu = [&] {
    double s = 0;
    for (pid_t p : store_pids) s += CpuSeconds(std::to_string(p));
    return s;
  };

  LightFleet::Options fo;
  fo.cluster_nodes = expected_alive;
  fo.count = n - kObservers;
  fo.threads = flags.sim_threads;
  fo.channels = flags.channels;
  fo.heartbeat = heartbeat;
  fo.join_timeout = phase_timeout;
  std::unique_ptr<LightFleet> fleet_owner;
  NodeStore where;
  where.embedded = embedded;
  where.cluster_nodes = expected_alive;
  if (embedded) {
    where.coordinator = coordinator->address();
    fleet_owner = std::make_unique<CoordinatorFleet>(coordinator->address(), fo);
  } else {
    where.etcd_endpoints = etcd_cluster->endpoints();
    EtcdFleet::EtcdOptions eo;
    eo.endpoints = where.etcd_endpoints;
    eo.prefix = kEtcdPrefix;
    eo.missed_heartbeats = flags.missed_heartbeats;
    eo.keepalives_on_leader = flags.etcd_keepalives_on_leader;
    absl::StatusOr<std::unique_ptr<EtcdFleet>> f = EtcdFleet::Make(eo, fo);
    if (!f.ok()) {
      res.notes.push_back(absl::StrCat("etcd clients: ", f.status().message()));
      return res;
    }
    fleet_owner = std::move(*f);
  }
  // The kObservers real members: their own threads and channels.
  std::vector<std::unique_ptr<SimNode>> observers;
  for (int k = 0; k < kObservers; ++k) {
    // Never dialled.
    const std::string address = absl::StrCat("127.0.0.1:", fo.first_port + fo.count + k);
    absl::StatusOr<std::unique_ptr<SimNode>> node =
        MakeNode(where, absl::StrCat("observer", k), address, flags);
    if (!node.ok()) {
      res.notes.push_back(absl::StrCat("etcd clients: ", node.status().message()));
      return res;
    }
    observers.push_back(std::move(*node));
  }
  LightFleet& fleet = *fleet_owner;
  std::vector<Membership*> watching;
  for (auto& o : observers) watching.push_back(&o->member());
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
    starters.emplace_back([&, k] { started[k] = observers[k]->member().Start(); });
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
                          absl::FormatDuration(absl::Trunc(absl::Now() - t0, absl::Seconds(1))),
                          " (", fleet.rejoins(), " rejoins)"));
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
  if (all_ok && embedded) {
    WaitEpochCaughtUp(coordinator->address(), watching, expected_alive, t0, phase_timeout, &res);
  } else if (all_ok) {
    res.notes.push_back("views: sparse (etcd members hear news only: no first join)");
  }
  res.notes.push_back(absl::StrCat("join phase: store CPU ", Secs(store_cpu() - join_cpu0),
                                   " s, sim CPU ", Secs(CpuSeconds("self") - join_sim0), " s, ",
                                   total_rpcs(), " member calls, ", fleet.rejoins(),
                                   " rejoins (leases lost)"));
  if (const std::string stats = fleet.JoinStats(); !stats.empty()) {
    res.notes.push_back(absl::StrCat("join phase: ", stats));
  }
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
    if (!embedded) {
      res.notes.push_back(absl::StrCat(
          "etcd: keep-alives ", flags.etcd_keepalives_on_leader ? "on the raft leader" : "where "
          "calls go (--etcd-keepalive=any)", "; the light members' clients opened ",
          static_cast<EtcdFleet&>(fleet).keepalive_streams(), " keep-alive streams"));
    }
    Progress(absl::StrCat(Case(n), "steady: ", res.rps, " RPC/s, store CPU ", res.store_cpu,
                          " (", res.us_per_beat, " us/call), sim CPU ", res.sim_cpu));

    if (!embedded && flags.etcd_member_loss) {
      // --- an etcd member lost: the raft leader -------------------------------
      const int leader = etcd_cluster->Leader(absl::Seconds(10));
      std::vector<uint64_t> epochs;
      for (Membership* m : watching) epochs.push_back(m->epoch());
      const uint64_t failed0 = fleet.failed_beats(), rejoins0 = fleet.rejoins();
      const uint64_t streams0 = static_cast<EtcdFleet&>(fleet).keepalive_streams();
      Progress(absl::StrCat(Case(n), "SIGKILL of etcd member ", leader, " (the leader)"));
      const absl::Time killed = absl::Now();
      if (leader >= 0) etcd_cluster->Kill(leader);
      const int next = etcd_cluster->Leader(absl::Seconds(30));
      const double elected = absl::ToDoubleSeconds(absl::Now() - killed);
      // Two lease terms: a lease that was not renewed meanwhile has expired.
      absl::SleepFor(2 * heartbeat * flags.missed_heartbeats);
      int moved = 0;
      for (size_t k = 0; k < watching.size(); ++k) moved += watching[k]->epoch() != epochs[k];
      res.notes.push_back(absl::StrFormat(
          "etcd member lost: member %d (the leader) SIGKILLed; member %d leads %.2f s later; in "
          "the %.0f s after: %d failed renewals, %d rejoins (leases lost), %d keep-alive streams "
          "opened, %d of %d observers' epochs moved (a loss published)",
          leader, next, elected, absl::ToDoubleSeconds(2 * heartbeat * flags.missed_heartbeats),
          fleet.failed_beats() - failed0, fleet.rejoins() - rejoins0,
          static_cast<EtcdFleet&>(fleet).keepalive_streams() - streams0, moved,
          static_cast<int>(watching.size())));
      Progress(absl::StrCat(Case(n), "member lost: new leader after ", Secs(elected), " s, ",
                            fleet.rejoins() - rejoins0, " rejoins"));
    }

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
  ParallelFor(kObservers, kObservers, [&](int k) { observers[k]->member().Stop(); });
  fleet.Stop();
  for (pid_t p : store_pids) {
    if (Exited(p)) res.notes.push_back("a store process exited during the run");
  }
  res.notes.push_back(
      absl::StrFormat("teardown %.1f s", absl::ToDoubleSeconds(absl::Now() - td)));
  return res;
}

}  // namespace hsdp::sim
