// The NCCL engine: runs matched collectives on device buffers (memory the
// trainers share with the daemon, mapped in the daemon's context) with
// communicators the daemon owns — one NCCL rank per member GPU, the
// communicators of all local members driven together in one group call.
//
// Ordering: a task is issued once its members' producer events
// (EngineMember::wait_event) completed — the engine thread polls them, it
// never blocks on one — and the engine records each member's completion
// event (done_event) after the collective; a dependent task (the HSDP
// composite's all-reduce) is issued once its dependencies finished (no
// stream waits on another communicator set's work: aborting a set would
// then wait for that work). Streams: each communicator
// set (group and epoch) has its own — one high-priority stream per device for
// all-gather and reduce-scatter, one default-priority stream per device for
// everything else, so the replicate all-reduce overlaps the shard
// collectives (as FSDP2 does). Never one stream for several sets: NCCL
// kernels block until their peers arrive, so two daemons issuing two groups
// in opposite orders onto one shared stream each would deadlock.
//
// Reduce specs: see reduce_plan.h (PreMulSum / ncclAvg, fused scale+cast
// kernels, a reduce dtype on the wire through per-stream scratch buffers).
// All-to-all runs as ncclSend/ncclRecv pairs inside one group call.
//
// Failure: communicators are non-blocking. A task that is not done
// `op_timeout` after launch, an asynchronous communicator error (a lost
// peer) or Abort() aborts the task's communicators; every task in flight on
// them completes with the error (never a hang), and later tasks of that
// group epoch fail at once. A new epoch (CreateGroup) gets new
// communicators: ShrinkRanks of the old ones when they are healthy, the
// member set shrank and the library supports it, else a fresh init, with
// streams of its own; a released set's streams and scratch buffers are freed
// once a marker event recorded behind its last work completed. A group's
// next task waits on the device for the previous one whenever the two run on
// different streams. After Shutdown(), tasks still running past
// `shutdown_grace` are aborted.
//
// Across nodes (a group with members on other daemons; options.exchange_id
// set): each daemon owns the NCCL ranks of its own members — a member's NCCL
// rank is its index in the group — and issues only their calls; the daemons
// agree on the communicator's unique id per group epoch through the exchange
// (the coordinator's store), the daemon hosting the first member creating
// it. No shrink across nodes: a new epoch initialises anew.
//
// Producer events and failure: a task is issued only
// once its members' producer events completed (polled on the engine thread;
// the device is never asked to wait on a trainer's event), so an abort never
// leaves work queued behind an event that may never fire, to run after the
// communicator was freed and the memory unmapped. A failed task completes
// only once the device passed its work (or after shutdown_grace).
//
// Files: nccl_engine.cc (lifecycle, polling, failure), nccl_engine_issue.cc
// (communicator sets, streams, issuing a task), nccl_engine_gate.cc (the
// engine's side of the producer gate, draining failed work),
// nccl_engine_shared.cc (issuing a task whose members share GPUs). Classes of
// their own: ProducerGate (producer_gate.h: holding a task back until its
// producer events completed and its dependencies finished, its abort and
// deadline) and SharedDevicePlan (shared_device_plan.h: which members share a
// device, what runs within a device and what through NCCL).
//
// Threads: one engine thread issues every library call (so group calls are
// never interleaved) and polls in-flight work every `poll_interval`. Launch,
// Abort and CreateGroup only queue work for it. Callbacks run on the engine
// thread (or on the caller's, for tasks refused up front).
// Thread-safety: all public methods are thread-safe; mu_ guards the queue
// and the ticket bookkeeping; engine-thread state is touched only there.
#ifndef HSDP_DAEMON_ENGINE_NCCL_NCCL_ENGINE_H_
#define HSDP_DAEMON_ENGINE_NCCL_NCCL_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/time/time.h"
#include "daemon/device/device_api.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/nccl/collectives_api.h"
#include "daemon/engine/nccl/producer_gate.h"
#include "daemon/engine/nccl/reduce_plan.h"

namespace hsdp::nccl {

struct NcclEngineOptions {
  absl::Duration op_timeout = absl::Seconds(300);  // launch to completion
  absl::Duration init_timeout = absl::Seconds(120);
  absl::Duration poll_interval = absl::Microseconds(50);
  // While work is in flight and the engine made progress (a task arrived,
  // one completed) within this window, the engine thread polls without
  // sleeping (yielding the core between queries), so a short collective's
  // completion is seen within microseconds; past it, it polls every
  // poll_interval. Zero: always poll_interval (a sleep of 50 us is 60-150 us
  // on Linux: the first run on an H100 measured 130 us added at 16 MiB).
  absl::Duration spin_window = absl::Microseconds(500);
  // Members that all share one GPU: reduce straight into their outputs
  // (ReduceToManyAsync) instead of into scratch and copying out. Off only to
  // measure the difference (hsdp-gpu-bench --members).
  bool fuse_shared_reduce = true;
  // After Shutdown(), tasks still running get this long before their
  // communicators are aborted.
  absl::Duration shutdown_grace = absl::Seconds(10);
  // Groups with members on other nodes: how the daemons agree on the unique
  // id of a communicator set (the daemon's goes through the coordinator's
  // key/value store). Every daemon calls it with the same `key`; the one
  // hosting the group's first member is the `creator` and publishes `mine`,
  // the others wait for it until `deadline`; `nodes` daemons take part.
  // Unset: such groups are refused (UNIMPLEMENTED).
  std::function<absl::StatusOr<UniqueId>(const std::string& key, bool creator,
                                         const UniqueId& mine, int nodes, absl::Time deadline)>
      exchange_id;
};

// Engine-level counters for status output and tests.
struct NcclEngineStats {
  uint64_t tasks_completed = 0;
  uint64_t tasks_failed = 0;
  uint64_t comm_inits = 0;
  uint64_t comm_shrinks = 0;
  uint64_t comm_aborts = 0;  // communicator sets aborted
  uint64_t shared_device_tasks = 0;  // tasks whose members share a GPU (own kernels + NCCL)
  uint64_t fused_shared_reduces = 0;  // of those, reductions written straight into the outputs
  uint64_t gated_tasks = 0;  // now: launched tasks the producer gate holds back (not issued)
};

class NcclEngine : public Engine {
 public:
  // `dev` and `coll` must outlive the engine.
  NcclEngine(device::DeviceApi* dev, Collectives* coll, NcclEngineOptions options = {});
  ~NcclEngine() override;

  absl::Status CreateGroup(const EngineGroupSpec& spec) override;
  void DestroyGroup(const std::string& key) override;
  uint64_t Launch(EngineTask task, EngineCallbacks callbacks) override;
  void Abort(uint64_t ticket, const absl::Status& why) override;
  void Shutdown() override;
  std::string name() const override { return "nccl"; }
  int threads() const override { return 1; }
  bool Supports(MemoryKind kind) const override { return kind == MemoryKind::kDevice; }
  bool SupportsRemoteMembers() const override { return false; }

  NcclEngineStats stats() const;
  // The stream of the newest communicator set of `group_key` for (device,
  // high priority?), 0 before first use (tests check stream choice with it).
  device::StreamHandle StreamOf(const std::string& group_key, int device, bool high) const;

  // Checks what a task may name before it is queued (exposed for tests).
  static absl::Status ValidateTask(const EngineTask& task, int device_count, bool cross_node);

 private:
  struct CommSet;
  struct Running;
  using Queued = QueuedTask;
  struct Control {  // CreateGroup / DestroyGroup / Abort, run on the engine thread
    enum Kind { kCreate, kDestroy, kAbort } kind;
    EngineGroupSpec spec;
    std::string key;
    uint64_t ticket = 0;
    absl::Status why;
  };

  void Loop();
  void RunControl(const Control& c);
  // Issues one task; on error it is completed with the error.
  void Issue(Queued q);
  absl::Status IssueOrError(Queued& q, Running& run);
  // The data movement of a task whose members share devices (the set is
  // `shared`): nccl_engine_shared.cc.
  absl::Status IssueShared(const EngineTask& t, Running& run,
                           const std::vector<device::StreamHandle>& streams);
  // One group call of `calls` (each issues one rank's NCCL calls), then the
  // wait until the communicators left the in-progress state; on failure the
  // set is failed (aborted).
  absl::Status GroupCall(Running& run, const std::function<absl::Status()>& calls);
  absl::StatusOr<std::shared_ptr<CommSet>> CommsFor(const EngineTask& task);
  // Polls the set's communicators out of kInProgress after a group call.
  absl::Status WaitIssued(const CommSet& set);
  absl::StatusOr<device::StreamHandle> Stream(CommSet& set, int device, bool high);
  absl::StatusOr<device::DevicePtr> Scratch(CommSet& set, device::StreamHandle stream, int device,
                                            int slot, uint64_t bytes);
  // Frees device memory and destroys streams once `marker` (recorded behind
  // the last work that may touch them) completed.
  void RetireBehind(device::EventHandle marker, std::vector<device::DevicePtr> ptrs,
                    std::vector<device::StreamHandle> streams);
  // Releases what RetireBehind queued whose marker is done (all of it, with a
  // bound, when `final`).
  void FreeRetired(bool final);
  void Poll();
  // The producer gate (gate_, producer_gate.h; nccl_engine_gate.cc): a task
  // is issued only once the producer events of its members completed and no
  // task it depends on is still gated or running, in launch order per group;
  // nothing is ever enqueued behind an event that may never fire.
  // ReleaseGated() issues what is ready and fails what waited past its
  // deadline, AbortGated() drops one; FailUnissued() completes a task that
  // never reached the device.
  void ReleaseGated();
  bool AbortGated(uint64_t ticket, const absl::Status& why);
  void FailUnissued(Queued q, const absl::Status& why);
  // A failed task completes (its callbacks release the mappings and buffers
  // it used) only once the device passed its work — its completion events,
  // recorded behind all of it, are done — or after shutdown_grace.
  void Drain(std::unique_ptr<Running> run, absl::Status status);
  void PollDraining();
  // Aborts `set`'s communicators and fails every running task on it.
  void FailSet(const std::shared_ptr<CommSet>& set, const absl::Status& why);
  void Finish(std::unique_ptr<Running> run, absl::Status status);
  void ReleaseSet(const std::shared_ptr<CommSet>& set, bool abort);
  // Releases sets marked `retire` that have nothing in flight.
  void ReleaseRetired();

  device::DeviceApi* const dev_;
  Collectives* const coll_;
  const NcclEngineOptions options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;           // guarded by mu_
  std::deque<Control> control_;        // guarded by mu_
  uint64_t next_ticket_ = 1;           // guarded by mu_
  bool stopping_ = false;              // guarded by mu_
  absl::Time stop_deadline_ = absl::InfiniteFuture();  // guarded by mu_
  bool busy_ = false;                  // guarded by mu_: running tasks exist
  std::map<uint64_t, absl::Status> failed_;   // recent failed tickets; guarded by mu_
  // (group key, device, high) -> the newest set's stream; guarded by mu_ (StreamOf).
  std::map<std::tuple<std::string, int, bool>, device::StreamHandle> stream_index_;
  NcclEngineStats stats_;              // guarded by mu_

  // Engine thread only.
  std::map<std::string, std::shared_ptr<CommSet>> sets_;   // by set key
  std::map<std::string, EngineGroupSpec> groups_;          // by group key
  std::map<uint64_t, std::unique_ptr<Running>> running_;   // by ticket
  ProducerGate gate_;
  // gate_.tasks() as of the engine thread's last pass (stats()).
  std::atomic<uint64_t> gated_tasks_{0};
  struct Draining {
    std::unique_ptr<Running> run;
    absl::Status status;
    absl::Time deadline;
  };
  std::vector<Draining> draining_;
  struct Retired {
    device::EventHandle after;  // 0: nothing to wait for
    std::vector<device::DevicePtr> ptrs;
    std::vector<device::StreamHandle> streams;
  };
  std::vector<Retired> retired_;
  std::thread thread_;
};

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_NCCL_ENGINE_H_
