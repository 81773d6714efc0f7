// The fixture of the multi-node integration tests: a cluster of real hsdpd
// processes on loopback (node 0 is the coordinator, node i has
// cluster.node_rank i) and trainers as forked processes, one per rank, each
// attached to its own node's daemon.
#ifndef HSDP_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_
#define HSDP_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cluster_test_util.h"
#include "cluster_trainer.h"
#include "gtest/gtest.h"

namespace hsdp::testing {

class ClusterFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    token_ = WriteToken(shared_, "token", "cluster datapath test token");
    coordinator_ = Loopback(FreePort());
  }

  // Starts `n` daemons (node i has cluster.node_rank i; node 0 is the
  // coordinator) and waits until every one sees all of them. `extra_yaml`
  // (whole top-level sections) is appended to every daemon's config.
  void StartCluster(int n, int collective_ms = 15000, int join_timeout_ms = 8000,
                    const std::string& extra_yaml = "") {
    daemons_.clear();
    for (int i = 0; i < n; ++i) daemons_.push_back(std::make_unique<ClusterDaemon>());
    for (int i = 0; i < n; ++i) {
      const std::string listen = i == 0 ? coordinator_ : Loopback(FreePort());
      const std::string yaml = ClusterYaml(coordinator_, listen, n, token_, join_timeout_ms) +
                               "  node_rank: " + std::to_string(i) +
                               "\ntimeouts:\n  collective_ms: " + std::to_string(collective_ms) +
                               "\nengine:\n  threads: 2\n" + extra_yaml;
      ASSERT_TRUE(daemons_[i]->process.Start(yaml, {}, {}, /*wait_ready=*/false));
    }
    for (int i = 0; i < n; ++i) {
      ASSERT_TRUE(daemons_[i]->process.WaitReady(kFormMs)) << daemons_[i]->log();
    }
    for (int i = 0; i < n; ++i) {
      v1::NodesResponse view;
      ASSERT_TRUE(Eventually(
          [&] { return QueryNodes(daemons_[i]->socket(), &view) && AliveNodes(view) == n; },
          kFormMs))
          << view.DebugString() << daemons_[i]->log();
    }
  }

  std::string Socket(int node) const { return daemons_[node]->socket(); }
  std::string Logs() const {
    std::string all;
    for (size_t i = 0; i < daemons_.size(); ++i) {
      all += "--- daemon " + std::to_string(i) + " log (tail) ---\n";
      const std::string log = daemons_[i]->log();
      all += log.size() > 6000 ? log.substr(log.size() - 6000) : log;
    }
    return all;
  }

  // Runs one child per rank (rank r on node placement[r]) and expects each
  // to exit 0; prints their output and the daemons' logs otherwise.
  void RunRanks(const std::vector<int>& placement,
                const std::function<int(Trainer*, int rank)>& body) {
    const int world = static_cast<int>(placement.size());
    std::vector<std::unique_ptr<Child>> children;
    for (int r = 0; r < world; ++r) {
      const std::string socket = Socket(placement[r]);
      const std::string job = job_;
      const std::string done = shared_.File("done");
      const std::string sync_dir = shared_.path();
      children.push_back(std::make_unique<Child>([=](FILE* out) {
        Trainer T;
        T.out = out;
        T.world = world;
        T.sync_dir = sync_dir;
        if (!Attach(&T, socket, job, r, world)) return 2;
        const int rc = body(&T, r);
        // Nobody detaches (which ends the group's epoch) before all are done.
        WriteFile(done + std::to_string(r), "");
        for (int i = 0; i < world; ++i) {
          if (!WaitFile(done + std::to_string(i), kChildMs)) return 5;
        }
        return rc;
      }));
    }
    for (int r = 0; r < world; ++r) {
      const int rc = children[r]->Finish(kChildMs);
      EXPECT_EQ(rc, 0) << "rank " << r << " on node " << placement[r] << ":\n"
                       << children[r]->output() << Logs();
    }
  }

  TempDir shared_;
  std::string token_;
  std::string coordinator_;
  std::string job_ = "xjob";
  std::vector<std::unique_ptr<ClusterDaemon>> daemons_;
};

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_CLUSTER_FIXTURE_H_
