// RenderChromeTrace: valid JSON in the trace-event format, one slice per
// member op with its phases nested inside, overlapping ops on extra lanes,
// engine slices, straggler instants, and unfinished ops marked incomplete.
#include "daemon/observability/trace_json.h"

#include <map>
#include <string>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "hsdp/types.h"

namespace hsdp {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr int64_t kMs = 1'000'000;

TraceEvent Ev(TraceEventKind kind, int64_t ts, uint64_t session, int rank, uint64_t seq) {
  TraceEvent e;
  e.kind = kind;
  e.ts_ns = ts;
  e.session_id = session;
  e.rank = rank;
  e.op_id = seq;
  e.seq = seq;
  e.epoch = 1;
  e.group_id = 5;
  e.collective = static_cast<uint8_t>(Collective::kAllReduce);
  e.dtype = static_cast<uint8_t>(DataType::kFloat32);
  e.bytes = 4096;
  return e;
}

// Two members (sessions 11, 12 = ranks 0, 1) and two pipelined ops: op 2
// arrives before op 1 completes. Op 2 never completes.
TraceSnapshot TwoOps() {
  TraceSnapshot s;
  s.groups[5] = TraceGroupInfo{"job \"q\"", 1000, 2};
  using K = TraceEventKind;
  s.events = {Ev(K::kArrival, 1 * kMs, 11, 0, 1),   Ev(K::kArrival, 3 * kMs, 12, 1, 1),
              Ev(K::kMatched, 3 * kMs, 12, 1, 1),   Ev(K::kLaunched, 4 * kMs, 12, 1, 1),
              Ev(K::kArrival, 5 * kMs, 11, 0, 2),   Ev(K::kArrival, 6 * kMs, 12, 1, 2),
              Ev(K::kMatched, 6 * kMs, 12, 1, 2),   Ev(K::kLaunched, 7 * kMs, 12, 1, 2),
              Ev(K::kCompleted, 8 * kMs, 11, 0, 1), Ev(K::kCompleted, 8 * kMs, 12, 1, 1)};
  s.events[2].value_ns = 2 * kMs;  // rank 1 kept rank 0 waiting 2 ms for op 1
  s.events[6].value_ns = 1 * kMs;
  return s;
}

Struct Parse(const std::string& json) {
  Struct out;
  const auto st = google::protobuf::util::JsonStringToMessage(json, &out);
  EXPECT_TRUE(st.ok()) << st.ToString() << "\n" << json;
  return out;
}

std::string Str(const Struct& s, const std::string& k) {
  auto it = s.fields().find(k);
  return it == s.fields().end() ? "" : it->second.string_value();
}
double Num(const Struct& s, const std::string& k) {
  auto it = s.fields().find(k);
  return it == s.fields().end() ? -1 : it->second.number_value();
}

TEST(TraceJsonTest, MemberSlicesNestPhasesAndPipelinedOpsGetLanes) {
  TraceSummary sum;
  const std::string json = RenderChromeTrace(TwoOps(), 0, 10 * kMs, &sum);
  EXPECT_EQ(sum.member_ops, 4u);
  EXPECT_EQ(sum.ops, 2u);
  const Struct root = Parse(json);
  const auto& events = root.fields().at("traceEvents").list_value().values();
  std::map<std::string, int> count;
  std::map<double, std::string> thread_names;  // tid -> name
  std::vector<Struct> parents, phases;
  for (const Value& v : events) {
    const Struct& e = v.struct_value();
    const std::string ph = Str(e, "ph"), name = Str(e, "name");
    ++count[ph + ":" + (ph == "M" ? name : Str(e, "cat"))];
    if (ph == "M" && name == "thread_name") {
      thread_names[Num(e, "tid")] = Str(e.fields().at("args").struct_value(), "name");
    }
    if (ph == "X" && Str(e, "cat") == "op") parents.push_back(e);
    if (ph == "X" && Str(e, "cat") == "phase") phases.push_back(e);
  }
  EXPECT_EQ(count["X:op"], 4);
  EXPECT_EQ(count["X:engine"], 2);
  EXPECT_EQ(count["i:straggler"], 2);
  EXPECT_EQ(count["X:phase"], 3 + 3 + 3 + 3);  // wait, queued, executing for each member op
  // Session 11's op 2 (arrival 5 ms) overlaps its op 1 (1..8 ms): a second lane.
  EXPECT_EQ(thread_names[11 * 16], "rank 0 (session 11)");
  EXPECT_EQ(thread_names[11 * 16 + 1], "rank 0 (session 11) #2");
  EXPECT_EQ(thread_names[12 * 16], "rank 1 (session 12)");
  for (const Struct& p : parents) {
    const Struct& args = p.fields().at("args").struct_value();
    EXPECT_EQ(Str(args, "job"), "job \"q\"");
    EXPECT_EQ(Str(args, "op"), "all_reduce");
    EXPECT_EQ(Str(args, "dtype"), "float32");
    EXPECT_EQ(Num(args, "bytes"), 4096);
    EXPECT_EQ(Num(args, "group"), 5);
    const double seq = Num(args, "seq");
    EXPECT_EQ(Str(p, "name"), seq == 1 ? "all_reduce seq 1" : "all_reduce seq 2");
    if (seq == 1) {
      EXPECT_EQ(Str(args, "status"), "OK");
      EXPECT_DOUBLE_EQ(Num(p, "ts") + Num(p, "dur"), 8000.0);
    } else {
      EXPECT_TRUE(args.fields().at("incomplete").bool_value());
      EXPECT_DOUBLE_EQ(Num(p, "ts") + Num(p, "dur"), 10000.0);  // runs to the window's end
    }
    // Every phase on the same track lies inside its parent when it overlaps it.
    for (const Struct& c : phases) {
      if (Num(c, "tid") != Num(p, "tid") ||
          Num(c.fields().at("args").struct_value(), "seq") != seq) {
        continue;
      }
      EXPECT_GE(Num(c, "ts"), Num(p, "ts"));
      EXPECT_LE(Num(c, "ts") + Num(c, "dur"), Num(p, "ts") + Num(p, "dur") + 1e-6);
    }
  }
}

// Two uids' jobs of one name (as root sees them) are two processes.
TEST(TraceJsonTest, SameNamedJobsOfTwoUidsAreTwoProcesses) {
  TraceSnapshot s;
  s.groups[5] = TraceGroupInfo{"q", 1000, 1};
  s.groups[6] = TraceGroupInfo{"q", 1001, 1};
  using K = TraceEventKind;
  TraceEvent a = Ev(K::kArrival, 1 * kMs, 11, 0, 1), b = Ev(K::kArrival, 1 * kMs, 21, 0, 1);
  b.group_id = 6;
  s.events = {a, b};
  TraceSummary sum;
  const Struct root = Parse(RenderChromeTrace(s, 0, 10 * kMs, &sum));
  std::map<std::string, double> pid_of_process;
  std::map<double, double> pid_of_op;  // tid -> pid
  for (const Value& v : root.fields().at("traceEvents").list_value().values()) {
    const Struct& e = v.struct_value();
    if (Str(e, "ph") == "M" && Str(e, "name") == "process_name") {
      pid_of_process[Str(e.fields().at("args").struct_value(), "name")] = Num(e, "pid");
    }
    if (Str(e, "ph") == "X" && Str(e, "cat") == "op") pid_of_op[Num(e, "tid")] = Num(e, "pid");
  }
  ASSERT_EQ(pid_of_process.count("job q (uid 1000)"), 1u);
  ASSERT_EQ(pid_of_process.count("job q (uid 1001)"), 1u);
  EXPECT_EQ(pid_of_op[11 * 16], pid_of_process["job q (uid 1000)"]);
  EXPECT_EQ(pid_of_op[21 * 16], pid_of_process["job q (uid 1001)"]);
}

TEST(TraceJsonTest, EmptySnapshotIsValidJson) {
  const Struct root = Parse(RenderChromeTrace(TraceSnapshot{}, 0, kMs));
  EXPECT_TRUE(root.fields().count("traceEvents"));
}

}  // namespace
}  // namespace hsdp
