// FakeCollectives: the collective interface over FakeDeviceApi, for tests and
// CI. It really runs the collectives: every communicator of a clique (one
// unique id) is hosted here, each rank's work runs on its fake stream, and
// the ranks meet at a rendezvous where the last to arrive computes the result
// in host memory (the CPU reduce kernels) for all of them. A group call
// (GroupStart..GroupEnd) is one batch per communicator, so send/recv pairs in
// a group never deadlock — as in NCCL.
//
// It is strict where real NCCL would hang or misbehave: a collective on a
// clique with more than one rank issued outside a group call is refused
// (one thread driving several ranks must use a group); two ranks on one
// device are refused at init; every call on an aborted communicator fails.
// Group state is per thread, as in NCCL. Release must end, in one call, every
// live communicator of a clique that the calling thread created (NCCL's
// finalize waits for global quiescence and its abort synchronises a clique's
// local ranks: one at a time from one thread hangs) — refused otherwise.
// Release waits, as NCCL's free does through its device synchronisation, for
// the work already queued for the communicators to start; work queued behind
// an event that never fires makes it give up after a bound (real NCCL would
// hang there) and, if that work starts after the release, it is a kernel of
// a freed communicator: the fake device records a sticky fault.
//
// Test hooks: the calls and group batches made so far (which stream, which
// rank), Stall() (collectives issued while stalled never finish until their
// communicator is aborted — a lost peer), FailAsync() (an asynchronous error
// on one communicator), counts of live / aborted communicators.
//
// Thread-safety: all methods are thread-safe; group state is shared (the
// engine issues everything from one thread). Lock order: mu_ before a
// clique's mutex; no lock is held while waiting on a stream.
#ifndef HSDP_DAEMON_ENGINE_NCCL_FAKE_COLLECTIVES_H_
#define HSDP_DAEMON_ENGINE_NCCL_FAKE_COLLECTIVES_H_

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/device/fake_device_api.h"
#include "daemon/engine/nccl/collectives_api.h"

namespace hsdp::nccl {

class FakeCollectives : public Collectives {
 public:
  struct Call {
    std::string kind;  // "all_reduce", "all_gather", "reduce_scatter", "broadcast", "send", "recv"
    CommHandle comm = 0;
    int rank = -1;
    StreamHandle stream = 0;
    uint64_t count = 0;
    DataType dtype = DataType::kInvalid;
    RedOp op;
    double premul = 1.0;  // kPremulSum: the scalar
    int peer = -1;        // send / recv
  };

  struct Item;  // one call with its operands (defined in the .cc)

  explicit FakeCollectives(device::FakeDeviceApi* dev, bool supports_shrink = true);
  ~FakeCollectives() override;

  std::string name() const override { return "fake-nccl"; }
  bool SupportsShrink() const override { return supports_shrink_; }
  absl::StatusOr<UniqueId> NewUniqueId() override;
  absl::StatusOr<std::vector<CommHandle>> InitRanks(const UniqueId& id, int nranks,
                                                    const std::vector<int>& ranks,
                                                    const std::vector<int>& devices) override;
  absl::StatusOr<std::vector<CommHandle>> ShrinkRanks(const std::vector<CommHandle>& comms,
                                                      const std::vector<int>& exclude) override;
  absl::Status GroupStart() override;
  absl::Status GroupEnd() override;
  absl::Status AllReduce(DevicePtr send, DevicePtr recv, uint64_t count, DataType dtype, RedOp op,
                         CommHandle comm, StreamHandle stream) override;
  absl::Status AllGather(DevicePtr send, DevicePtr recv, uint64_t send_count, DataType dtype,
                         CommHandle comm, StreamHandle stream) override;
  absl::Status ReduceScatter(DevicePtr send, DevicePtr recv, uint64_t recv_count, DataType dtype,
                             RedOp op, CommHandle comm, StreamHandle stream) override;
  absl::Status Broadcast(DevicePtr send, DevicePtr recv, uint64_t count, DataType dtype, int root,
                         CommHandle comm, StreamHandle stream) override;
  absl::Status Send(DevicePtr buf, uint64_t count, DataType dtype, int peer, CommHandle comm,
                    StreamHandle stream) override;
  absl::Status Recv(DevicePtr buf, uint64_t count, DataType dtype, int peer, CommHandle comm,
                    StreamHandle stream) override;
  absl::StatusOr<RedOp> CreatePreMulSum(double scalar, DataType dtype, CommHandle comm) override;
  void DestroyRedOp(RedOp op, CommHandle comm) override;
  AsyncState Query(CommHandle comm, absl::Status* error) override;
  absl::Status Release(const std::vector<CommHandle>& comms, bool abort) override;

  // --- test hooks ---
  std::vector<Call> calls() const;
  // One entry per GroupEnd that closed the outermost group (in order).
  std::vector<std::vector<Call>> batches() const;
  // While set, collectives issued never finish until aborted.
  void Stall(bool stall);
  // Makes Query(comm) report `error` (a lost peer).
  void FailAsync(CommHandle comm, absl::Status error);
  // Query reports kInProgress this many times after each init (default 1).
  void set_init_polls(int n);
  // How long Release waits for queued work before giving up (default 2 s).
  void set_release_bound(std::chrono::milliseconds bound);
  int live_comms() const;
  int aborted_comms() const;
  int inits() const;
  int premul_ops_live() const;

 private:
  struct Clique;
  struct Comm;

  absl::Status Issue(Item item) ;
  absl::StatusOr<std::shared_ptr<Comm>> FindComm(CommHandle h) const;
  // Enqueues `items` (one communicator's share of a batch) on its stream.
  absl::Status Enqueue(std::vector<Item> items);

  device::FakeDeviceApi* const dev_;
  const bool supports_shrink_;
  mutable std::mutex mu_;
  std::map<CommHandle, std::shared_ptr<Comm>> comms_;  // guarded by mu_
  std::map<std::string, std::shared_ptr<Clique>> cliques_;  // by unique id; guarded by mu_
  std::map<int64_t, double> premul_;                    // guarded by mu_
  std::vector<Call> calls_;                             // guarded by mu_
  std::vector<std::vector<Call>> batches_;              // guarded by mu_
  struct Group {
    int depth = 0;
    std::vector<Item> pending;
  };
  std::map<std::thread::id, Group> groups_;             // open groups; guarded by mu_
  std::chrono::milliseconds release_bound_{2000};       // guarded by mu_
  bool stall_ = false;                                  // guarded by mu_
  int init_polls_ = 1;                                  // guarded by mu_
  uint64_t next_handle_ = 1;                            // guarded by mu_
  uint64_t next_id_ = 1;                                // guarded by mu_
  int aborted_ = 0;                                     // guarded by mu_
  int inits_ = 0;                                       // guarded by mu_
};

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_FAKE_COLLECTIVES_H_
