// `hsdpctl trace` against a real hsdpd: the trace covers every operation run
// during the window, in Chrome trace-event JSON with a track per session and
// an engine track, phases nested in each member's slice, and the straggler
// named; nothing is recorded when nobody traces.
#include <set>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "observability_util.h"

namespace hsdp {
namespace {

using google::protobuf::Struct;
using testing::BinDir;
using testing::Child;
using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::Workload;

std::string Str(const Struct& s, const std::string& k) {
  auto it = s.fields().find(k);
  return it == s.fields().end() ? "" : it->second.string_value();
}
double Num(const Struct& s, const std::string& k) {
  auto it = s.fields().find(k);
  return it == s.fields().end() ? -1 : it->second.number_value();
}
const Struct& Args(const Struct& e) { return e.fields().at("args").struct_value(); }

TEST(ObservabilityTraceTest, TraceCoversEveryOperationOfTheWindow) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(testing::kDaemonPathOnly)) << d.Log();
  const std::string out = dir.File("trace.json");
  testing::Subprocess ctl(
      {BinDir() + "/hsdpctl", "--socket", d.socket(), "trace", "--seconds", "3", "-o", out},
      dir.File("hsdpctl.log"));
  // Recording starts with the first RPC; wait for hsdpctl to say so.
  ASSERT_TRUE(testing::Eventually(
      [&] {
        return testing::ReadFile(dir.File("hsdpctl.log")).find("tracing") != std::string::npos;
      },
      5000))
      << testing::ReadFile(dir.File("hsdpctl.log"));

  Workload w;
  w.socket = d.socket();
  w.job = "trace-job";
  w.all_reduces = 10;
  w.slow_rank = 1;
  w.delay_ms = 5;
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(RunWorkload(w, &ranks, &why)) << why;
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();
  ASSERT_EQ(ctl.Wait(15000), 0) << ctl.Log();
  EXPECT_THAT(ctl.Log(), HasSubstr("10 operations, 20 member slices"));

  Struct root;
  const std::string json = testing::ReadFile(out);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json, &root).ok()) << json;
  std::map<std::string, std::set<double>> seqs_by_rank;  // "rank N" -> seqs
  std::map<std::string, int> phases;
  std::set<std::string> thread_names, process_names;
  int engine = 0, last_rank1 = 0, instants = 0;
  std::map<double, double> parent_tid_of_rank;
  for (const auto& v : root.fields().at("traceEvents").list_value().values()) {
    const Struct& e = v.struct_value();
    const std::string ph = Str(e, "ph"), cat = Str(e, "cat"), name = Str(e, "name");
    if (ph == "M") {
      (name == "thread_name" ? thread_names : process_names).insert(Str(Args(e), "name"));
      continue;
    }
    if (ph == "i") {
      ++instants;
      last_rank1 += Num(Args(e), "rank") == 1;
      continue;
    }
    ASSERT_EQ(ph, "X") << name;
    const Struct& a = Args(e);
    EXPECT_EQ(Str(a, "job"), "trace-job");
    EXPECT_EQ(Str(a, "op"), "all_reduce");
    EXPECT_EQ(Str(a, "dtype"), "float32");
    EXPECT_EQ(Num(a, "bytes"), 4096);
    EXPECT_EQ(Num(a, "epoch"), 1);
    EXPECT_GE(Num(e, "dur"), 0);
    if (cat == "op") {
      EXPECT_EQ(name, "all_reduce seq " + std::to_string(static_cast<int>(Num(a, "seq"))));
      EXPECT_EQ(Str(a, "status"), "OK");
      seqs_by_rank["rank " + std::to_string(static_cast<int>(Num(a, "rank")))].insert(
          Num(a, "seq"));
      parent_tid_of_rank[Num(a, "rank")] = Num(e, "pid");
    } else if (cat == "phase") {
      ++phases[name];
    } else if (cat == "engine") {
      ++engine;
      EXPECT_EQ(Num(e, "pid"), 1);
    }
  }
  const std::set<double> all = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(seqs_by_rank["rank 0"], all);
  EXPECT_EQ(seqs_by_rank["rank 1"], all);
  EXPECT_EQ(phases["wait for peers"], 20);
  EXPECT_EQ(phases["queued"], 20);
  EXPECT_EQ(phases["executing"], 20);
  EXPECT_EQ(engine, 10);
  EXPECT_EQ(instants, 10);  // one straggler per op
  EXPECT_GE(last_rank1, 8) << "rank 1 sleeps 5 ms before each submission";
  EXPECT_TRUE(process_names.count("job trace-job"));
  EXPECT_TRUE(process_names.count("hsdpd engine"));
  EXPECT_EQ(std::count_if(thread_names.begin(), thread_names.end(),
                          [](const std::string& n) { return n.rfind("rank ", 0) == 0; }),
            2)
      << "one track per session";
}

TEST(ObservabilityTraceTest, NothingIsRecordedWhenNobodyTraces) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(testing::kDaemonPathOnly)) << d.Log();
  Workload w;
  w.socket = d.socket();
  w.job = "quiet-job";
  w.all_reduces = 5;
  std::vector<std::unique_ptr<Child>> ranks;
  std::string why;
  ASSERT_TRUE(RunWorkload(w, &ranks, &why)) << why;
  for (auto& r : ranks) EXPECT_EQ(r->Finish(15000), 0) << r->output();
  // Asking for the past without having armed: an empty (valid) trace.
  const auto r = testing::RunCommand(testing::Hsdpctl(d.socket(), "trace --seconds 0.2 -o -"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("0 operations, 0 member slices, 0 events"));
}

TEST(ObservabilityTraceTest, TracingOffInConfigIsAClearError) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(std::string(testing::kDaemonPathOnly) + "trace:\n  buffer_events: 0\n")) << d.Log();
  const auto r = testing::RunCommand(testing::Hsdpctl(d.socket(), "trace --seconds 1 -o -"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.output, HasSubstr("trace.buffer_events: 0"));
}

}  // namespace
}  // namespace hsdp
