// hsdp-membership-sim: membership at scale, by simulation.
//
// Starts N light simulated nodes, threads speaking the real membership
// protocol through the real classes (ClusterMember for cluster.store
// embedded, EtcdMember + EtcdStore + EtcdClient for etcd; no data path),
// against a real store: the project's hsdpd as the coordinator (embedded),
// or a 3-member etcd cluster on 127.0.0.1 (etcd). For each store and N it
// measures:
//   join        all N Start() calls at once (a thread each): until all
//               returned OK, and until every node's View() shows every node
//               alive (etcd: N), or, for the embedded store's sparse views,
//               until every node's epoch reached the one that published the
//               last join (N+1 alive with the coordinator daemon itself);
//   steady      over a window: RPC/s arriving at the store (etcd: its
//               Prometheus counters; embedded: the members' own rpcs()
//               counters), the store's CPU and the simulator's;
//   loss        one node crashes (stops heartbeating without leaving): until
//               every other node (N >= 256: a sample of 16) shows it "lost"
//               and until their epoch() moved past the one before the crash.
// "store us/call" is the store's CPU in the window per call the members
// counted (in the steady state, nearly all heartbeats).
// Every phase has a timeout ("timeout" in the table). Processes started here
// die with it (PR_SET_PDEATHSIG, a kill at exit and on SIGINT/SIGTERM).
//
// --members=threads (the default) runs every member as above: a real
// ClusterMember / EtcdMember with its own threads and channel. The cost of
// 1,024 of them saturates two cores, so --members=light (sim_light.h,
// sim_light_etcd.h) runs N - 16 light members that share --sim-threads
// worker threads and --channels clients, each keeping only what it needs to
// speak the real protocol through the real clients to the real store (the
// coordinator: rank, instance, epoch, events cursor; etcd: rank, instance,
// lease); the 16 others are real ClusterMembers / EtcdMembers, the
// observers of the loss phase. The victim is a light member.
// --etcd-keepalive=any keeps the etcd clients' keep-alive streams where
// their calls go instead of on the raft leader (the baseline of §14f).
//
//   hsdp-membership-sim [--nodes=64,256,1024] [--stores=embedded,etcd]
//       [--window-s=10] [--heartbeat-ms=1000] [--missed-heartbeats=5]
//       [--phase-timeout-s=120] [--hsdpd=PATH] [--etcd=PATH]
//       [--etcd-data=DIR] [--log-level=error]
//       [--members=threads|light] [--sim-threads=64] [--channels=4]
//       [--etcd-keepalive=leader|any] [--etcd-member-loss]
// --etcd-member-loss: the etcd light cases SIGKILL the raft leader after the
// steady window, report the re-election and what the members lost in two
// lease terms after it, and then see the crash with two members left.
// Exit 0 when every case joined every node and saw the crash, 3 when one
// did not (its row says how), 2 for bad arguments.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster_client.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "hsdp/common/logging.h"
#include "tools/bench/sim_case.h"
#include "tools/bench/sim_light.h"
#include "tools/bench/sim_nodes.h"
#include "tools/bench/sim_process.h"
#include "tools/bench/sim_stores.h"

namespace hsdp {
namespace {

using sim::AliveCount;
using sim::CoordinatorProcess;
using sim::CountFds;
using sim::CountThreads;
using sim::CpuSeconds;
using sim::EtcdCounters;
using sim::EtcdCluster;
using sim::Exited;
using sim::Flags;
using sim::FreePort;
using sim::KillAllChildren;
using sim::KillChild;
using sim::OnSignal;
using sim::ParallelFor;
using sim::Progress;
using sim::ReadFile;
using sim::Result;
using sim::Scrape;
using sim::SimNode;
using sim::Secs;
using sim::Spawn;
using sim::Store;
using sim::Tail;
using sim::TempDir;

// ---------------------------------------------------------------------------
// One case.

Result RunCase(const std::string& kind, int n, const Flags& flags) {
  Result res;
  res.store = kind;
  res.n = n;
  const absl::Duration phase_timeout = absl::Seconds(flags.phase_timeout_s);
  const absl::Duration heartbeat = absl::Milliseconds(flags.heartbeat_ms);
  const bool embedded = kind == "embedded";
  Progress(absl::StrCat(kind, " N=", n, ": starting the store"));

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
  // The coordinator daemon is node 0 of N + 1.
  const int expected_alive = embedded ? n + 1 : n;
  if (absl::Status s = store->Start(expected_alive, flags); !s.ok()) {
    res.notes.push_back(absl::StrCat("the store did not start: ", s.message()));
    return res;
  }
  // The simulated nodes.
  sim::NodeStore where;
  where.embedded = embedded;
  if (embedded) {
    where.coordinator = coordinator->address();
  } else {
    where.etcd_endpoints = etcd_cluster->endpoints();
  }
  where.cluster_nodes = expected_alive;
  std::vector<std::unique_ptr<SimNode>> nodes(n);
  for (int i = 0; i < n; ++i) {
    const std::string address = absl::StrCat("127.0.0.1:", 20000 + i);  // never dialled
    absl::StatusOr<std::unique_ptr<SimNode>> node =
        sim::MakeNode(where, absl::StrCat("sim", i), address, flags);
    if (!node.ok()) {
      res.notes.push_back(absl::StrCat("EtcdClient::Connect: ", node.status().message()));
      return res;
    }
    nodes[i] = std::move(*node);
  }
  std::vector<pid_t> store_pids = store->pids();
  auto store_cpu = [&] {
    double s = 0;
    for (pid_t p : store_pids) s += CpuSeconds(std::to_string(p));
    return s;
  };
  auto total_rpcs = [&] {
    uint64_t s = 0;
    for (const auto& node : nodes) s += node->rpcs();
    return s;
  };

  // --- join ---------------------------------------------------------------
  Progress(absl::StrCat(kind, " N=", n, ": join"));
  const double join_cpu0 = store_cpu(), join_sim0 = CpuSeconds("self");
  std::vector<absl::Status> started(n);
  std::atomic<int> returned{0};
  std::vector<std::atomic<bool>> done(n);
  const absl::Time t0 = absl::Now();
  std::vector<std::thread> starters;
  starters.reserve(n);
  for (int i = 0; i < n; ++i) {
    starters.emplace_back([&, i] {
      started[i] = nodes[i]->member().Start();
      done[i] = true;
      returned.fetch_add(1);
    });
  }
  const absl::Time join_deadline = t0 + phase_timeout;
  absl::Time next_report = t0 + absl::Seconds(10);
  while (returned.load() < n && absl::Now() < join_deadline) {
    absl::SleepFor(absl::Milliseconds(5));
    if (absl::Now() >= next_report) {
      next_report += absl::Seconds(10);
      int ok = 0;
      for (int i = 0; i < n; ++i) ok += done[i] && started[i].ok();
      Progress(absl::StrCat(kind, " N=", n, ": ", ok, " joined after ",
                            absl::FormatDuration(absl::Trunc(absl::Now() - t0, absl::Seconds(1))),
                            "; ", total_rpcs(), " member calls"));
    }
  }
  const absl::Time t_returned = absl::Now();
  const bool all_returned = returned.load() == n;
  if (!all_returned) {
    // Ends the Starts still in progress (CANCELLED).
    ParallelFor(n, 64, [&](int i) {
      if (!done[i]) nodes[i]->member().Stop();
    });
  }
  for (auto& t : starters) t.join();
  std::vector<int> joined;
  std::map<std::string, int> failures;
  for (int i = 0; i < n; ++i) {
    if (started[i].ok()) {
      joined.push_back(i);
    } else {
      // The cause: what follows "last error: " when there is one.
      absl::string_view why = started[i].message();
      const size_t at = why.find("last error: ");
      if (at != absl::string_view::npos) why = why.substr(at + 12);
      ++failures[std::string(why.substr(0, 200))];
    }
  }
  const bool all_ok = static_cast<int>(joined.size()) == n;
  if (all_ok) {
    res.join_all = Secs(absl::ToDoubleSeconds(t_returned - t0));
  } else {
    res.join_all = absl::StrCat(all_returned ? "failed" : "timeout", " (", joined.size(), "/", n,
                                " joined)");
    for (const auto& [why, count] : failures) {
      res.notes.push_back(absl::StrCat("join: ", count, " x ", why));
    }
  }
  Progress(absl::StrCat(kind, " N=", n, ": join returned: ", res.join_all,
                        "; rpcs so far ", total_rpcs()));
  // Views: every joined node sees all (expected_alive) alive.
  if (all_ok) {
    std::vector<Membership*> members;
    for (int i : joined) members.push_back(&nodes[i]->member());
    if (embedded) {
      sim::WaitEpochCaughtUp(coordinator->address(), members, expected_alive, t0,
                             phase_timeout, &res);
    } else {
      // Sparse views: a member hears of no first join (nothing to wait for);
      // `hsdpctl nodes` reads the node keys.
      res.views = "-";
      res.notes.push_back("views: sparse (etcd members hear news only: no first join)");
    }
  }
  res.notes.push_back(absl::StrCat(
      "join phase: store CPU ", Secs(store_cpu() - join_cpu0), " s, sim CPU ",
      Secs(CpuSeconds("self") - join_sim0), " s, ", total_rpcs(), " member calls"));
  Progress(absl::StrCat(kind, " N=", n, ": views: ", res.views));

  if (joined.size() >= 2) {
    // --- steady -------------------------------------------------------------
    absl::SleepFor(2 * heartbeat);  // let the join storm settle
    Progress(absl::StrCat(kind, " N=", n, ": steady window ", flags.window_s, " s"));
    std::vector<EtcdCounters> before;
    if (etcd_cluster) {
      for (int p : etcd_cluster->client_ports()) before.push_back(Scrape(p));
    }
    const uint64_t rpcs0 = total_rpcs();
    const double cpu0 = store_cpu(), sim0 = CpuSeconds("self");
    const absl::Time w0 = absl::Now();
    absl::SleepFor(absl::Seconds(flags.window_s));
    const double window = absl::ToDoubleSeconds(absl::Now() - w0);
    const uint64_t rpcs1 = total_rpcs();
    const double cpu1 = store_cpu(), sim1 = CpuSeconds("self");
    const double client_rps = static_cast<double>(rpcs1 - rpcs0) / window;
    res.store_cpu = absl::StrFormat("%.0f%%", 100 * (cpu1 - cpu0) / window);
    res.us_per_beat = sim::UsPerCall(cpu1 - cpu0, static_cast<double>(rpcs1 - rpcs0));
    res.sim_cpu = absl::StrFormat("%.0f%%", 100 * (sim1 - sim0) / window);
    if (etcd_cluster) {
      std::vector<EtcdCounters> after;
      for (int p : etcd_cluster->client_ports()) after.push_back(Scrape(p));
      double rpc = 0, sent = 0, watch = 0;
      std::vector<std::string> per;
      bool ok = true;
      for (size_t i = 0; i < after.size(); ++i) {
        ok = ok && before[i].ok && after[i].ok;
        const double r = (after[i].unary_handled - before[i].unary_handled) +
                         (after[i].stream_received - before[i].stream_received);
        rpc += r;
        sent += after[i].stream_sent - before[i].stream_sent;
        watch += after[i].watch_sent - before[i].watch_sent;
        per.push_back(absl::StrFormat("m%d %.0f/s", i, r / window));
      }
      res.rps = ok ? absl::StrFormat("%.0f", rpc / window) : "scrape failed";
      res.notes.push_back(absl::StrFormat(
          "steady: etcd counted %.0f calls/s (unary handled + stream messages received; %s), "
          "members counted %.0f calls/s; stream messages sent %.0f/s (watch %.0f/s)",
          rpc / window, absl::StrJoin(per, ", "), client_rps, sent / window, watch / window));
    } else {
      res.rps = absl::StrFormat("%.0f", client_rps);
      res.notes.push_back(absl::StrFormat("steady: members counted %.0f calls/s (client side)",
                                          client_rps));
    }
    res.notes.push_back(absl::StrCat("sim process: ", CountThreads(), " threads, ", CountFds(),
                                     " fds"));
    Progress(absl::StrCat(kind, " N=", n, ": steady: ", res.rps, " RPC/s, store CPU ",
                          res.store_cpu, ", sim CPU ", res.sim_cpu));

    // --- loss ---------------------------------------------------------------
    // The victim: the first joined node that is not etcd's sweeper (its own
    // loss waits for an election; measured apart below).
    int victim = joined.front();
    for (int i : joined) {
      if (!nodes[i]->sweeping()) {
        victim = i;
        break;
      }
    }
    const int victim_rank = nodes[victim]->member().node_rank();
    std::vector<int> observers;
    for (int i : joined) {
      if (i != victim) observers.push_back(i);
    }
    if (n >= 256 && observers.size() > 16) {
      std::vector<int> sample;
      for (int k = 0; k < 16; ++k) sample.push_back(observers[k * observers.size() / 16]);
      observers.swap(sample);
    }
    std::vector<uint64_t> epoch_before;
    for (int i : observers) epoch_before.push_back(nodes[i]->member().epoch());
    Progress(absl::StrCat(kind, " N=", n, ": crash of node rank ", victim_rank, "; ",
                          observers.size(), " observers"));
    const absl::Time crash = absl::Now();
    nodes[victim]->member().Stop();  // no goodbye: heartbeats just stop
    const double stop_s = absl::ToDoubleSeconds(absl::Now() - crash);
    std::vector<Membership*> watching;
    for (int i : observers) watching.push_back(&nodes[i]->member());
    sim::WatchLoss(watching, epoch_before, victim_rank, crash, phase_timeout, &res);
    res.notes.push_back(absl::StrFormat(
        "loss: %d observers; the victim's Stop took %.2f s; bound heartbeat x missed = %.1f s",
        observers.size(), stop_s,
        absl::ToDoubleSeconds(heartbeat * flags.missed_heartbeats)));
    Progress(absl::StrCat(kind, " N=", n, ": loss seen ", res.loss_seen, ", epoch advanced ",
                          res.epoch_advanced));
  }

  // --- teardown -------------------------------------------------------------
  Progress(absl::StrCat(kind, " N=", n, ": teardown"));
  const absl::Time td = absl::Now();
  ParallelFor(n, 64, [&](int i) { nodes[i]->member().Stop(); });
  nodes.clear();
  for (pid_t p : store_pids) {
    if (Exited(p)) res.notes.push_back(absl::StrCat("store process ", p, " exited during the run"));
  }
  store.reset();
  res.notes.push_back(
      absl::StrFormat("teardown %.1f s", absl::ToDoubleSeconds(absl::Now() - td)));
  return res;
}

std::string CpuModel() {
  const std::string info = ReadFile("/proc/cpuinfo");
  for (absl::string_view line : absl::StrSplit(info, '\n')) {
    if (absl::StartsWith(line, "model name")) {
      const size_t colon = line.find(':');
      if (colon != absl::string_view::npos) {
        return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
      }
    }
  }
  return "unknown";
}

bool ParseFlag(const char* arg, const char* name, std::string* out) {
  const std::string prefix = absl::StrCat("--", name, "=");
  if (!absl::StartsWith(arg, prefix)) return false;
  *out = std::string(arg).substr(prefix.size());
  return true;
}

int Main(int argc, char** argv) {
  Flags flags;
  {
    std::error_code ec;
    const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
    flags.hsdpd = (self.parent_path() / "hsdpd").string();
  }
  for (int i = 1; i < argc; ++i) {
    std::string v;
    auto ints = [&](std::vector<int>* out) {
      out->clear();
      for (absl::string_view s : absl::StrSplit(v, ',', absl::SkipEmpty())) {
        int x;
        if (!absl::SimpleAtoi(s, &x) || x < 1) return false;
        out->push_back(x);
      }
      return !out->empty();
    };
    auto one = [&](int* out) { return absl::SimpleAtoi(v, out) && *out > 0; };
    bool ok = true;
    if (ParseFlag(argv[i], "nodes", &v)) {
      ok = ints(&flags.nodes);
    } else if (ParseFlag(argv[i], "stores", &v)) {
      flags.stores = absl::StrSplit(v, ',', absl::SkipEmpty());
      for (const auto& s : flags.stores) ok = ok && (s == "embedded" || s == "etcd");
    } else if (ParseFlag(argv[i], "window-s", &v)) {
      ok = one(&flags.window_s);
    } else if (ParseFlag(argv[i], "heartbeat-ms", &v)) {
      ok = one(&flags.heartbeat_ms);
    } else if (ParseFlag(argv[i], "missed-heartbeats", &v)) {
      ok = one(&flags.missed_heartbeats);
    } else if (ParseFlag(argv[i], "phase-timeout-s", &v)) {
      ok = one(&flags.phase_timeout_s);
    } else if (ParseFlag(argv[i], "hsdpd", &v)) {
      flags.hsdpd = v;
    } else if (ParseFlag(argv[i], "etcd", &v)) {
      flags.etcd = v;
    } else if (ParseFlag(argv[i], "etcd-data", &v)) {
      flags.etcd_data = v;
    } else if (ParseFlag(argv[i], "log-level", &v)) {
      flags.log_level = v;
    } else if (ParseFlag(argv[i], "members", &v)) {
      ok = v == "threads" || v == "light";
      flags.light = v == "light";
    } else if (ParseFlag(argv[i], "sim-threads", &v)) {
      ok = one(&flags.sim_threads);
    } else if (ParseFlag(argv[i], "channels", &v)) {
      ok = one(&flags.channels);
    } else if (std::string(argv[i]) == "--etcd-member-loss") {
      flags.etcd_member_loss = true;
    } else if (ParseFlag(argv[i], "etcd-keepalive", &v)) {
      ok = v == "leader" || v == "any";
      flags.etcd_keepalives_on_leader = v == "leader";
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: %s [--nodes=64,256,1024] [--stores=embedded,etcd] [--window-s=10] "
                   "[--heartbeat-ms=1000] [--missed-heartbeats=5] [--phase-timeout-s=120] "
                   "[--hsdpd=PATH] [--etcd=PATH] [--etcd-data=DIR] [--log-level=error] "
                   "[--members=threads|light] [--sim-threads=64] [--channels=4] "
                   "[--etcd-keepalive=leader|any] [--etcd-member-loss]\n"
                   "bad argument: %s\n",
                   argv[0], argv[i]);
      return 2;
    }
  }
  LogLevel level;
  if (!ParseLogLevel(flags.log_level, &level)) {
    std::fprintf(stderr, "bad --log-level %s\n", flags.log_level.c_str());
    return 2;
  }
  SetLogLevel(level);

  std::atexit(KillAllChildren);
  ::signal(SIGINT, OnSignal);
  ::signal(SIGTERM, OnSignal);
  ::signal(SIGPIPE, SIG_IGN);

  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  const rlim_t soft_before = rl.rlim_cur;
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  ::getrlimit(RLIMIT_NOFILE, &rl);

  std::printf("# hsdp-membership-sim\n\n");
  std::printf("machine: %u CPUs (nproc), %s\n", std::thread::hardware_concurrency(),
              CpuModel().c_str());
  std::printf("RLIMIT_NOFILE: soft %llu -> %llu (hard %llu)\n",
              static_cast<unsigned long long>(soft_before),
              static_cast<unsigned long long>(rl.rlim_cur),
              static_cast<unsigned long long>(rl.rlim_max));
  std::printf(
      "heartbeat_ms %d, missed_heartbeats %d (loss bound %.1f s), steady window %d s, phase "
      "timeout %d s\nmembers: %s\nhsdpd: %s\netcd: %s (3 members, data in %s; keep-alives %s)"
      "\n\n",
      flags.heartbeat_ms, flags.missed_heartbeats,
      flags.heartbeat_ms * flags.missed_heartbeats / 1000.0, flags.window_s, flags.phase_timeout_s,
      flags.light ? absl::StrFormat("light (%d worker threads, %d channels, %d real observers)",
                                    flags.sim_threads, flags.channels, sim::kObservers)
                        .c_str()
                  : "a thread and a channel each",
      flags.hsdpd.c_str(), flags.etcd.c_str(),
      flags.etcd_data.empty() ? "/tmp" : flags.etcd_data.c_str(),
      flags.etcd_keepalives_on_leader ? "on the raft leader" : "where calls go");
  std::fflush(stdout);

  std::vector<Result> results;
  for (int n : flags.nodes) {
    for (const std::string& s : flags.stores) {
      results.push_back(flags.light ? sim::RunLightCase(s, n, flags) : RunCase(s, n, flags));
      const Result& r = results.back();
      std::printf("case %s N=%d: join %s, views %s, RPC/s %s, store CPU %s (%s us/call), sim CPU "
                  "%s, loss %s, epoch %s\n",
                  r.store.c_str(), r.n, r.join_all.c_str(), r.views.c_str(), r.rps.c_str(),
                  r.store_cpu.c_str(), r.us_per_beat.c_str(), r.sim_cpu.c_str(),
                  r.loss_seen.c_str(), r.epoch_advanced.c_str());
      for (const auto& note : r.notes) std::printf("  - %s\n", note.c_str());
      std::fflush(stdout);
    }
  }
  std::printf(
      "\n| store | N | join all (s) | views complete (s) | RPC/s | store CPU (%% of a core) | "
      "store us/call | sim CPU | loss seen (s) | epoch advanced (s) |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n");
  for (const Result& r : results) {
    std::printf("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.store.c_str(), r.n,
                r.join_all.c_str(), r.views.c_str(), r.rps.c_str(), r.store_cpu.c_str(),
                r.us_per_beat.c_str(), r.sim_cpu.c_str(), r.loss_seen.c_str(),
                r.epoch_advanced.c_str());
  }
  std::fflush(stdout);
  KillAllChildren();
  // 3: some case did not join every node or see the crash (its row says how).
  for (const Result& r : results) {
    if (!std::isdigit(static_cast<unsigned char>(r.join_all[0])) ||
        !std::isdigit(static_cast<unsigned char>(r.loss_seen[0]))) {
      return 3;
    }
  }
  return 0;
}

}  // namespace
}  // namespace hsdp

int main(int argc, char** argv) { return hsdp::Main(argc, argv); }
