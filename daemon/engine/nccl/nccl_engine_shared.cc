// Issuing a collective whose members share GPUs: the decisions are
// SharedDevicePlan's (shared_device_plan.h, which also has the plan per
// collective); here they become hsdpd's kernels on the devices' streams of
// the set and NCCL group calls with one rank per device.
#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "daemon/engine/nccl/nccl_engine_state.h"
#include "daemon/engine/nccl/shared_device_plan.h"
#include "hsdp/common/status_macros.h"

namespace hsdp::nccl {
namespace {

device::DevicePtr Ptr(void* p) { return reinterpret_cast<device::DevicePtr>(p); }

}  // namespace

absl::Status NcclEngine::GroupCall(Running& run, const std::function<absl::Status()>& calls) {
  absl::Status issued = coll_->GroupStart();
  if (issued.ok()) issued = calls();
  absl::Status ended = coll_->GroupEnd();
  if (issued.ok()) issued = ended;
  if (issued.ok()) issued = WaitIssued(*run.set);
  if (!issued.ok()) FailSet(run.set, issued);  // partially issued work: abort it
  return issued;
}

absl::Status NcclEngine::IssueShared(const EngineTask& t, Running& run,
                                     const std::vector<device::StreamHandle>& streams) {
  CommSet& set = *run.set;
  const int n = static_cast<int>(t.members.size());
  {
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.shared_device_tasks;
  }
  if (t.collective == Collective::kBarrier) return absl::OkStatus();
  if (t.count == 0 && t.collective != Collective::kAllToAll) return absl::OkStatus();
  const DataType dt = t.spec.dtype;
  const size_t es = DataTypeSize(dt);
  // Devices in communicator order, their members, their streams.
  const SharedDevicePlan plan(set.comm_of, static_cast<int>(set.comms.size()));
  const int nd = plan.devices();
  std::vector<device::StreamHandle> dstream(nd, 0);
  std::vector<int> ddevice(nd, -1);
  for (int r = 0; r < n; ++r) {
    const int c = plan.device_of(r);
    dstream[c] = streams[r];
    ddevice[c] = t.members[r].send.device;
  }
  const bool nccl = plan.nccl();
  auto members = [&](int c) -> const std::vector<int>& { return plan.members(c); };
  auto send = [&](int r) { return Ptr(t.members[r].send.data); };
  auto recv = [&](int r) { return Ptr(t.members[r].recv.data); };
  // Output copy: a scale/cast kernel when needed, else a plain copy.
  auto out = [&](device::DevicePtr src, DataType from, device::DevicePtr dst, uint64_t count,
                 double scale, device::StreamHandle s) -> absl::Status {
    if (from == dt && scale == 1.0) {
      if (src == dst) return absl::OkStatus();
      return dev_->MemcpyAsync(dst, src, count * es, s);
    }
    return dev_->ScaleCastAsync(src, from, dst, dt, count, scale, s);
  };

  switch (t.collective) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter: {
      ASSIGN_OR_RETURN(const SharedDevicePlan::Reduce red,
                       plan.PlanReduction(t, options_.fuse_shared_reduce));
      const double in_scale = red.in_scale, out_scale = red.out_scale;
      const ReduceOp op = red.op;
      const DataType wire = red.wire;
      const size_t ws = DataTypeSize(wire);
      const bool rs = t.collective == Collective::kReduceScatter;
      const uint64_t elems = rs ? t.count * n : t.count;
      if (red.fused) {
        // Every member on this one GPU: the reduction goes straight into the
        // members' outputs (n reads, n writes; no scratch, no copies).
        std::vector<device::DevicePtr> ins(n);
        for (int r = 0; r < n; ++r) ins[r] = send(r);
        if (!rs) {
          std::vector<device::DevicePtr> outs(n);
          for (int r = 0; r < n; ++r) outs[r] = recv(r);
          RETURN_IF_ERROR(dev_->ReduceToManyAsync(ins, dt, outs, dt, t.count, op, in_scale,
                                                  out_scale, dstream[0]));
        } else {
          for (int r = 0; r < n; ++r) {  // member r's block of every input
            std::vector<device::DevicePtr> block(n);
            for (int j = 0; j < n; ++j) block[j] = ins[j] + uint64_t(r) * t.count * es;
            RETURN_IF_ERROR(dev_->ReduceToManyAsync(block, dt, {recv(r)}, dt, t.count, op,
                                                    in_scale, out_scale, dstream[0]));
          }
        }
        std::lock_guard<std::mutex> l(mu_);
        ++stats_.fused_shared_reduces;
        return absl::OkStatus();
      }
      std::vector<device::DevicePtr> acc(nd);
      for (int c = 0; c < nd; ++c) {
        ASSIGN_OR_RETURN(acc[c], Scratch(set, dstream[c], ddevice[c], 0, elems * ws));
        std::vector<device::DevicePtr> ins;
        for (int r : members(c)) ins.push_back(send(r));
        RETURN_IF_ERROR(dev_->ReduceAsync(ins, dt, acc[c], wire, elems, op, in_scale,
                                          /*accumulate=*/false, dstream[c]));
      }
      // Between devices (SharedDevicePlan::Between): with contiguous runs,
      // device c's result lands in its own run of acc, so member r still
      // takes block r.
      const bool runs = red.between == SharedDevicePlan::Between::kReduceScatter;
      const size_t k = members(0).size();
      if (nccl) {
        RETURN_IF_ERROR(GroupCall(run, [&]() -> absl::Status {
          for (int c = 0; c < nd; ++c) {
            if (runs) {
              const device::DevicePtr mine = acc[c] + uint64_t(c) * k * t.count * ws;
              RETURN_IF_ERROR(coll_->ReduceScatter(acc[c], mine, k * t.count, wire,
                                                   RedOp{op, -1}, set.comms[c], dstream[c]));
            } else {
              RETURN_IF_ERROR(coll_->AllReduce(acc[c], acc[c], elems, wire, RedOp{op, -1},
                                               set.comms[c], dstream[c]));
            }
          }
          return absl::OkStatus();
        }));
      }
      for (int c = 0; c < nd; ++c) {
        for (int r : members(c)) {
          const device::DevicePtr src = acc[c] + (rs ? uint64_t(r) * t.count * ws : 0);
          RETURN_IF_ERROR(out(src, wire, recv(r), t.count, out_scale, dstream[c]));
        }
      }
      return absl::OkStatus();
    }
    case Collective::kAllGather: {
      const uint64_t block = t.count * es;
      std::vector<device::DevicePtr> g(nd);
      for (int c = 0; c < nd; ++c) {
        ASSIGN_OR_RETURN(g[c], Scratch(set, dstream[c], ddevice[c], 0, block * n));
        for (int r : members(c)) {
          RETURN_IF_ERROR(dev_->MemcpyAsync(g[c] + r * block, send(r), block, dstream[c]));
        }
      }
      if (nccl) {
        RETURN_IF_ERROR(GroupCall(run, [&]() -> absl::Status {
          for (int j = 0; j < n; ++j) {  // member j's block, from its device
            for (int c = 0; c < nd; ++c) {
              RETURN_IF_ERROR(coll_->Broadcast(g[c] + j * block, g[c] + j * block, t.count, dt,
                                               plan.device_of(j), set.comms[c], dstream[c]));
            }
          }
          return absl::OkStatus();
        }));
      }
      for (int c = 0; c < nd; ++c) {
        for (int r : members(c)) {
          RETURN_IF_ERROR(dev_->MemcpyAsync(recv(r), g[c], block * n, dstream[c]));
        }
      }
      return absl::OkStatus();
    }
    case Collective::kBroadcast: {
      const uint64_t bytes = t.count * es;
      const int rc = plan.device_of(t.root);
      // The buffer holding the data on each device once NCCL is done.
      std::vector<device::DevicePtr> src(nd);
      for (int c = 0; c < nd; ++c) src[c] = c == rc ? send(t.root) : recv(members(c)[0]);
      if (nccl) {
        RETURN_IF_ERROR(GroupCall(run, [&]() -> absl::Status {
          for (int c = 0; c < nd; ++c) {
            RETURN_IF_ERROR(coll_->Broadcast(src[c], src[c], t.count, dt, rc, set.comms[c],
                                             dstream[c]));
          }
          return absl::OkStatus();
        }));
      }
      for (int c = 0; c < nd; ++c) {
        for (int r : members(c)) {
          if (recv(r) != src[c]) {
            RETURN_IF_ERROR(dev_->MemcpyAsync(recv(r), src[c], bytes, dstream[c]));
          }
        }
      }
      return absl::OkStatus();
    }
    case Collective::kAllToAll: {
      // Element offsets of block j in member r's send / recv buffer.
      auto scount = [&](int r, int j) {
        return t.members[r].send_counts.empty() ? t.count : t.members[r].send_counts[j];
      };
      auto rcount = [&](int r, int j) {
        return t.members[r].recv_counts.empty() ? t.count : t.members[r].recv_counts[j];
      };
      auto soff = [&](int r, int j) {
        uint64_t o = 0;
        for (int k = 0; k < j; ++k) o += scount(r, k);
        return o * es;
      };
      auto roff = [&](int r, int j) {
        uint64_t o = 0;
        for (int k = 0; k < j; ++k) o += rcount(r, k);
        return o * es;
      };
      // A member whose send and recv buffers are the same memory: stage its
      // input first, so the copies into it cannot clobber what is still to go.
      std::vector<device::DevicePtr> from(n);
      std::map<int, int> slot_of_device;
      for (int r = 0; r < n; ++r) {
        from[r] = send(r);
        if (send(r) != recv(r)) continue;
        const int c = plan.device_of(r);
        const uint64_t bytes = soff(r, n);
        if (bytes == 0) continue;
        const int slot = 1 + slot_of_device[c]++;
        ASSIGN_OR_RETURN(from[r], Scratch(set, dstream[c], ddevice[c], slot, bytes));
        RETURN_IF_ERROR(dev_->MemcpyAsync(from[r], send(r), bytes, dstream[c]));
      }
      for (int r = 0; r < n; ++r) {
        for (int j = 0; j < n; ++j) {
          const int c = plan.device_of(r);
          if (plan.device_of(j) != c || scount(r, j) == 0) continue;
          RETURN_IF_ERROR(dev_->MemcpyAsync(recv(j) + roff(j, r), from[r] + soff(r, j),
                                            scount(r, j) * es, dstream[c]));
        }
      }
      if (nccl) {
        // One global (sender, receiver) order: each pair of devices matches
        // its sends and receives in the same sequence.
        RETURN_IF_ERROR(GroupCall(run, [&]() -> absl::Status {
          for (int r = 0; r < n; ++r) {
            for (int j = 0; j < n; ++j) {
              const int cr = plan.device_of(r), cj = plan.device_of(j);
              if (cr == cj) continue;
              RETURN_IF_ERROR(coll_->Send(from[r] + soff(r, j), scount(r, j), dt, cj,
                                          set.comms[cr], dstream[cr]));
              RETURN_IF_ERROR(coll_->Recv(recv(j) + roff(j, r), rcount(j, r), dt, cr,
                                          set.comms[cj], dstream[cj]));
            }
          }
          return absl::OkStatus();
        }));
      }
      return absl::OkStatus();
    }
    default:
      return absl::UnimplementedError(
          absl::StrCat("members sharing a GPU: ", CollName(t.collective), " is not supported"));
  }
}

}  // namespace hsdp::nccl
