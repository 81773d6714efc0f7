// The NCCL engine across nodes, against the fakes: two engines standing in
// for two daemons (sharing one fake NCCL, as two processes share a network),
// each owning the NCCL ranks of its own members of one group, agree on the
// communicator's unique id through an exchange (the daemon's goes through the
// coordinator's store: daemon/cluster/nccl_id_exchange.h) and run the
// collective together. Without an exchange such a task is refused.
#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "daemon/engine/nccl/nccl_engine.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/nccl/engine_test_util.h"

namespace hsdp::nccl {
namespace {

using testing::FakeNode;
using testing::Member;
using testing::Pending;

// A blackboard for unique ids: the creator writes, the others wait.
struct IdBoard {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, UniqueId> ids;
  std::vector<std::string> calls;  // "<key> creator=<0|1> nodes=<n>"

  decltype(NcclEngineOptions::exchange_id) Exchange() {
    return [this](const std::string& key, bool creator, const UniqueId& mine, int nodes,
                  absl::Time deadline) -> absl::StatusOr<UniqueId> {
      std::unique_lock<std::mutex> l(mu);
      calls.push_back(key + " creator=" + std::to_string(creator) +
                      " nodes=" + std::to_string(nodes));
      if (creator) {
        ids[key] = mine;
        cv.notify_all();
        return mine;
      }
      if (!cv.wait_until(l, absl::ToChronoTime(deadline), [&] { return ids.count(key) > 0; })) {
        return absl::DeadlineExceededError("no id for " + key);
      }
      return ids[key];
    };
  }
};

NcclEngineOptions WithExchange(IdBoard* board) {
  NcclEngineOptions o = FakeNode::FastOptions();
  o.init_timeout = absl::Seconds(5);
  o.exchange_id = board->Exchange();
  return o;
}

// Member r of an n-member group lives on device r; `here` are this
// "daemon's" members (node 0), the others are on node 1.
struct CrossTask {
  EngineTask task;
  std::map<int, device::DevicePtr> send, recv;
};

CrossTask Make(FakeNode& node, Collective c, int n, uint64_t count, const std::vector<int>& here,
               int this_node, const std::string& group = "6:xjob/0,1,2,3#0") {
  CrossTask ct;
  ct.task.collective = c;
  ct.task.count = count;
  ct.task.group_key = group;
  ct.task.epoch = 1;
  ct.task.spec.dtype = DataType::kFloat32;
  const uint64_t in = c == Collective::kAllToAll ? count * n : count;
  const uint64_t out = c == Collective::kAllToAll ? count * n : count;
  for (int r = 0; r < n; ++r) {
    const bool local = std::find(here.begin(), here.end(), r) != here.end();
    EngineMember m;
    m.global_rank = r;
    m.node = local ? this_node : 1 - this_node;
    m.local = local;
    if (local) {
      std::vector<float> values(in);
      for (uint64_t i = 0; i < in; ++i) values[i] = float(100 * r + i);
      ct.send[r] = node.Buffer(r, values);
      ct.recv[r] = node.Buffer(r, std::vector<float>(out, -1.0f));
      m = Member(r, r, ct.send[r], ct.recv[r], in * 4, out * 4);
      m.node = this_node;
    }
    ct.task.members.push_back(m);
  }
  return ct;
}

TEST(NcclCrossNodeTest, TwoDaemonsAgreeOnTheIdAndRunOneCommunicator) {
  IdBoard board;
  FakeNode node(4, WithExchange(&board));
  // The second "daemon" drives members 1 and 3 over the same fake NCCL.
  NcclEngine there(&node.dev, &node.coll, WithExchange(&board));
  for (Collective c : {Collective::kAllReduce, Collective::kAllToAll}) {
    SCOPED_TRACE(c == Collective::kAllReduce ? "all-reduce" : "all-to-all");
    const uint64_t count = 64;
    CrossTask a = Make(node, c, 4, count, {0, 2}, /*this_node=*/0);
    CrossTask b = Make(node, c, 4, count, {1, 3}, /*this_node=*/1);
    Pending pa, pb;
    there.Launch(b.task, pb.Callbacks());  // the waiting side first
    node.engine.Launch(a.task, pa.Callbacks());
    ASSERT_TRUE(pa.Wait().status.ok());
    ASSERT_TRUE(pb.Wait().status.ok());
    for (int r = 0; r < 4; ++r) {
      const device::DevicePtr out = r % 2 == 0 ? a.recv[r] : b.recv[r];
      if (c == Collective::kAllReduce) {
        const auto v = node.Read<float>(out, count);
        for (uint64_t i = 0; i < count; ++i) {
          ASSERT_EQ(v[i], float(100 * (0 + 1 + 2 + 3) + 4 * i)) << "rank " << r << " [" << i << "]";
        }
      } else {  // block j of rank r's output is block r of rank j's input
        const auto v = node.Read<float>(out, count * 4);
        for (int j = 0; j < 4; ++j) {
          for (uint64_t i = 0; i < count; ++i) {
            ASSERT_EQ(v[j * count + i], float(100 * j + r * count + i)) << r << " " << j;
          }
        }
      }
    }
  }
  // One communicator per daemon and epoch: each asked for the id once, and
  // the daemon hosting member 0 created it.
  std::sort(board.calls.begin(), board.calls.end());
  EXPECT_EQ(board.calls, (std::vector<std::string>{"6:xjob/0,1,2,3#0#1 creator=0 nodes=2",
                                                   "6:xjob/0,1,2,3#0#1 creator=1 nodes=2"}));
  EXPECT_EQ(node.engine.stats().comm_inits, 1u);
  EXPECT_EQ(there.stats().comm_inits, 1u);
  // Each engine issued only its own members' calls.
  for (const auto& call : node.coll.calls()) EXPECT_TRUE(call.rank >= 0 && call.rank < 4);
  there.Shutdown();
}

// Two daemons issue two groups' collectives in opposite
// orders (both groups span both daemons). NCCL kernels block until their
// peers arrive, so on one stream per device shared by every group, daemon A's
// X waits for B's X, queued behind B's Y, which waits for A's Y, queued
// behind A's X: a deadlock (here: both time out). One stream per
// communicator set lets each group's work proceed on its own.
TEST(NcclCrossNodeTest, GroupsIssuedInOppositeOrdersByTwoDaemonsDoNotDeadlock) {
  IdBoard board;
  NcclEngineOptions o = WithExchange(&board);
  o.op_timeout = absl::Seconds(3);
  FakeNode node(2, o);
  NcclEngine there(&node.dev, &node.coll, o);
  CrossTask ax = Make(node, Collective::kAllReduce, 2, 16, {0}, 0, "X");
  CrossTask ay = Make(node, Collective::kAllReduce, 2, 16, {0}, 0, "Y");
  CrossTask bx = Make(node, Collective::kAllReduce, 2, 16, {1}, 1, "X");
  CrossTask by = Make(node, Collective::kAllReduce, 2, 16, {1}, 1, "Y");
  Pending pax, pay, pbx, pby;
  node.engine.Launch(ax.task, pax.Callbacks());  // daemon A: X, then Y
  node.engine.Launch(ay.task, pay.Callbacks());
  there.Launch(by.task, pby.Callbacks());  // daemon B: Y, then X
  there.Launch(bx.task, pbx.Callbacks());
  for (Pending* p : {&pax, &pay, &pbx, &pby}) {
    const auto out = p->Wait();
    EXPECT_TRUE(out.status.ok()) << out.status;
  }
  for (device::DevicePtr out : {ax.recv[0], ay.recv[0], bx.recv[1], by.recv[1]}) {
    const auto v = node.Read<float>(out, 16);
    for (uint64_t i = 0; i < 16; ++i) ASSERT_EQ(v[i], float(100 + 2 * i)) << i;
  }
  // Each set has its own stream.
  EXPECT_NE(node.engine.StreamOf("X", 0, false), node.engine.StreamOf("Y", 0, false));
  there.Shutdown();
}

TEST(NcclCrossNodeTest, WithoutAnExchangeACrossNodeTaskIsRefused) {
  FakeNode node(2);
  CrossTask a = Make(node, Collective::kAllReduce, 2, 8, {0}, 0);
  Pending p;
  node.engine.Launch(a.task, p.Callbacks());
  const absl::Status s = p.Wait().status;
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(std::string(s.message()).find("not part of a cluster"), std::string::npos) << s;
}

TEST(NcclCrossNodeTest, AnIdThatNeverComesFailsTheTaskInTime) {
  IdBoard board;
  NcclEngineOptions o = WithExchange(&board);
  o.init_timeout = absl::Milliseconds(500);
  FakeNode node(4, o);
  // Only the waiting side runs: the creator never publishes.
  CrossTask b = Make(node, Collective::kAllReduce, 4, 8, {1, 3}, 1);
  Pending p;
  node.engine.Launch(b.task, p.Callbacks());
  const absl::Status s = p.Wait().status;
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

}  // namespace
}  // namespace hsdp::nccl
