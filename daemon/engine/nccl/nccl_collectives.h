// NcclCollectives: the collective interface on libnccl (built only with
// HSDP_WITH_CUDA). Communicators are created non-blocking
// (ncclConfig_t.blocking = 0): calls may return ncclInProgress, which is
// success here — the engine polls Query() for readiness and errors.
// libnccl is loaded at run time (NcclLibrary: dlopen, never linked), so one
// binary starts on nodes without NCCL; ShrinkRanks uses ncclCommShrink
// (NCCL >= 2.27) when the loaded library has it, SupportsShrink() says
// false otherwise.
//
// Handles: a CommHandle is the ncclComm_t value; the device of each is
// remembered so every call sets it first.
// Thread-safety: as the interface (calls on different communicators from
// different threads are fine; a group belongs to the thread that opened it).
#ifndef HSDP_DAEMON_ENGINE_NCCL_NCCL_COLLECTIVES_H_
#define HSDP_DAEMON_ENGINE_NCCL_NCCL_COLLECTIVES_H_

#include <map>
#include <memory>
#include <mutex>

#include "daemon/engine/nccl/collectives_api.h"

namespace hsdp::nccl {

struct NcclLibrary;

class NcclCollectives : public Collectives {
 public:
  // On the process's libnccl (NcclLibrary::Default): fails, saying where it
  // looked, when there is none.
  static absl::StatusOr<std::unique_ptr<NcclCollectives>> Create();
  explicit NcclCollectives(const NcclLibrary* lib);  // lib outlives this
  ~NcclCollectives() override;

  std::string name() const override;
  bool SupportsShrink() const override;
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

 private:
  absl::StatusOr<int> DeviceOf(CommHandle comm) const;
  absl::Status Prepare(CommHandle comm) const;  // sets the communicator's device

  const NcclLibrary* const lib_;
  mutable std::mutex mu_;
  std::map<CommHandle, int> devices_;  // guarded by mu_
};

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_NCCL_COLLECTIVES_H_
