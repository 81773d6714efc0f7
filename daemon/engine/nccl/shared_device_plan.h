// SharedDevicePlan: how the NCCL engine runs a collective whose members
// share GPUs. NCCL refuses two ranks of one communicator on the same device,
// so a node whose trainers share a GPU (several per GPU, MPS) runs the
// hierarchical shape the CPU engine has across nodes: within each device
// hsdpd's own kernels work on the members' buffers (all mapped in the
// daemon), and between devices NCCL runs with one rank per device. With every
// member on one device there is no communicator at all. The plan per
// collective (n members, D devices, each device's members M_d, all on the
// device's one stream of the set):
//
//   all-reduce      acc_d = op over M_d of (wire) (send * in_scale)   [reduce kernel, scratch]
//                   D > 1: NCCL all-reduce of acc_d (sum for sum/avg/premul, else the op)
//                   recv_r = (dtype) (acc_d * out_scale) for r in M_d  [scale/cast or copy]
//                   D = 1, no reduce dtype, outputs apart from or equal to the inputs
//                   they are computed from: fused, straight into every recv_r
//   reduce-scatter  as all-reduce over the whole n*count input, then member r takes
//                   block r of acc_d; between devices an NCCL reduce-scatter of k
//                   blocks per device when every device holds k members with
//                   contiguous indices (r on device r / k), else an all-reduce (a
//                   device's members need not hold contiguous blocks)
//   all-gather      G_d[r] = send_r for r in M_d; D > 1: one NCCL broadcast per
//                   member block from its device (one group call); recv_r = G_d
//   broadcast       D > 1: NCCL broadcast from the root's device into one member per
//                   device; the device's other members copy from it
//   all-to-all      same device: copies; across devices: ncclSend/ncclRecv pairs in
//                   one group call, issued in one global (sender, receiver) order
//
// The reduce plan keeps the semantics of reduce_plan.h: the pre-divide and a
// PreMulSum factor scale every input in the reduce kernel, AVG's 1/n and the
// post-divide scale the output, a reduce dtype is the scratch's (wire) type.
//
// This class holds the decisions (which member is on which device's rank,
// what runs within a device and what goes through NCCL); the engine issues
// them (nccl_engine_shared.cc). Immutable once built; thread-safe.
#ifndef HSDP_DAEMON_ENGINE_NCCL_SHARED_DEVICE_PLAN_H_
#define HSDP_DAEMON_ENGINE_NCCL_SHARED_DEVICE_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "daemon/engine/engine.h"
#include "hsdp/kernels/reduce_spec.h"
#include "hsdp/types.h"

namespace hsdp::nccl {

class SharedDevicePlan {
 public:
  // One NCCL rank per distinct device of a group whose members are all on
  // this node, numbered in order of first appearance.
  struct Ranks {
    std::vector<int> comm_of;  // member -> its device's NCCL rank
    std::vector<int> devices;  // NCCL rank -> device
    // Several members on one device: the intra-device plan runs.
    bool shared() const { return devices.size() < comm_of.size(); }
  };
  static Ranks AssignRanks(const std::vector<int>& member_devices);

  // What happens between devices after the intra-device reduction.
  enum class Between {
    kNone,           // one device: no NCCL
    kReduceScatter,  // k blocks per device (contiguous, equal runs of members)
    kAllReduce,      // the whole accumulator
  };
  struct Reduce {
    ReduceOp op = ReduceOp::kSum;  // of the kernel and NCCL: kSum for sum, avg, premul_sum
    double in_scale = 1.0;         // every input, in the reduce kernel
    double out_scale = 1.0;        // the output (AVG's 1/n included)
    DataType wire = DataType::kInvalid;  // the accumulator's type
    // Straight into the members' outputs (one device, no reduce dtype,
    // FusableInPlace): no scratch, no NCCL.
    bool fused = false;
    Between between = Between::kNone;  // when not fused
  };

  // `comm_of`: member index -> its device's NCCL rank (0 for every member
  // when there is no communicator); `comms`: communicators of the set (0:
  // every member on one device, no NCCL).
  SharedDevicePlan(std::vector<int> comm_of, int comms);

  int devices() const { return static_cast<int>(members_.size()); }
  bool nccl() const { return nccl_; }
  // The members on device index `c` (communicator order), ascending.
  const std::vector<int>& members(int c) const { return members_[c]; }
  int device_of(int member) const { return comm_of_[member]; }
  // Every device holds the same number k of members, member r on device r / k.
  bool ContiguousRuns() const;

  // The plan of an all-reduce or reduce-scatter `t` (whose spec.dtype is the
  // buffers' type); `fuse`: NcclEngineOptions::fuse_shared_reduce. Errors as
  // PlanReduce (reduce_plan.h).
  absl::StatusOr<Reduce> PlanReduction(const EngineTask& t, bool fuse) const;

  // Whether the fused reduction may write the members' outputs while it
  // reads their inputs: each output is either apart from every input or
  // exactly the range of an input that the kernel writing it reads at the
  // same index (its own block of a reduce-scatter input, a whole all-reduce
  // input). `block_bytes`: one output's bytes.
  static bool FusableInPlace(const EngineTask& t, uint64_t block_bytes, bool rs);

 private:
  std::vector<int> comm_of_;
  std::vector<std::vector<int>> members_;
  bool nccl_;
};

}  // namespace hsdp::nccl

#endif  // HSDP_DAEMON_ENGINE_NCCL_SHARED_DEVICE_PLAN_H_
