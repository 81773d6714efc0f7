#include "daemon/observability/observability_rpc.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "daemon/observability/trace_json.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

constexpr double kMaxTraceSeconds = 3600;

absl::Status CheckSeconds(const char* field, double v) {
  if (!std::isfinite(v) || v < 0 || v > kMaxTraceSeconds) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": ", v, " is outside [0, ", kMaxTraceSeconds, "] seconds"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status HandleTrace(Observability& obs, const v1::TraceRequest& req,
                         std::optional<uint32_t> only_uid, v1::TraceResponse* resp) {
  if (absl::Status s = CheckSeconds("record_seconds", req.record_seconds()); !s.ok()) return s;
  if (absl::Status s = CheckSeconds("window_seconds", req.window_seconds()); !s.ok()) return s;
  TraceRing& ring = obs.trace();
  if (ring.capacity() == 0) {
    return absl::FailedPreconditionError(
        "tracing is off on this hsdpd (trace.buffer_events: 0 in its node config)");
  }
  const int64_t now = shm::NowNanos();
  if (req.record_seconds() > 0) {
    ring.Arm(now, static_cast<int64_t>(req.record_seconds() * 1e9));
  }
  if (req.window_seconds() > 0) {
    const int64_t from = now - static_cast<int64_t>(req.window_seconds() * 1e9);
    const TraceSnapshot snap = ring.Window(
        from, now, only_uid.has_value() ? int64_t{*only_uid} : int64_t{-1}, req.job_id());
    TraceSummary summary;
    resp->set_trace_json(RenderChromeTrace(snap, from, now, &summary));
    resp->set_events(snap.events.size());
    resp->set_member_ops(summary.member_ops);
    resp->set_ops(summary.ops);
    resp->set_overwritten(snap.overwritten);
  }
  const int64_t until = ring.armed_until_ns();
  resp->set_recording_seconds_left(until > now ? (until - now) / 1e9 : 0);
  resp->set_capacity(ring.capacity());
  return absl::OkStatus();
}

void HandleStragglers(const Observability& obs, const v1::StragglersRequest& req,
                      std::optional<uint32_t> only_uid, v1::StragglersResponse* resp) {
  const int64_t now = shm::NowNanos();
  std::vector<const StragglerRankReport*> ranks;
  const std::vector<StragglerJobReport> jobs = obs.stragglers().Report(req.job_id(), only_uid);
  for (const StragglerJobReport& j : jobs) {
    v1::StragglerJob* pj = resp->add_jobs();
    pj->set_job_id(j.job_id);
    pj->set_owner_uid(j.owner_uid);
    pj->set_ops_matched(j.ops_matched);
    for (const StragglerRankReport& r : j.ranks) ranks.push_back(&r);
  }
  std::stable_sort(ranks.begin(), ranks.end(), [](const auto* a, const auto* b) {
    return a->waited_ns_total > b->waited_ns_total;
  });
  for (const StragglerRankReport* r : ranks) {
    v1::StragglerRank* pr = resp->add_ranks();
    pr->set_job_id(r->job_id);
    pr->set_owner_uid(r->owner_uid);
    pr->set_rank(r->rank);
    pr->set_times_last(r->times_last);
    pr->set_waited_seconds_total(r->waited_ns_total / 1e9);
    pr->set_p50_seconds(r->p50_ns / 1e9);
    pr->set_p90_seconds(r->p90_ns / 1e9);
    pr->set_p99_seconds(r->p99_ns / 1e9);
    pr->set_max_seconds(r->max_ns / 1e9);
    for (const StragglerEvent& e : r->recent) {
      v1::StragglerOp* po = pr->add_recent();
      po->set_event_id(e.event_id);
      po->set_group_id(e.group_id);
      po->set_op(std::string(e.op));
      po->set_seq(e.seq);
      po->set_epoch(e.epoch);
      po->set_waited_seconds(e.waited_ns / 1e9);
      po->set_age_seconds(std::max<int64_t>(0, now - e.mono_ns) / 1e9);
    }
  }
}

NodeGauges CollectNodeGauges(const SessionManager& sessions) {
  NodeGauges g;
  std::map<JobKey, NodeGauges::Job> jobs;  // two uids' same-named jobs apart
  for (const std::shared_ptr<Session>& s : sessions.Snapshot()) {
    ++g.sessions;
    NodeGauges::Job& j = jobs[s->info().job()];
    j.job_id = s->info().job_id;
    j.owner_uid = s->info().owner_uid;
    j.ranks.push_back(s->info().rank);
    const uint64_t in_flight = static_cast<uint64_t>(std::max<int64_t>(0, s->ops_in_flight()));
    j.ops_in_flight += in_flight;
    const uint32_t slots = s->channel().ring_entries();
    if (slots > 0) j.ring_occupancy = std::max(j.ring_occupancy, double(in_flight) / slots);
  }
  for (const JobSummary& s : sessions.Jobs(std::nullopt)) {
    auto it = jobs.find(JobKey{s.owner_uid, s.job_id});
    if (it == jobs.end()) continue;
    it->second.priority_class = s.priority_class;
    it->second.priority_level = s.priority_level;
  }
  const std::vector<std::shared_ptr<Group>> groups = sessions.AllGroups();
  for (const std::shared_ptr<Group>& grp : groups) {
    g.group_ids.push_back(grp->id());
    auto it = jobs.find(grp->job());
    if (it != jobs.end()) it->second.arena_ops += grp->ArenaOpsCompleted();
  }
  for (auto& [name, j] : jobs) g.jobs.push_back(std::move(j));
  g.groups = groups.size();
  g.registered_bytes = sessions.bytes_registered();
  g.registered_bytes_limit = sessions.max_node_bytes();
  return g;
}

void HandleActivity(const Observability& obs, const SessionManager& sessions,
                    std::optional<uint32_t> only_uid, v1::ActivityResponse* resp) {
  // Keyed by the whole job key: two users' same-named jobs never mix.
  std::map<JobKey, v1::JobActivity*> by_job;
  for (const JobSummary& j : sessions.Jobs(only_uid)) {
    v1::JobActivity* pj = resp->add_jobs();
    pj->set_job_id(j.job_id);
    pj->set_owner_uid(j.owner_uid);
    pj->set_attached_ranks(j.attached);
    pj->set_world_size(j.world_size);
    pj->set_slowest_rank(-1);
    pj->set_priority_class(j.priority_class);
    pj->set_priority_level(j.priority_level);
    by_job[JobKey{j.owner_uid, j.job_id}] = pj;
  }
  // Totals of attached jobs (ended jobs are not shown).
  for (const JobActivity& a : obs.Activity(only_uid)) {
    auto it = by_job.find(JobKey{a.uid, a.job_id});
    if (it == by_job.end()) continue;
    it->second->set_ops_completed(a.ops_completed);
    it->second->set_ops_failed(a.ops_failed);
    it->second->set_bytes(a.bytes);
    it->second->set_busy_seconds(a.busy_ns / 1e9);
    it->second->set_engine_wait_seconds(a.engine_wait_ns / 1e9);
  }
  for (const std::shared_ptr<Group>& g : sessions.AllGroups()) {
    auto it = by_job.find(g->job());
    if (it == by_job.end()) continue;
    const GroupStats st = g->stats();
    v1::GroupActivity* pg = it->second->add_groups();
    pg->set_group_id(g->id());
    pg->set_size(g->size());
    pg->set_epoch(st.epoch);
    pg->set_broken(st.broken);
    pg->set_pending(st.pending);
    pg->set_running(st.running);
  }
  for (const StragglerJobReport& j : obs.stragglers().Report("", only_uid)) {
    auto it = by_job.find(JobKey{j.owner_uid, j.job_id});
    if (it == by_job.end() || j.ranks.empty()) continue;
    it->second->set_slowest_rank(j.ranks.front().rank);
    it->second->set_slowest_rank_waited_seconds(j.ranks.front().waited_ns_total / 1e9);
  }
}

}  // namespace hsdp
