// Four real hsdpd processes on loopback (the "K = 4" topologies of the
// multi-node issue) with one and two trainers per node, rank layouts that are
// not contiguous per node, and the HSDP mesh across four nodes in both
// placements: the composite as one submission, consecutive buckets, and
// gradient accumulation (reduce-scatter per micro-batch, one all-reduce at
// the end). Every result is checked against the independent reference of
// collective_check.h; every wait is bounded.
#include <string>
#include <vector>

#include "cluster_fixture.h"
#include "gtest/gtest.h"
#include "hsdp/client.h"

namespace hsdp::testing {
namespace {

class ClusterFourNodesTest : public ClusterFixture {};

// 4 nodes x 1 trainer: rank r lives on node (r * 3 + 1) % 4, so no rank is
// on the node of its own number.
TEST_F(ClusterFourNodesTest, OneTrainerEachEveryCollective) {
  StartCluster(4);
  RunRanks({1, 0, 3, 2}, [](Trainer* T, int rank) {
    Group all;
    if (!MakeGroup(T, {0, 1, 2, 3}, &all)) return Report(T);
    AllReduceCase(T, all, DataType::kFloat32, {}, 40000);
    AllReduceCase(T, all, DataType::kBFloat16,
                  ReduceOptions{ReduceOp::kSum, 1.0, 1.0, 1.0, DataType::kFloat32}, 3000);
    AllReduceCase(T, all, DataType::kInt64, ReduceOptions{ReduceOp::kMin}, 500);
    ReduceScatterCase(T, all, DataType::kFloat32, ReduceOptions{ReduceOp::kAvg}, 700);
    AllGatherCase(T, all, DataType::kFloat16, 900);
    BroadcastCase(T, all, DataType::kFloat32, /*root=*/3, 1234);
    AllToAllCase(T, all, DataType::kFloat32, 64);
    Sync(T, "all");
    // Three of the four nodes, ranks listed out of order (node 0 hosts rank
    // 1, which is not a member: only nodes 1, 2, 3 take part).
    if (rank != 1) {
      Group three;
      if (!MakeGroup(T, {3, 0, 2}, &three)) return Report(T);
      AllReduceCase(T, three, DataType::kFloat32, {}, 5000);
      ReduceScatterCase(T, three, DataType::kFloat32, {}, 100);
    }
    Sync(T, "three");
    SendRecvCase(T, all, 0, 3, 1, 2000);
    return Report(T);
  });
}

// 4 nodes x 2 trainers (8 ranks): node n hosts ranks n and 7 - n.
TEST_F(ClusterFourNodesTest, TwoTrainersEachEveryCollective) {
  StartCluster(4);
  RunRanks({0, 1, 2, 3, 3, 2, 1, 0}, [](Trainer* T, int) {
    Group all;
    if (!MakeGroup(T, {0, 1, 2, 3, 4, 5, 6, 7}, &all)) return Report(T);
    AllReduceCase(T, all, DataType::kFloat32, {}, 60000);
    AllReduceCase(T, all, DataType::kFloat32,
                  ReduceOptions{ReduceOp::kAvg, 1.0, 2.0, 4.0, DataType::kBFloat16}, 2000);
    AllReduceCase(T, all, DataType::kInt32, ReduceOptions{ReduceOp::kMax}, 300);
    ReduceScatterCase(T, all, DataType::kFloat32, {}, 2500);
    ReduceScatterCase(T, all, DataType::kFloat16, ReduceOptions{ReduceOp::kSum}, 128);
    AllGatherCase(T, all, DataType::kFloat32, 1500);
    AllGatherCase(T, all, DataType::kUInt8, 77);
    BroadcastCase(T, all, DataType::kFloat64, /*root=*/5, 400);
    AllToAllCase(T, all, DataType::kFloat32, 32);
    return Report(T);
  });
}

// HSDP on a 2 x 4 mesh of 8 ranks, node n hosting ranks n and n + 4.
// Placement A: shard groups inside a node ({n, n + 4}), replicate groups
// across all four nodes ({0..3} and {4..7}). Placement B (transpose): shard
// across the four nodes, replicate inside a node. In each: the composite for
// three consecutive buckets (pipelined by the daemons), with a reduce dtype,
// and the accumulation variant over three micro-batches.
TEST_F(ClusterFourNodesTest, HsdpMeshAcrossFourNodesBothPlacements) {
  StartCluster(4);
  RunRanks({0, 1, 2, 3, 0, 1, 2, 3}, [](Trainer* T, int rank) {
    const std::vector<int> mesh = {0, 1, 2, 3, 4, 5, 6, 7};
    const int node = rank % 4;
    const bool low = rank < 4;
    const std::vector<int> in_node = {node, node + 4};
    const std::vector<int> across =
        low ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{4, 5, 6, 7};
    Group shard, replicate;
    if (!MakeGroup(T, in_node, &shard) || !MakeGroup(T, across, &replicate)) return Report(T);
    for (int bucket = 0; bucket < 3; ++bucket) {
      CompositeCase(T, shard, replicate, mesh, DataType::kFloat32, {}, 4000 + 10 * bucket, "A");
    }
    CompositeCase(T, shard, replicate, mesh, DataType::kFloat32,
                  ReduceOptions{ReduceOp::kAvg, 1.0, 1.0, 1.0, DataType::kBFloat16}, 1024, "A");
    AccumulationCase(T, shard, replicate, mesh, /*micro=*/3, 2000, "A");
    Sync(T, "placement A");
    Group shard2, replicate2;
    if (!MakeGroup(T, across, &shard2) || !MakeGroup(T, in_node, &replicate2)) return Report(T);
    for (int bucket = 0; bucket < 3; ++bucket) {
      CompositeCase(T, shard2, replicate2, mesh, DataType::kFloat32, {}, 3000 + bucket, "B");
    }
    AccumulationCase(T, shard2, replicate2, mesh, /*micro=*/3, 1000, "B");
    return Report(T);
  });
}

// The accumulation variant on 2 nodes x 2 trainers (the smallest HSDP
// deployment), replicate across nodes, with a non-contiguous layout.
TEST_F(ClusterFourNodesTest, AccumulationOnTwoNodes) {
  StartCluster(2);
  RunRanks({0, 1, 1, 0}, [](Trainer* T, int rank) {
    const std::vector<int> mesh = {0, 1, 2, 3};
    const bool node0 = rank == 0 || rank == 3;
    const bool first = rank == 0 || rank == 1;
    Group shard, replicate;
    if (!MakeGroup(T, node0 ? std::vector<int>{0, 3} : std::vector<int>{1, 2}, &shard) ||
        !MakeGroup(T, first ? std::vector<int>{0, 1} : std::vector<int>{3, 2}, &replicate)) {
      return Report(T);
    }
    AccumulationCase(T, shard, replicate, mesh, /*micro=*/4, 20000, "2x2");
    return Report(T);
  });
}

}  // namespace
}  // namespace hsdp::testing
