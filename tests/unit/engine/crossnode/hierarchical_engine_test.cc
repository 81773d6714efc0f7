// The cross-node engine over the in-process fake transport: every
// collective, dtype class and reduce variant on 2, 3 and 4 simulated nodes
// with 1 and 2 members each, contiguous and interleaved placements, each
// compared with the flat CpuEngine result; then ordering and failures
// (composite dependencies across engines, abort, deadlines, a node killed
// mid-task, unrelated groups, new epochs, disagreeing nodes, shutdown).
#include "daemon/engine/crossnode/hierarchical_engine.h"

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/engine/crossnode/fake_transport.h"
#include "daemon/engine/cpu/cpu_engine.h"
#include "daemon/engine/peer_instances.h"
#include "common/wait.h"
#include "crossnode_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using testing::Case;
using testing::Completions;
using testing::Eventually;
using testing::Placement;
using testing::RankBuffers;

// One engine per simulated node, joined by a FakeNetwork.
class FakeCluster {
 public:
  explicit FakeCluster(int nodes, HierarchicalEngineOptions options = Options()) {
    for (int n = 0; n < nodes; ++n) {
      probes_.push_back(std::make_shared<testing::TransportProbe>());
      engines_.push_back(MakeHierarchicalEngine(std::make_unique<CpuEngine>(1, 1 << 20),
                                                testing::Probed(net_.MakeTransport(n), probes_[n]),
                                                options));
    }
  }
  static HierarchicalEngineOptions Options() {
    HierarchicalEngineOptions o;
    o.threads = 2;
    o.timeout = absl::Seconds(30);
    o.chunk_bytes = 4096;  // several pipeline steps already at a few thousand elements
    o.small_allreduce_bytes = 0;  // the two-round path; SmallAllReduceInOneRound covers the other
    return o;
  }
  std::vector<Engine*> engines() {
    std::vector<Engine*> v;
    for (auto& e : engines_) v.push_back(e.get());
    return v;
  }
  Engine* engine(int n) { return engines_[n].get(); }
  FakeNetwork& net() { return net_; }
  // Node n's Connect and Exchange calls so far.
  testing::TransportProbe& probe(int n) { return *probes_[n]; }
  void Destroy(const std::string& key) {
    for (auto& e : engines_) e->DestroyGroup(key);
  }

 private:
  FakeNetwork net_;
  std::vector<std::shared_ptr<testing::TransportProbe>> probes_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kBFloat16,
                              DataType::kFloat16, DataType::kInt32,   DataType::kInt64,
                              DataType::kUInt8};

// The reduce variants checked for one dtype.
std::vector<ReduceSpec> Specs(DataType dt) {
  std::vector<ReduceSpec> out;
  auto add = [&](ReduceOp op, double premul = 1, double pre = 1, double post = 1,
                 DataType wire = DataType::kInvalid) {
    ReduceSpec s;
    s.dtype = dt;
    s.op = op;
    s.premul_factor = premul;
    s.pre_divide = pre;
    s.post_divide = post;
    s.wire_dtype = wire;
    out.push_back(s);
  };
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kProduct}) {
    add(op);
  }
  if (IsFloatingPoint(dt)) {
    add(ReduceOp::kPremulSum, 0.25);
    add(ReduceOp::kPremulSum, 3.0, 2.0);
    add(ReduceOp::kSum, 1, 3.0, 2.0);  // pre and post divide
    add(ReduceOp::kAvg, 1, 2.0, 3.0);
    // Reduce dtypes: a narrower wire type, and a wider one.
    if (dt == DataType::kFloat32 || dt == DataType::kFloat64) {
      add(ReduceOp::kSum, 1, 1, 1, DataType::kBFloat16);
      add(ReduceOp::kAvg, 1, 2.0, 1, DataType::kFloat16);
    }
    if (dt == DataType::kFloat64) add(ReduceOp::kSum, 1, 1, 1, DataType::kFloat32);
    if (dt == DataType::kBFloat16) {
      add(ReduceOp::kSum, 1, 1, 1, DataType::kFloat32);
      add(ReduceOp::kSum, 1, 1, 1, DataType::kFloat64);
      add(ReduceOp::kSum, 1, 3.0, 1, DataType::kFloat16);
    }
  } else {
    add(ReduceOp::kPremulSum, 3.7);  // truncated to 3
  }
  return out;
}

struct Topology {
  int nodes;
  int per_node;
  bool interleaved;
};

std::string TopologyName(const ::testing::TestParamInfo<Topology>& info) {
  return absl::StrCat(info.param.nodes, "Nodes", info.param.per_node, "PerNode",
                      info.param.interleaved ? "Interleaved" : "Contiguous");
}

class CollectivesMatchFlat : public ::testing::TestWithParam<Topology> {
 protected:
  void SetUp() override {
    const Topology t = GetParam();
    placement_ = t.interleaved ? testing::RoundRobin(t.nodes, t.per_node)
                               : testing::Contiguous(t.nodes, t.per_node);
    cluster_ = std::make_unique<FakeCluster>(t.nodes);
  }

  // Runs `c` in a fresh group and expects the flat result.
  void Check(const Case& c) {
    const std::string key = absl::StrCat("g", ++groups_);
    const std::string diff =
        testing::RunAndCompare(cluster_->engines(), c, placement_, key, 1, groups_);
    EXPECT_EQ(diff, "") << c.Describe();
    cluster_->Destroy(key);
  }

  Placement placement_;
  std::unique_ptr<FakeCluster> cluster_;
  int groups_ = 0;
};

TEST_P(CollectivesMatchFlat, AllReduce) {
  for (DataType dt : kAllTypes) {
    for (const ReduceSpec& spec : Specs(dt)) {
      for (uint64_t count : {1, 37, 3001}) {
        Case c;
        c.collective = Collective::kAllReduce;
        c.spec = spec;
        c.count = count;
        c.in_place = count == 37;
        Check(c);
      }
    }
  }
}

// In place over several pipeline steps: the final pass may read the local
// inputs directly (fused with the local stage) while it overwrites them.
TEST_P(CollectivesMatchFlat, InPlaceAllReduceOverSeveralChunks) {
  for (DataType dt : kAllTypes) {
    for (const ReduceSpec& spec : Specs(dt)) {
      Case c;
      c.collective = Collective::kAllReduce;
      c.spec = spec;
      c.count = 5003;
      c.in_place = true;
      Check(c);
    }
  }
}

// The same all-reduces below the one-round threshold.
TEST_P(CollectivesMatchFlat, SmallAllReduceInOneRound) {
  HierarchicalEngineOptions o = FakeCluster::Options();
  o.small_allreduce_bytes = 1 << 20;
  cluster_ = std::make_unique<FakeCluster>(GetParam().nodes, o);
  for (DataType dt : kAllTypes) {
    for (const ReduceSpec& spec : Specs(dt)) {
      for (uint64_t count : {1, 37, 3001}) {
        Case c;
        c.collective = Collective::kAllReduce;
        c.spec = spec;
        c.count = count;
        c.in_place = count == 37;
        Check(c);
      }
    }
  }
}

TEST_P(CollectivesMatchFlat, ReduceScatter) {
  for (DataType dt : kAllTypes) {
    for (const ReduceSpec& spec : Specs(dt)) {
      for (uint64_t count : {1, 29, 1500}) {
        Case c;
        c.collective = Collective::kReduceScatter;
        c.spec = spec;
        c.count = count;
        Check(c);
      }
    }
  }
}

TEST_P(CollectivesMatchFlat, AllGatherBroadcastAllToAllBarrier) {
  for (DataType dt : kAllTypes) {
    for (uint64_t count : {0, 1, 33, 2500}) {
      Case c;
      c.spec.dtype = dt;
      c.count = count;
      c.collective = Collective::kAllGather;
      Check(c);
      c.collective = Collective::kAllToAll;
      Check(c);
      c.collective = Collective::kBroadcast;
      for (int root = 0; root < placement_.size(); ++root) {
        c.root = root;
        c.in_place = root % 2 == 1;
        Check(c);
      }
    }
    Case c;
    c.spec.dtype = dt;
    c.collective = Collective::kAllToAll;
    c.uneven = true;
    c.count = 1;
    Check(c);
  }
  Case b;
  b.collective = Collective::kBarrier;
  Check(b);
  b.spec.dtype = DataType::kInvalid;  // as clients send a barrier
  Check(b);
}

// A cross-node send/recv is a two-member broadcast rooted at the sender.
TEST_P(CollectivesMatchFlat, PointToPointAsBroadcast) {
  const int n = placement_.size();
  for (int src = 0; src < n; ++src) {
    const int dst = (src + 1) % n;
    if (placement_.node_of[src] == placement_.node_of[dst]) continue;
    Placement pair;
    pair.nodes = 0;
    pair.node_of = {placement_.node_of[src], placement_.node_of[dst]};
    // Engines of the two nodes, as nodes 0..P-1 of the pair's own view.
    Case c;
    c.collective = Collective::kBroadcast;
    c.spec.dtype = DataType::kFloat32;
    c.count = 1000;
    c.root = 0;
    c.in_place = true;  // the sender's "output" is its input
    RankBuffers bufs(c, 2, 7);
    RankBuffers ref = bufs.CloneInputs();
    CpuEngine::Run(testing::BuildTask(c, pair, -1, &ref, "p2p", 1, 0), nullptr);
    Completions done(2);
    for (int i = 0; i < 2; ++i) {
      cluster_->engine(pair.node_of[i])
          ->Launch(testing::BuildTask(c, pair, pair.node_of[i], &bufs, "g/p2p", 1, 0),
                   done.Callbacks(i));
    }
    ASSERT_TRUE(done.Wait(absl::Seconds(30)));
    ASSERT_TRUE(done.status(0).ok()) << done.status(0);
    ASSERT_TRUE(done.status(1).ok()) << done.status(1);
    EXPECT_EQ(testing::CompareOutputs(c, pair, bufs, ref), "");
  }
}

INSTANTIATE_TEST_SUITE_P(Topologies, CollectivesMatchFlat,
                         ::testing::Values(Topology{2, 1, false}, Topology{2, 2, false},
                                           Topology{2, 2, true}, Topology{3, 1, false},
                                           Topology{3, 2, false}, Topology{3, 2, true},
                                           Topology{4, 1, false}, Topology{4, 2, true}),
                         TopologyName);

// ---------------------------------------------------------------------------
// Ordering and failures.

Case SumCase(uint64_t count, Collective c = Collective::kAllReduce) {
  Case k;
  k.collective = c;
  k.spec.dtype = DataType::kFloat32;
  k.count = count;
  return k;
}

// Launches node n's part of `c` on the nodes listed.
void LaunchOn(FakeCluster& cl, const std::vector<int>& nodes, const Case& c, const Placement& p,
              RankBuffers* bufs, const std::string& key, uint32_t epoch, uint64_t seq,
              Completions* done) {
  for (size_t i = 0; i < nodes.size(); ++i) {
    cl.engine(nodes[i])->Launch(testing::BuildTask(c, p, nodes[i], bufs, key, epoch, seq),
                                done->Callbacks(static_cast<int>(i)));
  }
}

TEST(HierarchicalEngine, AllLocalTasksRunOnTheLocalEngine) {
  FakeCluster cl(1);
  Case c = SumCase(100);
  Placement p = testing::Contiguous(1, 3);
  EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, "local", 1, 1), "");
  EXPECT_EQ(cl.net().connects(), 0);
}

// The HSDP composite with the shard group inside a node and the replicate
// groups across nodes: phase 2 (cross-node) is launched at once with a
// dependency on phase 1 (run by the local engine) and must wait for it.
TEST(HierarchicalEngine, CompositePhaseTwoWaitsForALocalPhaseOne) {
  FakeCluster cl(2);
  const uint64_t shard_count = 3000;
  std::vector<std::vector<float>> grads(4, std::vector<float>(2 * shard_count));
  for (int r = 0; r < 4; ++r) {
    for (size_t i = 0; i < grads[r].size(); ++i) grads[r][i] = float((r + 1) * ((i % 7) + 1));
  }
  std::vector<std::vector<float>> out(4, std::vector<float>(shard_count, -1));
  Completions phase1(2), phase2(4);
  for (int node = 0; node < 2; ++node) {
    // Phase 1: reduce-scatter of the node's two ranks (global 2n, 2n+1).
    EngineTask rs;
    rs.collective = Collective::kReduceScatter;
    rs.spec.dtype = DataType::kFloat32;
    rs.count = shard_count;
    rs.group_key = absl::StrCat("shard", node);
    for (int i = 0; i < 2; ++i) {
      const int g = 2 * node + i;
      EngineMember m;
      m.global_rank = g;
      m.node = node;
      m.send = {MemoryKind::kHost, -1, grads[g].data(), 2 * shard_count * 4};
      m.recv = {MemoryKind::kHost, -1, out[g].data(), shard_count * 4};
      rs.members.push_back(m);
    }
    const uint64_t t1 = cl.engine(node)->Launch(rs, phase1.Callbacks(node));
    // Phase 2: replicate group k = ranks {k, 2 + k}, all-reduce of the shard.
    for (int k = 0; k < 2; ++k) {
      EngineTask ar;
      ar.collective = Collective::kAllReduce;
      ar.spec.dtype = DataType::kFloat32;
      ar.spec.op = ReduceOp::kAvg;
      ar.spec.post_divide = 2.0;  // AVG over the whole mesh: x shard group size
      ar.count = shard_count;
      ar.group_key = absl::StrCat("replicate", k);
      ar.depends_on = {t1};
      for (int n = 0; n < 2; ++n) {
        const int g = 2 * n + k;
        EngineMember m;
        m.global_rank = g;
        m.node = n;
        m.local = n == node;
        if (m.local) m.send = m.recv = {MemoryKind::kHost, -1, out[g].data(), shard_count * 4};
        ar.members.push_back(m);
      }
      cl.engine(node)->Launch(ar, phase2.Callbacks(2 * node + k));
    }
  }
  ASSERT_TRUE(phase1.Wait(absl::Seconds(30)));
  ASSERT_TRUE(phase2.Wait(absl::Seconds(30)));
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(phase1.status(i).ok()) << phase1.status(i);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(phase2.status(i).ok()) << phase2.status(i);
  for (int r = 0; r < 4; ++r) {
    const uint64_t base = (r % 2) * shard_count;  // the shard this rank owns
    for (uint64_t i = 0; i < shard_count; ++i) {
      float sum = 0;
      for (int q = 0; q < 4; ++q) sum += grads[q][base + i];
      ASSERT_FLOAT_EQ(out[r][i], sum / 4) << "rank " << r << " element " << i;
    }
  }
}

// The transposed placement (shard group across nodes, replicate group
// local): phase 2 waits for the cross-node phase 1 and runs after it.
TEST(HierarchicalEngine, LocalPhaseTwoWaitsForACrossNodePhaseOne) {
  FakeCluster cl(2);
  cl.net().SetDelay(1, absl::Milliseconds(100));
  Case rs = SumCase(64, Collective::kReduceScatter);
  Placement p = testing::Contiguous(2, 1);
  RankBuffers bufs(rs, 2, 3);
  Completions p1(2);
  const uint64_t t1 =
      cl.engine(0)->Launch(testing::BuildTask(rs, p, 0, &bufs, "shard", 1, 1), p1.Callbacks(0));
  cl.engine(1)->Launch(testing::BuildTask(rs, p, 1, &bufs, "shard", 1, 1), p1.Callbacks(1));
  // Phase 2 on node 0: a local all-reduce of rank 0's shard with itself
  // (a one-member replicate group), reading what phase 1 wrote.
  std::vector<float> y(64, 0);
  EngineTask ar;
  ar.collective = Collective::kAllReduce;
  ar.spec.dtype = DataType::kFloat32;
  ar.count = 64;
  ar.group_key = "replicate-local";
  ar.depends_on = {t1};
  EngineMember m;
  m.send = {MemoryKind::kHost, -1, bufs.recv(0), 256};
  m.recv = {MemoryKind::kHost, -1, y.data(), 256};
  ar.members = {m};
  Completions p2(1);
  cl.engine(0)->Launch(ar, p2.Callbacks(0));
  ASSERT_TRUE(p2.Wait(absl::Seconds(30)));
  ASSERT_TRUE(p1.Wait(absl::Seconds(30)));
  ASSERT_TRUE(p1.status(0).ok()) << p1.status(0);
  ASSERT_TRUE(p2.status(0).ok()) << p2.status(0);
  EXPECT_EQ(std::memcmp(y.data(), bufs.recv(0), 256), 0) << "phase 2 ran before phase 1";
}

// The transposed placement: phase 1 crosses nodes, phase 2 is local; a failed
// phase 1 fails phase 2 with the cause.
TEST(HierarchicalEngine, LocalPhaseTwoFailsWhenCrossNodePhaseOneFails) {
  FakeCluster cl(2);
  Case rs = SumCase(64, Collective::kReduceScatter);
  Placement p = testing::Contiguous(2, 1);
  RankBuffers bufs(rs, 2, 3);
  // Only node 0 runs phase 1: it is aborted while waiting for node 1.
  Completions p1(1);
  const uint64_t t1 =
      cl.engine(0)->Launch(testing::BuildTask(rs, p, 0, &bufs, "shard", 1, 1), p1.Callbacks(0));
  std::vector<float> x(64, 1), y(64, 0);
  EngineTask ar;
  ar.collective = Collective::kAllReduce;
  ar.spec.dtype = DataType::kFloat32;
  ar.count = 64;
  ar.group_key = "replicate-local";
  ar.depends_on = {t1};
  EngineMember m;
  m.send = {MemoryKind::kHost, -1, x.data(), 256};
  m.recv = {MemoryKind::kHost, -1, y.data(), 256};
  ar.members = {m};
  Completions p2(1);
  cl.engine(0)->Launch(ar, p2.Callbacks(0));
  // Phase 1 is running (connecting to node 1, which never comes).
  ASSERT_TRUE(Eventually([&] { return cl.probe(0).connects.load() >= 1; }, 10000));
  EXPECT_FALSE(p2.Wait(absl::ZeroDuration())) << "phase 2 ran before phase 1 finished";
  cl.engine(0)->Abort(t1, absl::AbortedError("test abort"));
  ASSERT_TRUE(p1.Wait(absl::Seconds(10)));
  EXPECT_EQ(p1.status(0).code(), absl::StatusCode::kAborted) << p1.status(0);
  ASSERT_TRUE(p2.Wait(absl::Seconds(10)));
  EXPECT_EQ(p2.status(0).code(), absl::StatusCode::kAborted);
  EXPECT_NE(p2.status(0).message().find("depends on failed"), std::string::npos) << p2.status(0);
  EXPECT_EQ(y[0], 0.0f);
}

TEST(HierarchicalEngine, AbortOfARunningTaskEndsItAndANewEpochWorks) {
  FakeCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = SumCase(1000);
  RankBuffers bufs(c, 2, 1);
  Completions one(1);
  const uint64_t ticket =
      cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 1), one.Callbacks(0));
  // Running: connecting to node 1, which has not launched its part.
  ASSERT_TRUE(Eventually([&] { return cl.probe(0).connects.load() >= 1; }, 10000));
  cl.engine(0)->Abort(ticket, absl::AbortedError("epoch ended by the test"));
  ASSERT_TRUE(one.Wait(absl::Seconds(10)));
  EXPECT_EQ(one.status(0).code(), absl::StatusCode::kAborted);
  EXPECT_NE(one.status(0).message().find("epoch ended by the test"), std::string::npos);
  // Node 1's part of that epoch cannot succeed either (its peer closed).
  Completions late(1);
  cl.engine(1)->Launch(testing::BuildTask(c, p, 1, &bufs, "g", 1, 1), late.Callbacks(0));
  ASSERT_TRUE(late.Wait(absl::Seconds(10)));
  EXPECT_FALSE(late.status(0).ok());
  // Epoch 2 connects again and runs.
  const int before = cl.net().connects();
  for (Engine* e : cl.engines()) {
    ASSERT_TRUE(e->CreateGroup({"g", 2, {100, 101}, {0, 1}, 0}).ok());
  }
  EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 2, 1), "");
  EXPECT_EQ(cl.net().connects(), before + 2);
  // A task of the old epoch is refused.
  Completions old(1);
  cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 2), old.Callbacks(0));
  ASSERT_TRUE(old.Wait(absl::Seconds(10)));
  EXPECT_EQ(old.status(0).code(), absl::StatusCode::kFailedPrecondition) << old.status(0);
}

TEST(HierarchicalEngine, AbortOfAQueuedTaskDropsItAndTheGroupGoesOn) {
  FakeCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = SumCase(300);
  std::vector<std::unique_ptr<RankBuffers>> bufs;
  for (int i = 0; i < 3; ++i) bufs.push_back(std::make_unique<RankBuffers>(c, 2, i));
  // Node 0 queues seq 1..3; seq 2 is aborted while seq 1 waits for node 1.
  Completions node0(3);
  std::vector<uint64_t> tickets;
  for (int i = 0; i < 3; ++i) {
    tickets.push_back(cl.engine(0)->Launch(
        testing::BuildTask(c, p, 0, bufs[i].get(), "q", 1, i + 1), node0.Callbacks(i)));
  }
  cl.engine(0)->Abort(tickets[1], absl::CancelledError("dropped by the test"));
  // Node 1 runs seq 1 and 3 only.
  Completions node1(2);
  cl.engine(1)->Launch(testing::BuildTask(c, p, 1, bufs[0].get(), "q", 1, 1), node1.Callbacks(0));
  cl.engine(1)->Launch(testing::BuildTask(c, p, 1, bufs[2].get(), "q", 1, 3), node1.Callbacks(1));
  ASSERT_TRUE(node0.Wait(absl::Seconds(10)));
  ASSERT_TRUE(node1.Wait(absl::Seconds(10)));
  EXPECT_TRUE(node0.status(0).ok()) << node0.status(0);
  EXPECT_EQ(node0.status(1).code(), absl::StatusCode::kCancelled) << node0.status(1);
  EXPECT_TRUE(node0.status(2).ok()) << node0.status(2);
  EXPECT_TRUE(node1.status(0).ok()) << node1.status(0);
  EXPECT_TRUE(node1.status(1).ok()) << node1.status(1);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(node0.launched_before_completed(i));
}

TEST(HierarchicalEngine, LinksAreCachedPerGroupAndEpoch) {
  FakeCluster cl(3);
  Placement p = testing::RoundRobin(3, 2);
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    EXPECT_EQ(testing::RunAndCompare(cl.engines(), SumCase(500), p, "cached", 1, seq), "");
  }
  EXPECT_EQ(cl.net().connects(), 3);  // one connect per node
  // A task of a higher epoch replaces the link without CreateGroup.
  EXPECT_EQ(testing::RunAndCompare(cl.engines(), SumCase(500), p, "cached", 2, 1), "");
  EXPECT_EQ(cl.net().connects(), 6);
}

// A transport whose links tell each peer's daemon instance, as the Gloo
// rendezvous does: node n's is "d<n>".
class InstanceLink : public NodeLink {
 public:
  explicit InstanceLink(std::unique_ptr<NodeLink> inner) : inner_(std::move(inner)) {}
  const std::vector<int>& nodes() const override { return inner_->nodes(); }
  int self() const override { return inner_->self(); }
  absl::Status Exchange(const std::vector<SendRange>& sends, const std::vector<RecvRange>& recvs,
                        uint64_t tag, absl::Time deadline) override {
    return inner_->Exchange(sends, recvs, tag, deadline);
  }
  void Abort(const absl::Status& why) override { inner_->Abort(why); }
  std::string peer_instance(int peer) const override {
    return absl::StrCat("d", inner_->nodes()[peer]);
  }

 private:
  std::unique_ptr<NodeLink> inner_;
};

class InstanceTransport : public TransportFactory {
 public:
  explicit InstanceTransport(std::unique_ptr<TransportFactory> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<std::unique_ptr<NodeLink>> Connect(const std::string& key, uint32_t epoch,
                                                    const std::vector<int>& nodes, int this_node,
                                                    absl::Time deadline) override {
    absl::StatusOr<std::unique_ptr<NodeLink>> link =
        inner_->Connect(key, epoch, nodes, this_node, deadline);
    if (!link.ok()) return link.status();
    return std::unique_ptr<NodeLink>(new InstanceLink(std::move(*link)));
  }

 private:
  std::unique_ptr<TransportFactory> inner_;
};

// Which daemon instance a group's links reach in an epoch, per peer node:
// only links of that group (its own and its point-to-point ones) and epoch,
// once connected.
TEST(HierarchicalEngine, LinkedInstancesAreThoseOfTheGroupsConnectedLinksInThatEpoch) {
  FakeNetwork net;
  std::vector<std::unique_ptr<Engine>> owned;
  std::vector<Engine*> engines;
  for (int n = 0; n < 3; ++n) {
    owned.push_back(MakeHierarchicalEngine(
        std::make_unique<CpuEngine>(1, 1 << 20),
        std::make_unique<InstanceTransport>(net.MakeTransport(n)), FakeCluster::Options()));
    engines.push_back(owned.back().get());
  }
  const auto* links = dynamic_cast<const PeerInstances*>(engines[0]);
  ASSERT_NE(links, nullptr);
  EXPECT_TRUE(links->LinkedInstances("grp", 1, 1).empty()) << "nothing connected yet";
  ASSERT_EQ(testing::RunAndCompare(engines, SumCase(100), testing::RoundRobin(3, 1), "grp", 1, 1),
            "");
  EXPECT_THAT(links->LinkedInstances("grp", 1, 1), ::testing::ElementsAre("d1"));
  EXPECT_THAT(links->LinkedInstances("grp", 1, 2), ::testing::ElementsAre("d2"));
  EXPECT_TRUE(links->LinkedInstances("grp", 2, 1).empty()) << "another epoch";
  EXPECT_TRUE(links->LinkedInstances("gr", 1, 1).empty()) << "another group";
  EXPECT_TRUE(links->LinkedInstances("grp", 1, 7).empty()) << "not a participant";
  // A point-to-point link of the group counts too (nodes 0 and 1 only).
  std::vector<Engine*> two = {engines[0], engines[1]};
  ASSERT_EQ(testing::RunAndCompare(two, SumCase(10, Collective::kBroadcast),
                                   testing::Contiguous(2, 1), "grp/p2p/0>1/5", 1, 1),
            "");
  EXPECT_THAT(links->LinkedInstances("grp", 1, 1), ::testing::ElementsAre("d1", "d1"));
  EXPECT_THAT(links->LinkedInstances("grp", 1, 2), ::testing::ElementsAre("d2"));
}

TEST(HierarchicalEngine, DestroyGroupDropsItsPointToPointLinksToo) {
  FakeCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = SumCase(10, Collective::kBroadcast);
  EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, "grp/p2p/0>1/5", 1, 1), "");
  EXPECT_EQ(cl.net().connects(), 2);
  EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, "grp/p2p/0>1/5", 1, 2), "");
  EXPECT_EQ(cl.net().connects(), 2);  // cached
  cl.Destroy("grp");
  EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, "grp/p2p/0>1/5", 1, 3), "");
  EXPECT_EQ(cl.net().connects(), 4);  // dropped with the group, connected again
}

TEST(HierarchicalEngine, DeadlineWhenAPeerNeverAnswers) {
  HierarchicalEngineOptions o = FakeCluster::Options();
  o.timeout = absl::Milliseconds(300);
  FakeCluster cl(2, o);
  Placement p = testing::Contiguous(2, 1);
  Case c = SumCase(100);
  // Connected, then node 1 never runs its part.
  EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 1, 1), "");
  RankBuffers bufs(c, 2, 1);
  Completions done(1);
  const absl::Time start = absl::Now();
  cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 2), done.Callbacks(0));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  EXPECT_EQ(done.status(0).code(), absl::StatusCode::kDeadlineExceeded) << done.status(0);
  EXPECT_NE(done.status(0).message().find("node(s) [1]"), std::string::npos) << done.status(0);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  // A silent node: the connect of a new group reaches the deadline too.
  cl.net().SetSilent(1, true);
  Completions connect(2);
  LaunchOn(cl, {0, 1}, c, p, &bufs, "g2", 1, 1, &connect);
  ASSERT_TRUE(connect.Wait(absl::Seconds(10)));
  EXPECT_EQ(connect.status(0).code(), absl::StatusCode::kDeadlineExceeded) << connect.status(0);
  EXPECT_NE(connect.status(0).message().find("node(s) [1] did not come"), std::string::npos)
      << connect.status(0);
}

TEST(HierarchicalEngine, AKilledNodeFailsEveryParticipantAndOtherGroupsGoOn) {
  FakeCluster cl(3);
  Placement three = testing::RoundRobin(3, 2);
  Placement two = testing::Contiguous(2, 2);  // nodes 0 and 1 only
  // Both groups connected first.
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), SumCase(100), three, "wide", 1, 1), "");
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), SumCase(100), two, "narrow", 1, 1), "");
  // Node 2 is slow, then killed mid-task.
  cl.net().SetDelay(2, absl::Milliseconds(200));
  Case big = SumCase(20000);
  RankBuffers bufs(big, 6, 5);
  Completions done(3);
  int entered[3];
  for (int n = 0; n < 3; ++n) entered[n] = cl.probe(n).exchanges.load();
  LaunchOn(cl, {0, 1, 2}, big, three, &bufs, "wide", 1, 2, &done);
  // Mid-task: every node is in the task's network stage.
  for (int n = 0; n < 3; ++n) {
    ASSERT_TRUE(Eventually([&] { return cl.probe(n).exchanges.load() > entered[n]; }, 10000))
        << "node " << n;
  }
  cl.net().KillNode(2);
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(done.status(i).code(), absl::StatusCode::kUnavailable) << done.status(i);
    EXPECT_NE(done.status(i).message().find("node 2"), std::string::npos) << done.status(i);
    // ... and the ranks it hosted (round robin over 3 nodes: group ranks 2 and 5,
    // global ranks 102 and 105 in this harness).
    EXPECT_NE(done.status(i).message().find("node 2 hosts ranks 102, 105"), std::string::npos)
        << done.status(i);
  }
  EXPECT_FALSE(done.status(2).ok());
  // The group on nodes 0 and 1 keeps working.
  EXPECT_EQ(testing::RunAndCompare(cl.engines(), SumCase(3000), two, "narrow", 1, 2), "");
}

TEST(HierarchicalEngine, NodesThatDisagreeOnTheOperationFailCleanly) {
  FakeCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case a = SumCase(100), b = SumCase(200);
  RankBuffers ba(a, 2, 1), bb(b, 2, 1);
  Completions done(2);
  cl.engine(0)->Launch(testing::BuildTask(a, p, 0, &ba, "g", 1, 1), done.Callbacks(0));
  cl.engine(1)->Launch(testing::BuildTask(b, p, 1, &bb, "g", 1, 1), done.Callbacks(1));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(done.status(i).code(), absl::StatusCode::kFailedPrecondition) << done.status(i);
    EXPECT_NE(done.status(i).message().find(absl::StrCat("node ", 1 - i)), std::string::npos)
        << done.status(i);
  }
  EXPECT_TRUE(ba.GuardsIntact());
  EXPECT_TRUE(bb.GuardsIntact());
}

TEST(HierarchicalEngine, WithoutChunkingEveryCollectiveStillMatches) {
  HierarchicalEngineOptions o = FakeCluster::Options();
  o.chunk_bytes = 0;
  FakeCluster cl(3, o);
  Placement p = testing::RoundRobin(3, 2);
  uint64_t seq = 0;
  for (Collective c : {Collective::kAllReduce, Collective::kReduceScatter,
                       Collective::kAllGather, Collective::kBroadcast, Collective::kAllToAll}) {
    EXPECT_EQ(testing::RunAndCompare(cl.engines(), SumCase(5000, c), p, "whole", 1, ++seq), "")
        << CollectiveName(c);
  }
}

TEST(HierarchicalEngine, LocalStageSplitAcrossThreads) {
  HierarchicalEngineOptions o = FakeCluster::Options();
  o.local_threads = 3;
  o.chunk_bytes = 1 << 20;
  FakeCluster cl(2, o);
  Placement p = testing::RoundRobin(2, 2);
  uint64_t seq = 0;
  for (DataType dt : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt64}) {
    for (Collective c : {Collective::kAllReduce, Collective::kReduceScatter,
                         Collective::kAllGather, Collective::kBroadcast}) {
      Case k = SumCase(300001, c);
      k.spec.dtype = dt;
      k.spec.op = ReduceOp::kAvg;
      EXPECT_EQ(testing::RunAndCompare(cl.engines(), k, p, "threads", 1, ++seq), "")
          << k.Describe();
    }
  }
}

TEST(HierarchicalEngine, NodesWithDifferentChunkSizesFailCleanly) {
  FakeNetwork net;
  HierarchicalEngineOptions a = FakeCluster::Options(), b = FakeCluster::Options();
  b.chunk_bytes = 2 * a.chunk_bytes;
  auto e0 = MakeHierarchicalEngine(std::make_unique<CpuEngine>(1, 1 << 20), net.MakeTransport(0), a);
  auto e1 = MakeHierarchicalEngine(std::make_unique<CpuEngine>(1, 1 << 20), net.MakeTransport(1), b);
  Placement p = testing::Contiguous(2, 1);
  Case c = SumCase(100000);
  RankBuffers bufs(c, 2, 1);
  Completions done(2);
  e0->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 1), done.Callbacks(0));
  e1->Launch(testing::BuildTask(c, p, 1, &bufs, "g", 1, 1), done.Callbacks(1));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(done.status(i).code(), absl::StatusCode::kFailedPrecondition) << done.status(i);
    EXPECT_NE(done.status(i).message().find("chunks by"), std::string::npos) << done.status(i);
  }
}

TEST(HierarchicalEngine, UnevenAllToAllWhoseSplitsDisagreeFailsOnEveryNode) {
  FakeCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c;
  c.collective = Collective::kAllToAll;
  c.spec.dtype = DataType::kInt32;
  c.uneven = true;
  c.count = 1;
  RankBuffers bufs(c, 2, 1);
  EngineTask t0 = testing::BuildTask(c, p, 0, &bufs, "a2a", 1, 1);
  EngineTask t1 = testing::BuildTask(c, p, 1, &bufs, "a2a", 1, 1);
  // Rank 0 expects one element less from rank 1 than rank 1 sends.
  ASSERT_GT(t0.members[0].recv_counts[1], 0u);
  t0.members[0].recv_counts[1] -= 1;
  Completions done(2);
  cl.engine(0)->Launch(t0, done.Callbacks(0));
  cl.engine(1)->Launch(t1, done.Callbacks(1));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(done.status(i).code(), absl::StatusCode::kInvalidArgument) << done.status(i);
    EXPECT_NE(done.status(i).message().find("splits disagree: rank 101 sends"),
              std::string::npos)
        << done.status(i);
  }
  EXPECT_TRUE(bufs.GuardsIntact());
}

TEST(HierarchicalEngine, ALocalBufferTooSmallIsRefusedBeforeAnythingMoves) {
  FakeCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = SumCase(100, Collective::kAllGather);
  // The group's link is up (a first operation succeeded).
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 1, 1), "");
  RankBuffers bufs(c, 2, 1);
  EngineTask t0 = testing::BuildTask(c, p, 0, &bufs, "g", 1, 2);
  t0.members[0].recv.bytes -= 4;
  Completions done(2);
  cl.engine(0)->Launch(t0, done.Callbacks(0));
  cl.engine(1)->Launch(testing::BuildTask(c, p, 1, &bufs, "g", 1, 2), done.Callbacks(1));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  EXPECT_EQ(done.status(0).code(), absl::StatusCode::kInvalidArgument) << done.status(0);
  // Node 0 broke the link instead of answering.
  EXPECT_EQ(done.status(1).code(), absl::StatusCode::kUnavailable) << done.status(1);
  EXPECT_NE(done.status(1).message().find("node 0"), std::string::npos) << done.status(1);
  EXPECT_TRUE(bufs.GuardsIntact());
}

// Malformed tasks fail at once on the node that has them, before any
// connect (no peer needed).
TEST(HierarchicalEngine, MalformedTasksFailAtOnceWithoutAPeer) {
  FakeCluster cl(2);
  Placement p = testing::Contiguous(2, 2);
  Case c = SumCase(64);
  RankBuffers bufs(c, 4, 1);
  std::vector<std::pair<std::string, std::function<void(EngineTask*)>>> mutations = {
      {"no local member", [](EngineTask* t) { for (auto& m : t->members) m.local = false; }},
      {"local members on two nodes", [](EngineTask* t) { t->members[1].node = 1; }},
      {"remote member on this node", [](EngineTask* t) { t->members[2].node = 0; t->members[2].local = false; t->members[3].node = 0; }},
      {"unknown dtype", [](EngineTask* t) { t->spec.dtype = static_cast<DataType>(99); }},
      {"count too large", [](EngineTask* t) { t->count = uint64_t{1} << 41; }},
      {"null buffer", [](EngineTask* t) { t->members[0].recv.data = nullptr; }},
      {"short buffer", [](EngineTask* t) { t->members[1].send.bytes = 8; }},
      {"unknown op", [](EngineTask* t) { t->spec.op = static_cast<ReduceOp>(42); }},
      {"device memory", [](EngineTask* t) { t->members[0].send.kind = MemoryKind::kDevice; }},
      {"root out of range", [](EngineTask* t) { t->collective = Collective::kBroadcast; t->root = 9; }},
      {"splits of the wrong size", [](EngineTask* t) {
         t->collective = Collective::kAllToAll;
         for (auto& m : t->members) {
           if (m.local) m.send_counts = m.recv_counts = {1, 1};
         }
       }},
      {"send/recv is not a task", [](EngineTask* t) { t->collective = Collective::kSend; }},
  };
  uint64_t seq = 0;
  for (auto& [what, mutate] : mutations) {
    EngineTask t = testing::BuildTask(c, p, 0, &bufs, "bad", 1, ++seq);
    mutate(&t);
    Completions done(1);
    const absl::Time start = absl::Now();
    cl.engine(0)->Launch(std::move(t), done.Callbacks(0));
    ASSERT_TRUE(done.Wait(absl::Seconds(5))) << what;
    EXPECT_LT(absl::Now() - start, absl::Seconds(2)) << what;
    const absl::StatusCode code = done.status(0).code();
    EXPECT_TRUE(code == absl::StatusCode::kInvalidArgument ||
                code == absl::StatusCode::kUnimplemented)
        << what << ": " << done.status(0);
  }
  EXPECT_TRUE(bufs.GuardsIntact());
  EXPECT_EQ(cl.net().connects(), 0);
}

TEST(HierarchicalEngine, ShutdownCompletesEverythingWithUnavailable) {
  FakeCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = SumCase(100);
  RankBuffers bufs(c, 2, 1);
  Completions done(3);
  // Node 1 never answers: one task running (connecting), two queued behind it.
  for (int i = 0; i < 3; ++i) {
    cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, i + 1), done.Callbacks(i));
  }
  // The first is running (connecting); the others wait behind it.
  ASSERT_TRUE(Eventually([&] { return cl.probe(0).connects.load() >= 1; }, 10000));
  const absl::Time start = absl::Now();
  cl.engine(0)->Shutdown();
  ASSERT_TRUE(done.Wait(absl::Seconds(5)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(done.status(i).code(), absl::StatusCode::kUnavailable) << done.status(i);
  }
  Completions after(1);
  cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 9), after.Callbacks(0));
  ASSERT_TRUE(after.Wait(absl::Seconds(1)));
  EXPECT_EQ(after.status(0).code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace hsdp
