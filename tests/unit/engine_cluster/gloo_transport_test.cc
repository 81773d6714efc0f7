// The cross-node engine over the real Gloo TCP transport on 127.0.0.1: two
// and three engines in one process (one per simulated node) rendezvous
// through a shared gloo::rendezvous::HashStore, run the collectives and
// compare with the flat CpuEngine result; a peer that never answers and a
// peer that goes away end in clear errors.
#include "daemon/engine/cluster/gloo_transport.h"

#include "absl/strings/str_cat.h"
#include "daemon/engine/cluster/hierarchical_engine.h"
#include "daemon/engine/cpu/cpu_engine.h"
#include "engine_cluster_util.h"
#include "gloo/rendezvous/hash_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using testing::Case;
using testing::Completions;
using testing::Placement;
using testing::RankBuffers;

// A PrefixStore that owns nothing but keeps the shared base store alive.
class SharedPrefixStore : public gloo::rendezvous::PrefixStore {
 public:
  SharedPrefixStore(const std::string& prefix, std::shared_ptr<gloo::rendezvous::Store> base)
      : PrefixStore(prefix, *base), base_(std::move(base)) {}

 private:
  std::shared_ptr<gloo::rendezvous::Store> base_;
};

class GlooCluster {
 public:
  explicit GlooCluster(int nodes, absl::Duration timeout = absl::Seconds(30), int devices = 1) {
    auto store = std::make_shared<gloo::rendezvous::HashStore>();
    HierarchicalEngineOptions o;
    o.threads = 2;
    o.timeout = timeout;
    o.chunk_bytes = 8192;
    for (int n = 0; n < nodes; ++n) {
      GlooTransportOptions t;
      t.data_address = "127.0.0.1";
      t.devices = devices;
      t.stripe_min_bytes = 4096;
      t.store = [store](const std::string& prefix) {
        return std::unique_ptr<gloo::rendezvous::Store>(new SharedPrefixStore(prefix, store));
      };
      engines_.push_back(MakeHierarchicalEngine(std::make_unique<CpuEngine>(1, 1 << 20),
                                                MakeGlooTransport(std::move(t)), o));
    }
  }
  std::vector<Engine*> engines() {
    std::vector<Engine*> v;
    for (auto& e : engines_) v.push_back(e.get());
    return v;
  }
  Engine* engine(int n) { return engines_[n].get(); }
  void Stop(int n) { engines_[n].reset(); }

 private:
  std::vector<std::unique_ptr<Engine>> engines_;
};

Case Make(Collective c, DataType dt, uint64_t count, ReduceOp op = ReduceOp::kSum) {
  Case k;
  k.collective = c;
  k.spec.dtype = dt;
  k.spec.op = op;
  k.count = count;
  return k;
}

TEST(GlooTransport, CollectivesMatchFlatOnTwoAndThreeNodes) {
  for (int nodes : {2, 3}) {
    GlooCluster cl(nodes);
    for (const Placement& p : {testing::Contiguous(nodes, 2), testing::RoundRobin(nodes, 1)}) {
      std::vector<Case> cases = {
          Make(Collective::kAllReduce, DataType::kFloat32, 20000),
          Make(Collective::kAllReduce, DataType::kBFloat16, 777, ReduceOp::kAvg),
          Make(Collective::kAllReduce, DataType::kInt64, 100, ReduceOp::kMax),
          Make(Collective::kReduceScatter, DataType::kFloat32, 3000),
          Make(Collective::kReduceScatter, DataType::kFloat16, 50, ReduceOp::kAvg),
          Make(Collective::kAllGather, DataType::kFloat32, 5000),
          Make(Collective::kAllGather, DataType::kUInt8, 13),
          Make(Collective::kAllToAll, DataType::kInt32, 1000),
          Make(Collective::kBroadcast, DataType::kFloat64, 4000),
          Make(Collective::kBarrier, DataType::kFloat32, 0),
      };
      Case uneven = Make(Collective::kAllToAll, DataType::kFloat32, 1);
      uneven.uneven = true;
      cases.push_back(uneven);
      uint64_t seq = 0;
      const std::string key = absl::StrCat("g", p.size(), "x", nodes);
      for (const Case& c : cases) {
        EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, key, 1, ++seq), "")
            << nodes << " nodes: " << c.Describe();
      }
    }
  }
}

// Large messages striped over two tcp devices per node.
TEST(GlooTransport, StripedOverTwoDevices) {
  GlooCluster cl(2, absl::Seconds(30), 2);
  const Placement p = testing::RoundRobin(2, 2);
  uint64_t seq = 0;
  for (const Case& c : {Make(Collective::kAllReduce, DataType::kFloat32, 30000),
                        Make(Collective::kReduceScatter, DataType::kBFloat16, 5000),
                        Make(Collective::kAllGather, DataType::kInt32, 7000),
                        Make(Collective::kAllToAll, DataType::kFloat64, 900)}) {
    EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, "striped", 1, ++seq), "")
        << c.Describe();
  }
}

TEST(GlooTransport, APeerThatNeverAnswersReachesTheDeadline) {
  GlooCluster cl(2, absl::Milliseconds(500));
  Placement p = testing::Contiguous(2, 1);
  Case c = Make(Collective::kAllReduce, DataType::kFloat32, 100);
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 1, 1), "");
  RankBuffers bufs(c, 2, 1);
  Completions done(1);
  cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 2), done.Callbacks(0));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  EXPECT_EQ(done.status(0).code(), absl::StatusCode::kDeadlineExceeded) << done.status(0);
  EXPECT_NE(done.status(0).message().find("node 1"), std::string::npos) << done.status(0);
}

TEST(GlooTransport, ANodeThatNeverConnectsReachesTheDeadlineNamed) {
  GlooCluster cl(3, absl::Milliseconds(500));
  Placement p = testing::Contiguous(3, 1);
  Case c = Make(Collective::kAllReduce, DataType::kFloat32, 100);
  RankBuffers bufs(c, 3, 1);
  Completions done(2);
  for (int n = 0; n < 2; ++n) {
    cl.engine(n)->Launch(testing::BuildTask(c, p, n, &bufs, "late", 1, 1), done.Callbacks(n));
  }
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(done.status(n).code(), absl::StatusCode::kDeadlineExceeded) << done.status(n);
    EXPECT_NE(done.status(n).message().find("node(s) [2] did not come"), std::string::npos)
        << done.status(n);
  }
}

TEST(GlooTransport, APeerThatGoesAwayFailsTheOperationNamingIt) {
  GlooCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = Make(Collective::kAllReduce, DataType::kFloat32, 100);
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 1, 1), "");
  RankBuffers bufs(c, 2, 1);
  Completions done(1);
  cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 2), done.Callbacks(0));
  absl::SleepFor(absl::Milliseconds(100));
  cl.Stop(1);  // its links close
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  EXPECT_EQ(done.status(0).code(), absl::StatusCode::kUnavailable) << done.status(0);
  EXPECT_NE(done.status(0).message().find("node 1"), std::string::npos) << done.status(0);
}

TEST(GlooTransport, AbortEndsAWaitingOperation) {
  GlooCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = Make(Collective::kAllGather, DataType::kFloat32, 100);
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 1, 1), "");
  RankBuffers bufs(c, 2, 1);
  Completions done(1);
  const uint64_t t =
      cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 2), done.Callbacks(0));
  absl::SleepFor(absl::Milliseconds(100));
  cl.engine(0)->Abort(t, absl::AbortedError("aborted by the test"));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  EXPECT_EQ(done.status(0).code(), absl::StatusCode::kAborted) << done.status(0);
}

}  // namespace
}  // namespace hsdp
