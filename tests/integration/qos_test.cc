// Classes of service through a real hsdpd (node.yaml jobs.priority_classes):
// each job gets the class its name and owner match, or a lower one it asks
// for; `hsdpctl jobs`, `hsdpctl top` and the Activity RPC show the class, the
// job's share of the engine and its queueing delay; a class that does not
// exist or is above the job's own is refused with a clear error, and the
// refused attach leaves nothing behind.
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"
#include "observability_util.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/v1/admin.grpc.pb.h"

namespace hsdp {
namespace {

using testing::Child;
using testing::DaemonProcess;
using ::testing::HasSubstr;
using testing::TempDir;
using testing::Workload;

// Every operation through the daemon: its scheduling is what these tests
// watch (small operations would run in the groups' arenas, among the ranks).
constexpr char kConfig[] = R"yaml(
data_plane:
  small_op_bytes: 0
engine:
  threads: 1
  inline_max_bytes: 4KiB
jobs:
  priority_classes:
    - {name: interactive, level: 1, jobs: ["infer-*"]}
    - {name: batch, level: 6, jobs: ["train-*"]}
)yaml";

absl::Status AttachAs(const std::string& socket, const std::string& job,
                      const std::string& cls) {
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = job;
  o.priority_class = cls;
  return Client::Connect(o).status();
}

TEST(QosTest, JobsGetTheirClassAndShowTheirShareAndQueueingDelay) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(kConfig)) << d.Log();
  // Three jobs at once on one engine thread, with ops above the inline size
  // so that they queue: the interactive one with latency-critical ops, a
  // batch one, and one that asks for "default" (level 4, below nothing it
  // matches: "other-*" matches no class).
  std::vector<Workload> loads(3);
  const char* jobs[] = {"infer-a", "train-b", "other-c"};
  for (int i = 0; i < 3; ++i) {
    loads[i].socket = d.socket();
    loads[i].job = jobs[i];
    loads[i].world = 2;
    loads[i].all_reduces = 20;
    loads[i].count = 256 * 1024;  // 1 MiB per rank
    loads[i].hold_file = dir.File("release");
  }
  loads[0].latency_critical = true;
  loads[2].priority_class = "default";
  std::vector<std::vector<std::unique_ptr<Child>>> ranks(3);
  std::string why;
  for (int i = 0; i < 3; ++i) {
    for (int r = 0; r < 2; ++r) {
      const Workload w = loads[i];
      ranks[i].push_back(
          std::make_unique<Child>([w, r](FILE* out) { return testing::RunRank(w, r, out); }));
    }
  }
  for (auto& job : ranks) {
    for (auto& c : job) ASSERT_TRUE(c->WaitFor("done\n", 60000)) << c->output() << d.Log();
  }

  const auto listed = testing::RunCommand(testing::Hsdpctl(d.socket(), "jobs"));
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, HasSubstr("CLASS"));
  EXPECT_THAT(listed.output, HasSubstr("interactive(1)"));
  EXPECT_THAT(listed.output, HasSubstr("batch(6)"));
  EXPECT_THAT(listed.output, HasSubstr("default(4)"));

  // Activity: the class, and the engine time and queueing delay of each job.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto admin = v1::Admin::NewStub(grpc::CreateCustomChannel(
      "unix:" + d.socket(), grpc::InsecureChannelCredentials(), args));
  grpc::ClientContext ctx;
  v1::ActivityResponse act;
  ASSERT_TRUE(admin->Activity(&ctx, v1::ActivityRequest(), &act).ok());
  ASSERT_EQ(act.jobs_size(), 3);
  for (const auto& j : act.jobs()) {
    EXPECT_EQ(j.ops_completed(), 20u) << j.job_id();
    EXPECT_GT(j.busy_seconds(), 0) << j.job_id();
    EXPECT_GE(j.engine_wait_seconds(), 0) << j.job_id();
    if (j.job_id() == "infer-a") EXPECT_EQ(j.priority_class(), "interactive");
    if (j.job_id() == "train-b") EXPECT_EQ(j.priority_level(), 6u);
    if (j.job_id() == "other-c") EXPECT_EQ(j.priority_class(), "default");
  }

  const auto top = testing::RunCommand(testing::Hsdpctl(d.socket(), "top --interval 0.2"));
  EXPECT_EQ(top.exit_code, 0) << top.output;
  EXPECT_THAT(top.output, HasSubstr("SHARE"));
  EXPECT_THAT(top.output, HasSubstr("WAIT/OP"));
  EXPECT_THAT(top.output, HasSubstr("interactive(1)"));
  testing::WriteFile(dir.File("release"), "");
  for (auto& job : ranks) {
    for (auto& c : job) EXPECT_EQ(c->Finish(20000), 0) << c->output();
  }
}

TEST(QosTest, AClassAboveTheJobsOwnOrUnknownIsRefusedAndLeavesNothing) {
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(kConfig)) << d.Log();
  absl::Status s = AttachAs(d.socket(), "train-x", "interactive");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("\"batch\" (level 6)"), HasSubstr("\"interactive\" is level 1")));
  s = AttachAs(d.socket(), "train-x", "gold");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("known: interactive, batch, default"));
  s = AttachAs(d.socket(), "train-x", "Not A Name");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  const auto listed = testing::RunCommand(testing::Hsdpctl(d.socket(), "jobs"));
  EXPECT_EQ(listed.exit_code, 0) << listed.output;
  EXPECT_THAT(listed.output, ::testing::Not(HasSubstr("train-x")));
  // A lower class than its own is granted.
  EXPECT_TRUE(AttachAs(d.socket(), "infer-y", "batch").ok());
}

TEST(QosTest, AJobOverItsOpsInFlightIsRefusedAndItsPeersFailAtOnce) {
  // limits.max_job_ops_in_flight 4 for a job of two ranks: rank 0 submits 5
  // all-reduces before rank 1 submits any (its 5th takes the job to 5), then
  // rank 1 submits its 5. The operations that found the job over the limit
  // fail RESOURCE_EXHAUSTED naming the job and the limit, on both ranks and at
  // once (no collective timeout); the others complete; another job is not
  // affected; and once all completed the job runs again.
  TempDir dir;
  DaemonProcess d(dir);
  ASSERT_TRUE(d.Start(std::string(testing::kDaemonPathOnly) +
                      "limits:\n  max_job_ops_in_flight: 4\ntimeouts:\n  collective_ms: 60000\n"))
      << d.Log();
  auto connect = [&](const std::string& job, int rank, int world) {
    ClientOptions o;
    o.socket_path = d.socket();
    o.job_id = job;
    o.rank = rank;
    o.world_size = world;
    return Client::Connect(o);
  };
  auto c0 = connect("busy", 0, 2);
  auto c1 = connect("busy", 1, 2);
  ASSERT_TRUE(c0.ok() && c1.ok()) << c0.status() << c1.status();
  absl::StatusOr<Group> g0, g1;
  std::thread t([&] { g1 = (*c1)->NewGroup({0, 1}); });
  g0 = (*c0)->NewGroup({0, 1});
  t.join();
  ASSERT_TRUE(g0.ok() && g1.ok()) << g0.status() << g1.status();
  auto b0 = (*c0)->AllocateBuffer(4096);
  auto b1 = (*c1)->AllocateBuffer(4096);
  ASSERT_TRUE(b0.ok() && b1.ok());
  std::vector<Work> w0, w1;
  for (int i = 0; i < 5; ++i) {
    auto w = (*c0)->AllReduce(*g0, {b0->id, 0}, {b0->id, 0}, 16, DataType::kFloat32);
    ASSERT_TRUE(w.ok()) << w.status();
    w0.push_back(*w);
  }
  // All 5 reached the daemon: each waits there for rank 1 or was already
  // refused (over the job's limit).
  auto handled = [&] {
    int64_t n = testing::OpsInDaemon(d.socket(), "busy");
    for (Work& w : w0) n += w.Test();
    return n;
  };
  ASSERT_EQ(testing::EventuallyEq(handled, int64_t{5}, 10000), 5) << d.Log();
  for (int i = 0; i < 5; ++i) {
    auto w = (*c1)->AllReduce(*g1, {b1->id, 0}, {b1->id, 0}, 16, DataType::kFloat32);
    ASSERT_TRUE(w.ok()) << w.status();
    w1.push_back(*w);
  }
  int refused = 0;
  for (auto* works : {&w0, &w1}) {
    for (Work& w : *works) {
      absl::Status s = w.Wait(absl::Seconds(20));
      if (s.ok()) continue;
      ++refused;
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      EXPECT_THAT(std::string(s.message()), AllOf(HasSubstr("job \"busy\""),
                                                  HasSubstr("limits.max_job_ops_in_flight")));
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_EQ(refused % 2, 0) << "an operation fails on both ranks or on neither";
  // Another job runs meanwhile, and this one again once it is under the limit.
  auto other = connect("other", 0, 1);
  ASSERT_TRUE(other.ok()) << other.status();
  auto og = (*other)->NewGroup({0});
  auto ob = (*other)->AllocateBuffer(4096);
  ASSERT_TRUE(og.ok() && ob.ok());
  auto ow = (*other)->AllReduce(*og, {ob->id, 0}, {ob->id, 0}, 16, DataType::kFloat32);
  ASSERT_TRUE(ow.ok());
  EXPECT_TRUE(ow->Wait(absl::Seconds(20)).ok());
  auto a = (*c0)->AllReduce(*g0, {b0->id, 0}, {b0->id, 0}, 16, DataType::kFloat32);
  auto b = (*c1)->AllReduce(*g1, {b1->id, 0}, {b1->id, 0}, 16, DataType::kFloat32);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_TRUE(a->Wait(absl::Seconds(20)).ok());
  EXPECT_TRUE(b->Wait(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace hsdp
