// hsdpctl top [--interval S] [--iterations N]: a refreshing view of the
// node — per job: attached ranks, groups (and broken ones), operation rate,
// bandwidth (per-rank buffer bytes per second), its class of service, its
// share of the engine time used in the interval and its operations' mean
// queueing delay inside the engine, failures, queued work and the most
// waited-for rank. When stdout is not a terminal
// it prints one snapshot (rates over one interval) and exits.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "commands.h"

namespace hsdpctl {
namespace {

struct Sample {
  hsdp::v1::StatusResponse status;
  hsdp::v1::ActivityResponse activity;
  std::chrono::steady_clock::time_point at;
};

grpc::Status Take(Context& c, Sample* s) {
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx, c);
    grpc::Status st = c.admin->Status(&ctx, hsdp::v1::StatusRequest(), &s->status);
    if (!st.ok()) return st;
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx, c);
  s->at = std::chrono::steady_clock::now();
  return c.admin->Activity(&ctx, hsdp::v1::ActivityRequest(), &s->activity);
}

std::string Rate(double bytes_per_s) {
  char buf[32];
  if (bytes_per_s >= 1e9) {
    std::snprintf(buf, sizeof(buf), "%.2f GB/s", bytes_per_s / 1e9);
  } else if (bytes_per_s >= 1e6) {
    std::snprintf(buf, sizeof(buf), "%.2f MB/s", bytes_per_s / 1e6);
  } else {
    std::snprintf(buf, sizeof(buf), "%.1f KB/s", bytes_per_s / 1e3);
  }
  return buf;
}

void Print(const Sample& prev, const Sample& now, bool clear) {
  const double dt = std::max(1e-3, std::chrono::duration<double>(now.at - prev.at).count());
  // By (job id, owner): two users' jobs of one id are two jobs.
  std::map<std::pair<std::string, uint32_t>, const hsdp::v1::JobActivity*> before;
  for (const auto& j : prev.activity.jobs()) before[{j.job_id(), j.owner_uid()}] = &j;
  if (clear) std::printf("\033[H\033[2J");
  const auto& st = now.status;
  std::printf(
      "hsdpd %s on %s  up %.0f s  sessions %d  jobs %d  ops %llu  failed %llu  "
      "registered %.1f MiB%s%s\n\n",
      st.version().c_str(), st.node_name().c_str(), st.uptime_seconds(), st.sessions_size(),
      now.activity.jobs_size(), static_cast<unsigned long long>(st.ops_completed()),
      static_cast<unsigned long long>(st.ops_failed()), st.bytes_registered() / 1048576.0,
      st.metrics_address().empty() ? "" : "  metrics http://",
      st.metrics_address().empty() ? "" : (st.metrics_address() + "/metrics").c_str());
  std::printf("%-24s %-14s %7s %9s %9s %12s %6s %10s %10s %8s %7s  %s\n", "JOB", "CLASS",
              "RANKS", "GROUPS", "OPS/s", "BANDWIDTH", "SHARE", "WAIT/OP", "OPS", "FAILED",
              "QUEUED", "SLOWEST RANK (waited)");
  // SHARE: the job's part of the engine time all jobs used in the interval.
  double busy_all = 0;
  for (const auto& j : now.activity.jobs()) {
    const auto it = before.find({j.job_id(), j.owner_uid()});
    busy_all += std::max(0.0, j.busy_seconds() - (it == before.end() ? 0.0
                                                                     : it->second->busy_seconds()));
  }
  for (const auto& j : now.activity.jobs()) {
    const auto it = before.find({j.job_id(), j.owner_uid()});
    const hsdp::v1::JobActivity zero;
    const hsdp::v1::JobActivity& p = it == before.end() ? zero : *it->second;
    const double ops_s = (j.ops_completed() - std::min(j.ops_completed(), p.ops_completed())) / dt;
    const double bytes_s = (j.bytes() - std::min(j.bytes(), p.bytes())) / dt;
    const double busy = std::max(0.0, j.busy_seconds() - p.busy_seconds());
    const double share = busy_all > 0 ? busy / busy_all : 0;
    const uint64_t ops = j.ops_completed() - std::min(j.ops_completed(), p.ops_completed());
    // Mean engine queueing delay of the interval's operations.
    const double wait = ops > 0 ? std::max(0.0, j.engine_wait_seconds() - p.engine_wait_seconds()) /
                                      static_cast<double>(ops)
                                : 0.0;
    int broken = 0;
    uint64_t queued = 0;
    for (const auto& g : j.groups()) {
      broken += g.broken();
      queued += g.pending() + g.running();
    }
    char ranks[32], groups[32], slowest[64];
    std::snprintf(ranks, sizeof(ranks), "%d/%d", j.attached_ranks(), j.world_size());
    std::snprintf(groups, sizeof(groups), broken ? "%d (%d!)" : "%d", j.groups_size(), broken);
    if (j.slowest_rank() >= 0) {
      std::snprintf(slowest, sizeof(slowest), "rank %d (%.3f s)", j.slowest_rank(),
                    j.slowest_rank_waited_seconds());
    } else {
      std::snprintf(slowest, sizeof(slowest), "-");
    }
    char cls[48], wait_s[24];
    std::snprintf(cls, sizeof(cls), "%s(%u)", j.priority_class().c_str(), j.priority_level());
    if (wait >= 1e-3) {
      std::snprintf(wait_s, sizeof(wait_s), "%.2f ms", wait * 1e3);
    } else {
      std::snprintf(wait_s, sizeof(wait_s), "%.0f us", wait * 1e6);
    }
    std::printf("%-24s %-14s %7s %9s %9.1f %12s %5.0f%% %10s %10llu %8llu %7llu  %s\n",
                j.job_id().c_str(), cls, ranks, groups, ops_s, Rate(bytes_s).c_str(), share * 100,
                wait_s,
                static_cast<unsigned long long>(j.ops_completed()),
                static_cast<unsigned long long>(j.ops_failed()),
                static_cast<unsigned long long>(queued), slowest);
  }
  if (now.activity.jobs_size() == 0) std::printf("(no jobs attached)\n");
  std::fflush(stdout);
}

}  // namespace

int RunTop(Context& c) {
  if (!(c.interval_s > 0) || c.interval_s > 3600) {
    std::fprintf(stderr, "hsdpctl: top: --interval must be in (0, 3600]\n");
    return 2;
  }
  const bool tty = ::isatty(STDOUT_FILENO) == 1;
  const int iterations = tty ? c.iterations : 1;
  Sample prev;
  if (grpc::Status s = Take(c, &prev); !s.ok()) return Fail(c, s);
  for (int i = 0; iterations == 0 || i < iterations; ++i) {
    std::this_thread::sleep_for(std::chrono::duration<double>(c.interval_s));
    Sample now;
    if (grpc::Status s = Take(c, &now); !s.ok()) return Fail(c, s);
    Print(prev, now, tty);
    prev = std::move(now);
  }
  return 0;
}

}  // namespace hsdpctl
