// The plan of a collective whose members share GPUs (see shared_device_plan.h).
#include "daemon/engine/nccl/shared_device_plan.h"

#include <algorithm>
#include <utility>

#include "daemon/engine/nccl/reduce_plan.h"
#include "hsdp/common/status_macros.h"

namespace hsdp::nccl {

SharedDevicePlan::Ranks SharedDevicePlan::AssignRanks(const std::vector<int>& member_devices) {
  Ranks out;
  out.comm_of.assign(member_devices.size(), -1);
  for (size_t i = 0; i < member_devices.size(); ++i) {
    const int d = member_devices[i];
    auto pos = std::find(out.devices.begin(), out.devices.end(), d);
    if (pos == out.devices.end()) {
      out.devices.push_back(d);
      pos = out.devices.end() - 1;
    }
    out.comm_of[i] = static_cast<int>(pos - out.devices.begin());
  }
  return out;
}

SharedDevicePlan::SharedDevicePlan(std::vector<int> comm_of, int comms)
    : comm_of_(std::move(comm_of)), members_(comms == 0 ? 1 : comms), nccl_(comms != 0) {
  for (int r = 0; r < static_cast<int>(comm_of_.size()); ++r) members_[comm_of_[r]].push_back(r);
}

bool SharedDevicePlan::ContiguousRuns() const {
  const size_t k = members_[0].size();
  for (size_t c = 0; c < members_.size(); ++c) {
    if (members_[c].size() != k) return false;
    for (size_t i = 0; i < members_[c].size(); ++i) {
      if (members_[c][i] != static_cast<int>(c * k + i)) return false;
    }
  }
  return true;
}

absl::StatusOr<SharedDevicePlan::Reduce> SharedDevicePlan::PlanReduction(const EngineTask& t,
                                                                          bool fuse) const {
  const int n = static_cast<int>(t.members.size());
  const DataType dt = t.spec.dtype;
  ASSIGN_OR_RETURN(DeviceReducePlan plan, PlanReduce(t.spec, n));
  // One plan for every op: scale the inputs, combine, scale the output.
  Reduce r;
  r.in_scale = plan.op == ReduceOp::kPremulSum ? plan.premul : plan.in_scale;
  r.out_scale = plan.op == ReduceOp::kAvg ? 1.0 / n : plan.out_scale;
  const bool sum_like = plan.op == ReduceOp::kSum || plan.op == ReduceOp::kAvg ||
                        plan.op == ReduceOp::kPremulSum;
  r.op = sum_like ? ReduceOp::kSum : plan.op;
  r.wire = plan.cast ? plan.wire : dt;
  const bool rs = t.collective == Collective::kReduceScatter;
  const uint64_t block_bytes = t.count * DataTypeSize(dt);
  r.fused = !nccl_ && r.wire == dt && fuse && FusableInPlace(t, block_bytes, rs);
  if (!nccl_) {
    r.between = Between::kNone;
  } else {
    // Contiguous, equal runs: half an all-reduce's traffic; device c's
    // result lands in its own run of the accumulator, so member r still
    // takes block r.
    r.between = rs && ContiguousRuns() ? Between::kReduceScatter : Between::kAllReduce;
  }
  return r;
}

// Anything else than apart or the same index (a partial overlap) takes the
// scratch path, whose result does not depend on the order of reads and writes.
bool SharedDevicePlan::FusableInPlace(const EngineTask& t, uint64_t block_bytes, bool rs) {
  const int n = static_cast<int>(t.members.size());
  for (int r = 0; r < n; ++r) {
    const uint64_t o = reinterpret_cast<uint64_t>(t.members[r].recv.data);
    for (int j = 0; j < n; ++j) {
      const uint64_t in = reinterpret_cast<uint64_t>(t.members[j].send.data);
      const uint64_t in_bytes = rs ? block_bytes * n : block_bytes;
      const bool apart = o + block_bytes <= in || in + in_bytes <= o;
      const bool same_index = o == in + (rs ? uint64_t(r) * block_bytes : 0);
      if (!apart && !same_index) return false;
    }
  }
  return true;
}

}  // namespace hsdp::nccl
