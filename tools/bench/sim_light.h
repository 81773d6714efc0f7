// hsdp-membership-sim's light members (--members=light) and the case that
// runs them.
//
// LightFleet: many simulated members on a few worker threads. Shared: the
// worker threads (member i belongs to thread i % threads, which beats its
// members in turn, each at its own phase of the heartbeat interval) and the
// channels (member i calls through client i % channels; gRPC multiplexes
// the calls of one channel on its connection). A worker joins its members
// one after the other and beats each one heartbeat interval after its join,
// then every interval (the earliest due first, overdue beats before the
// next join), so a member that joined early is never declared lost while
// the others join. Not simulated: views, PeerEvents, group events. What a
// join and a beat are is the store's (JoinOnce, BeatOnce):
//
// CoordinatorFleet (the embedded store): a member keeps its rank, instance,
// epoch (named as its nodes_epoch: it holds the list as far as it cares,
// and takes each answer's delta and drops it) and group-event cursor. It
// joins with list_optional and heartbeats through the real ClusterClient
// (the real gRPC stubs) against the real coordinator, joining again when
// told (FAILED_PRECONDITION).
//
// EtcdFleet (sim_light_etcd.h): a member keeps its rank, instance and lease;
// it joins as EtcdMember does (EtcdJoin's checks and claim, its own lease)
// and renews its lease on its own keep-alive stream.
//
// Thread-safe: Start, WaitJoined and Stop from one thread; the counters and
// Crash from any.
#ifndef HSDP_TOOLS_BENCH_SIM_LIGHT_H_
#define HSDP_TOOLS_BENCH_SIM_LIGHT_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "daemon/cluster/cluster_client.h"
#include "tools/bench/sim_case.h"
#include "tools/bench/sim_stores.h"

namespace hsdp::sim {

// Real ClusterMembers in a light case: the loss phase's observers.
constexpr int kObservers = 16;

class LightFleet {
 public:
  struct Options {
    uint32_t cluster_nodes = 0;  // cluster.nodes
    int count = 0;               // light members
    int first_port = 20000;      // member i's address is 127.0.0.1:first_port+i (never dialled)
    int threads = 64;
    int channels = 4;
    absl::Duration heartbeat = absl::Seconds(1);
    absl::Duration join_timeout = absl::Seconds(120);
  };

  explicit LightFleet(Options options);
  // A subclass's destructor calls Stop() first: the workers call its JoinOnce
  // and BeatOnce.
  virtual ~LightFleet();

  // Starts the worker threads: they join their members, then heartbeat.
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until every member joined or gave up (join_timeout per member),
  // or `deadline`; true in the first case. Sets how many joined so far and
  // the last error of each that gave up (counted by message).
  bool WaitJoined(absl::Time deadline, int* joined, std::map<std::string, int>* failures)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Ends the workers (joins the threads). Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // Member i stops heartbeating, without a goodbye.
  void Crash(int i) { members_[i].crashed.store(true); }

  int rank(int i) const { return members_[i].rank; }
  std::string address(int i) const;
  uint64_t rpcs() const { return rpcs_.load(std::memory_order_relaxed); }
  uint64_t rejoins() const { return rejoins_.load(std::memory_order_relaxed); }
  uint64_t failed_beats() const { return failed_beats_.load(std::memory_order_relaxed); }
  // The most a heartbeat went out after its time (the fleet keeping up).
  absl::Duration worst_lag() const {
    return absl::Nanoseconds(worst_lag_ns_.load(std::memory_order_relaxed));
  }
  void ResetWorstLag() { worst_lag_ns_.store(0, std::memory_order_relaxed); }
  // What the joins so far cost the store beyond their calls, for the report
  // ("" when the store says nothing more).
  virtual std::string JoinStats() const { return ""; }

 protected:
  struct Member {
    int32_t rank = -1;  // set by JoinOnce
    std::string instance;
    std::atomic<bool> crashed{false};
  };
  // One join of member i: sets members_[i].rank.
  virtual absl::Status JoinOnce(int i, absl::Duration timeout) = 0;
  // One heartbeat of joined member i; false when it failed.
  virtual bool BeatOnce(int i, absl::Duration timeout) = 0;
  void CountCall(uint64_t n = 1) { rpcs_.fetch_add(n, std::memory_order_relaxed); }
  void CountRejoin() { rejoins_.fetch_add(1, std::memory_order_relaxed); }
  const Options& options() const { return options_; }
  Member& member(int i) { return members_[i]; }

 private:
  // A worker's own wait: thousands of timed waits a second on one shared
  // mutex (mu_) cost the simulator more than its calls (absl::Mutex looks
  // at every waiter's condition on each release).
  struct Sleeper {
    std::mutex mu;
    std::condition_variable cv;
  };
  // Worker `thread` waits until `until` or Stop(); true when stopping.
  bool SleepUntil(int thread, absl::Time until);
  // Joins member i (on worker `thread`), retrying transient errors until
  // join_timeout.
  absl::Status JoinWithRetries(int thread, int i);
  void Beat(int i);
  void WorkerLoop(int thread) ABSL_LOCKS_EXCLUDED(mu_);
  bool JoinedAllLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_.load() || joined_ + gave_up_ == options_.count;
  }

  const Options options_;
  std::unique_ptr<Member[]> members_;  // member i is touched by thread i % threads only
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<Sleeper>> sleepers_;  // worker t's: sleepers_[t]
  std::atomic<bool> stop_{false};  // set under mu_: WaitJoined's condition reads it
  absl::Mutex mu_;
  int threads_started_ = 0;
  int joined_ ABSL_GUARDED_BY(mu_) = 0;
  int gave_up_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int> failures_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> rpcs_{0}, rejoins_{0}, failed_beats_{0};
  std::atomic<int64_t> worst_lag_ns_{0};
};

// The embedded store's light members.
class CoordinatorFleet : public LightFleet {
 public:
  CoordinatorFleet(const std::string& coordinator, Options options);
  ~CoordinatorFleet() override { Stop(); }

 private:
  struct State {
    uint64_t epoch = 0;         // and nodes_epoch
    uint64_t events_after = 0;  // group event cursor
  };
  absl::Status JoinOnce(int i, absl::Duration timeout) override;
  bool BeatOnce(int i, absl::Duration timeout) override;
  ClusterClient& ClientOf(int i) { return *clients_[i % clients_.size()]; }

  std::vector<std::unique_ptr<ClusterClient>> clients_;
  std::unique_ptr<State[]> state_;  // member i's: touched by its worker only
};

// One case of --members=light: N - kObservers light members and kObservers
// real members (ClusterMember against an hsdpd coordinator, or EtcdMember
// against a 3-member etcd; `kind` "embedded" or "etcd").
Result RunLightCase(const std::string& kind, int n, const Flags& flags);

}  // namespace hsdp::sim

#endif  // HSDP_TOOLS_BENCH_SIM_LIGHT_H_
