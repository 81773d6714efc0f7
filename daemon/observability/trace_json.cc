#include "daemon/observability/trace_json.h"

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "hsdp/types.h"

namespace hsdp {
namespace {

constexpr int kEnginePid = 1;
constexpr int kMaxLanes = 16;

using OpKey = std::tuple<uint32_t, uint32_t, uint64_t>;      // group, epoch, seq
using MemberKey = std::tuple<uint32_t, uint64_t, uint64_t>;  // group, session, op id

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// One slice (with its children) waiting for a lane on a track.
struct Unit {
  int64_t start = 0;
  int64_t end = 0;
  std::function<void(int lane)> render;
};

class Writer {
 public:
  Writer(int64_t from_ns) : from_ns_(from_ns) {}

  std::string Us(int64_t ns) const { return absl::StrFormat("%.3f", (ns - from_ns_) / 1e3); }

  void Add(const std::string& event) {
    absl::StrAppend(&out_, first_ ? "\n" : ",\n", event);
    first_ = false;
  }
  void Slice(int pid, int64_t tid, const std::string& name, const char* cat, int64_t start,
             int64_t end, const std::string& args) {
    Add(absl::StrCat("{\"ph\":\"X\",\"pid\":", pid, ",\"tid\":", tid,
                     ",\"name\":", JsonString(name), ",\"cat\":\"", cat, "\",\"ts\":", Us(start),
                     ",\"dur\":", absl::StrFormat("%.3f", std::max<int64_t>(0, end - start) / 1e3),
                     ",\"args\":{", args, "}}"));
  }
  void Instant(int pid, int64_t tid, const std::string& name, int64_t ts, const std::string& args) {
    Add(absl::StrCat("{\"ph\":\"i\",\"s\":\"t\",\"pid\":", pid, ",\"tid\":", tid,
                     ",\"name\":", JsonString(name), ",\"cat\":\"straggler\",\"ts\":", Us(ts),
                     ",\"args\":{", args, "}}"));
  }
  void Meta(const char* what, int pid, int64_t tid, const std::string& name) {
    Add(absl::StrCat("{\"ph\":\"M\",\"pid\":", pid, ",\"tid\":", tid, ",\"name\":\"", what,
                     "\",\"args\":{\"name\":", JsonString(name), "}}"));
  }
  void SortIndex(int pid, int64_t tid, int64_t index) {
    Add(absl::StrCat("{\"ph\":\"M\",\"pid\":", pid, ",\"tid\":", tid,
                     ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":", index, "}}"));
  }
  std::string Take() { return std::move(out_); }

 private:
  const int64_t from_ns_;
  std::string out_;
  bool first_ = true;
};

// Places `units` in as few lanes as needed so none overlap within a lane,
// calling each unit's render with its lane; returns the lanes used.
int AssignLanes(std::vector<Unit>& units) {
  std::sort(units.begin(), units.end(),
            [](const Unit& a, const Unit& b) { return a.start < b.start; });
  std::vector<int64_t> lane_end;
  for (Unit& u : units) {
    int lane = -1;
    for (size_t i = 0; i < lane_end.size(); ++i) {
      if (lane_end[i] <= u.start) {
        lane = static_cast<int>(i);
        break;
      }
    }
    if (lane < 0) {
      if (lane_end.size() < kMaxLanes) {
        lane = static_cast<int>(lane_end.size());
        lane_end.push_back(0);
      } else {
        lane = kMaxLanes - 1;
      }
    }
    lane_end[lane] = std::max(lane_end[lane], u.end);
    u.render(lane);
  }
  return static_cast<int>(lane_end.size());
}

std::string OpNameOf(uint8_t collective) {
  return std::string(CollectiveName(static_cast<Collective>(collective)));
}

std::string LaneSuffix(int lane) { return lane == 0 ? "" : absl::StrCat(" #", lane + 1); }

}  // namespace

std::string RenderChromeTrace(const TraceSnapshot& snap, int64_t from_ns, int64_t to_ns,
                              TraceSummary* summary) {
  std::map<OpKey, const TraceEvent*> matched, launched;
  std::map<OpKey, int64_t> op_done;  // first completion of the op
  std::map<MemberKey, const TraceEvent*> completed;
  std::vector<const TraceEvent*> arrivals;
  for (const TraceEvent& e : snap.events) {
    const OpKey op{e.group_id, e.epoch, e.seq};
    switch (e.kind) {
      case TraceEventKind::kArrival:
        arrivals.push_back(&e);
        break;
      case TraceEventKind::kMatched:
        matched[op] = &e;
        break;
      case TraceEventKind::kLaunched:
        launched[op] = &e;
        break;
      case TraceEventKind::kCompleted: {
        completed[{e.group_id, e.session_id, e.op_id}] = &e;
        auto [it, inserted] = op_done.emplace(op, e.ts_ns);
        if (!inserted) it->second = std::min(it->second, e.ts_ns);
        break;
      }
    }
  }

  // Processes: the engine, then one per job.
  // A job is its owner plus its name: two uids' same-named jobs (only root
  // and the daemon's uid see both) get a process each.
  std::map<std::pair<std::string, uint32_t>, int> job_pid;
  std::map<std::string, int> owners_of_name;
  for (const auto& [gid, g] : snap.groups) {
    if (job_pid.emplace(std::make_pair(g.job_id, g.uid), 0).second) ++owners_of_name[g.job_id];
  }
  int next_pid = kEnginePid + 1;
  for (auto& [job, pid] : job_pid) pid = next_pid++;
  auto group_of = [&](uint32_t gid) -> const TraceGroupInfo& {
    static const TraceGroupInfo kUnknown;
    auto it = snap.groups.find(gid);
    return it == snap.groups.end() ? kUnknown : it->second;
  };
  auto op_args = [&](const TraceEvent& e) {
    const TraceGroupInfo& g = group_of(e.group_id);
    return absl::StrCat("\"job\":", JsonString(g.job_id), ",\"group\":", e.group_id,
                        ",\"group_size\":", g.size, ",\"op\":\"", OpNameOf(e.collective),
                        e.phase2 ? "\",\"phase\":\"all_reduce\"" : "\"", ",\"dtype\":\"",
                        e.dtype == 0 ? std::string("none")
                                     : std::string(DataTypeName(static_cast<DataType>(e.dtype))),
                        "\",\"bytes\":", e.bytes, ",\"seq\":", e.seq, ",\"epoch\":", e.epoch);
  };

  Writer w(from_ns);
  TraceSummary sum;
  // Session tracks: (pid, session) -> units; their names.
  std::map<std::pair<int, uint64_t>, std::vector<Unit>> session_units;
  std::map<std::pair<int, uint64_t>, int> session_rank;
  for (const TraceEvent* a : arrivals) {
    const OpKey op{a->group_id, a->epoch, a->seq};
    const int pid = job_pid[{group_of(a->group_id).job_id, group_of(a->group_id).uid}];
    auto cit = completed.find({a->group_id, a->session_id, a->op_id});
    const TraceEvent* done = cit == completed.end() ? nullptr : cit->second;
    const TraceEvent* m = matched.count(op) ? matched[op] : nullptr;
    const TraceEvent* l = launched.count(op) ? launched[op] : nullptr;
    if (done != nullptr && done->status_code != 0) {
      // A refused or failed member op: the match/launch under this key (if
      // any) may be a different submission.
      if (m != nullptr && m->ts_ns > done->ts_ns) m = nullptr;
      if (l != nullptr && l->ts_ns > done->ts_ns) l = nullptr;
    }
    const int64_t end = done != nullptr ? done->ts_ns : to_ns;
    session_rank[{pid, a->session_id}] = a->rank;
    Unit u;
    u.start = a->ts_ns;
    u.end = end;
    u.render = [&w, &op_args, a, m, l, done, end, pid](int lane) {
      const int64_t tid = static_cast<int64_t>(a->session_id) * kMaxLanes + lane;
      std::string args = absl::StrCat(op_args(*a), ",\"rank\":", a->rank, ",\"op_id\":", a->op_id);
      if (done == nullptr) {
        absl::StrAppend(&args, ",\"incomplete\":true");
      } else {
        absl::StrAppend(&args, ",\"status\":\"",
                        absl::StatusCodeToString(static_cast<absl::StatusCode>(done->status_code)),
                        "\"");
      }
      w.Slice(pid, tid, absl::StrCat(OpNameOf(a->collective), " seq ", a->seq), "op", a->ts_ns, end,
              args);
      int64_t t = a->ts_ns;
      if (m != nullptr && m->ts_ns >= t && m->ts_ns <= end) {
        w.Slice(pid, tid, "wait for peers", "phase", t, m->ts_ns,
                absl::StrCat(op_args(*a), ",\"last_rank\":", m->rank,
                             ",\"others_waited_ms\":", absl::StrFormat("%.3f", m->value_ns / 1e6)));
        t = m->ts_ns;
        if (l != nullptr && l->ts_ns >= t && l->ts_ns <= end) {
          w.Slice(pid, tid, "queued", "phase", t, l->ts_ns, op_args(*a));
          t = l->ts_ns;
          w.Slice(pid, tid, "executing", "phase", t, end,
                  absl::StrCat(op_args(*a), ",\"ticket\":", l->ticket));
        }
      }
    };
    session_units[{pid, a->session_id}].push_back(std::move(u));
    ++sum.member_ops;
  }
  // Straggler instants go on lane 0 of the last member's track.
  for (const auto& [op, m] : matched) {
    if (m->value_ns <= 0) continue;
    const int pid = job_pid[{group_of(m->group_id).job_id, group_of(m->group_id).uid}];
    w.Instant(pid, static_cast<int64_t>(m->session_id) * kMaxLanes, "arrived last", m->ts_ns,
              absl::StrCat(op_args(*m), ",\"rank\":", m->rank,
                           ",\"others_waited_ms\":", absl::StrFormat("%.3f", m->value_ns / 1e6)));
    session_rank.emplace(std::make_pair(pid, m->session_id), m->rank);
  }
  for (auto& [track, units] : session_units) {
    const auto [pid, session] = track;
    const int lanes = AssignLanes(units);
    for (int lane = 0; lane < lanes; ++lane) {
      const int64_t tid = static_cast<int64_t>(session) * kMaxLanes + lane;
      w.Meta(
          "thread_name", pid, tid,
          absl::StrCat("rank ", session_rank[track], " (session ", session, ")", LaneSuffix(lane)));
      w.SortIndex(pid, tid, int64_t{session_rank[track]} * kMaxLanes + lane);
    }
  }
  for (const auto& [job, pid] : job_pid) {
    w.Meta("process_name", pid, 0,
           owners_of_name[job.first] > 1 ? absl::StrCat("job ", job.first, " (uid ", job.second, ")")
                                         : absl::StrCat("job ", job.first));
  }

  // The engine track.
  std::vector<Unit> engine_units;
  for (const auto& [op, l] : launched) {
    auto dit = op_done.find(op);
    const int64_t end = dit != op_done.end() && dit->second >= l->ts_ns ? dit->second : to_ns;
    const bool incomplete = dit == op_done.end();
    Unit u;
    u.start = l->ts_ns;
    u.end = end;
    // l by an init-capture: clang before 16 cannot capture a structured binding.
    u.render = [&w, &op_args, l = l, end, incomplete](int lane) {
      w.Slice(kEnginePid, lane + 1,
              absl::StrCat(OpNameOf(l->collective), " group ", l->group_id, " seq ", l->seq),
              "engine", l->ts_ns, end,
              absl::StrCat(op_args(*l), ",\"ticket\":", l->ticket,
                           incomplete ? ",\"incomplete\":true" : ""));
    };
    engine_units.push_back(std::move(u));
    ++sum.ops;
  }
  const int engine_lanes = AssignLanes(engine_units);
  w.Meta("process_name", kEnginePid, 0, "hsdpd engine");
  for (int lane = 0; lane < std::max(engine_lanes, 1); ++lane) {
    w.Meta("thread_name", kEnginePid, lane + 1, absl::StrCat("engine", LaneSuffix(lane)));
  }
  if (summary != nullptr) *summary = sum;
  return absl::StrCat("{\"displayTimeUnit\":\"ms\",\"otherData\":{\"from_monotonic_ns\":", from_ns,
                      ",\"to_monotonic_ns\":", to_ns, ",\"overwritten_events\":", snap.overwritten,
                      "},\"traceEvents\":[", w.Take(), "\n]}\n");
}

}  // namespace hsdp
