// Fakes beside the Engine interface, for tests of everything above it.
//
// FakeStreamEngine behaves like a stream-ordered device engine: Launch()
// orders the task at once (`launched` is called before Launch returns, unless
// launches are held) and the task completes only when the test says so —
// Finish()/Complete() with a chosen status, or Execute() which really runs
// it on host memory (with the CPU engine's kernels). It checks the contract:
// a task never completes before the tasks it depends on, and fails when one
// of them failed; Abort() completes a task with the abort status, as an NCCL
// communicator abort would.
//
// FakeFabric joins several FakeStreamEngines, one per simulated node, into a
// cross-node transport: a task whose group spans nodes runs once every node
// hosting members has launched its part (same group key, epoch and seq), on
// all nodes' buffers together. KillNode() fails every task that needs the
// node and tells the registered listeners (the groups) that it was lost.
//
// Thread-safety: all methods are thread-safe; callbacks run without locks.
#ifndef HSDP_DAEMON_ENGINE_FAKE_FAKE_ENGINE_H_
#define HSDP_DAEMON_ENGINE_FAKE_FAKE_ENGINE_H_

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "daemon/engine/engine.h"

namespace hsdp {

class FakeFabric;

class FakeStreamEngine : public Engine {
 public:
  explicit FakeStreamEngine(int node = 0, FakeFabric* fabric = nullptr);

  absl::Status CreateGroup(const EngineGroupSpec& spec) override;
  void DestroyGroup(const std::string& key) override;
  uint64_t Launch(EngineTask task, EngineCallbacks callbacks) override;
  void Abort(uint64_t ticket, const absl::Status& why) override;
  void Shutdown() override;
  std::string name() const override { return "fake-stream"; }
  int threads() const override { return 1; }
  bool Supports(MemoryKind) const override { return true; }
  bool SupportsRemoteMembers() const override { return true; }

  // Held launches: Launch() queues and `launched` waits for LaunchNext().
  void HoldLaunches(bool hold);
  // Orders the oldest held task; false when none.
  bool LaunchNext();

  // Tasks launched and not completed, oldest first.
  size_t pending() const;
  int launched() const;      // tasks ever launched
  int created_groups() const;
  std::vector<uint64_t> aborted() const;  // tickets Abort() was called for
  EngineTask front() const;               // the oldest pending task (copy)
  uint64_t front_ticket() const;

  // Completes the oldest pending task with `status`; returns its task.
  EngineTask Finish(absl::Status status = absl::OkStatus(), uint64_t exec_ns = 1000);
  // Completes `ticket`. FAILED_PRECONDITION when it is not pending or a task
  // it depends on is still pending (the contract the fake enforces).
  absl::Status Complete(uint64_t ticket, absl::Status status, uint64_t exec_ns = 1000);
  // Runs the oldest pending task on host memory (all members local) and
  // completes it.
  absl::Status Execute();

 private:
  friend class FakeFabric;
  struct Entry {
    uint64_t ticket = 0;
    EngineTask task;
    EngineCallbacks cb;
  };
  // Removes `ticket` from pending_ and calls its completion.
  absl::Status CompleteLocked(std::unique_lock<std::mutex>& l, uint64_t ticket,
                              absl::Status status, uint64_t exec_ns);

  const int node_;
  FakeFabric* const fabric_;
  mutable std::mutex mu_;
  uint64_t next_ticket_ = 1;
  bool hold_ = false;
  bool shut_down_ = false;
  int launched_ = 0;
  std::set<std::string> groups_;
  std::deque<Entry> held_;
  std::deque<Entry> pending_;
  std::map<uint64_t, absl::Status> done_;  // finished tickets and their outcome
  std::vector<uint64_t> aborted_;
};

class FakeFabric {
 public:
  void Register(FakeStreamEngine* engine, int node);
  // Listeners hear of lost nodes (a group: PeerLost).
  void OnNodeLost(std::function<void(int node, const std::string& why)> listener);

  // Runs every cross-node task whose parts were launched on all the nodes it
  // needs; returns how many ran.
  int RunReady();
  // Fails every pending task involving `node` (UNAVAILABLE) and tells the
  // listeners.
  void KillNode(int node, const std::string& why);

 private:
  std::mutex mu_;
  std::map<int, FakeStreamEngine*> engines_;
  std::set<int> dead_;
  std::vector<std::function<void(int, const std::string&)>> listeners_;
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_ENGINE_FAKE_FAKE_ENGINE_H_
