// Several members of a collective on one GPU: NCCL refuses two
// ranks of one communicator on the same device, so a node whose trainers
// share a GPU (several per GPU, MPS) runs the hierarchical shape the CPU
// engine has across nodes: within each device hsdpd's own kernels work on
// the members' buffers (all mapped in the daemon), and between devices NCCL
// runs with one rank per device. With every member on one device there is no
// communicator at all. The plan per collective (n members, D devices, each
// device's members M_d, all on the device's one stream of the set):
//
//   all-reduce      acc_d = op over M_d of (wire) (send * in_scale)   [reduce kernel, scratch]
//                   D > 1: NCCL all-reduce of acc_d (sum for sum/avg/premul, else the op)
//                   recv_r = (dtype) (acc_d * out_scale) for r in M_d  [scale/cast or copy]
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
#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/nccl/nccl_engine.h"
#include "daemon/engine/nccl/nccl_engine_state.h"
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

// Whether the fused reduction may write the members' outputs while it reads
// their inputs: each output is either apart from every input or exactly the
// range of an input that the kernel writing it reads at the same index (its
// own block of a reduce-scatter input, a whole all-reduce input). Anything
// else (a partial overlap) takes the scratch path, whose result does not
// depend on the order of reads and writes.
bool NcclEngine::FusableInPlace(const EngineTask& t, uint64_t block_bytes, bool rs) {
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
  const int nd = static_cast<int>(set.comms.empty() ? 1 : set.comms.size());
  std::vector<std::vector<int>> members(nd);
  std::vector<device::StreamHandle> dstream(nd, 0);
  std::vector<int> ddevice(nd, -1);
  for (int r = 0; r < n; ++r) {
    const int c = set.comm_of[r];
    members[c].push_back(r);
    dstream[c] = streams[r];
    ddevice[c] = t.members[r].send.device;
  }
  const bool nccl = !set.comms.empty();
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
      ASSIGN_OR_RETURN(DeviceReducePlan plan, PlanReduce(t.spec, n));
      // One plan for every op: scale the inputs, combine, scale the output.
      double in_scale = plan.op == ReduceOp::kPremulSum ? plan.premul : plan.in_scale;
      double out_scale = plan.op == ReduceOp::kAvg ? 1.0 / n : plan.out_scale;
      const bool sum_like = plan.op == ReduceOp::kSum || plan.op == ReduceOp::kAvg ||
                            plan.op == ReduceOp::kPremulSum;
      const ReduceOp op = sum_like ? ReduceOp::kSum : plan.op;
      const DataType wire = plan.cast ? plan.wire : dt;
      const size_t ws = DataTypeSize(wire);
      const bool rs = t.collective == Collective::kReduceScatter;
      const uint64_t elems = rs ? t.count * n : t.count;
      if (!nccl && wire == dt && options_.fuse_shared_reduce &&
          FusableInPlace(t, rs ? t.count * es : elems * es, rs)) {
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
        for (int r : members[c]) ins.push_back(send(r));
        RETURN_IF_ERROR(dev_->ReduceAsync(ins, dt, acc[c], wire, elems, op, in_scale,
                                          /*accumulate=*/false, dstream[c]));
      }
      // Reduce-scatter whose devices hold contiguous, equal runs of members
      // (member r on device r / k): NCCL reduce-scatter of k blocks per
      // device, half an all-reduce's traffic; device c's result lands in its
      // own run of acc, so member r still takes block r.
      bool runs = rs && nccl;
      const size_t k = members[0].size();
      for (int c = 0; c < nd && runs; ++c) {
        runs = members[c].size() == k;
        for (size_t i = 0; i < members[c].size() && runs; ++i) {
          runs = members[c][i] == static_cast<int>(c * k + i);
        }
      }
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
        for (int r : members[c]) {
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
        for (int r : members[c]) {
          RETURN_IF_ERROR(dev_->MemcpyAsync(g[c] + r * block, send(r), block, dstream[c]));
        }
      }
      if (nccl) {
        RETURN_IF_ERROR(GroupCall(run, [&]() -> absl::Status {
          for (int j = 0; j < n; ++j) {  // member j's block, from its device
            for (int c = 0; c < nd; ++c) {
              RETURN_IF_ERROR(coll_->Broadcast(g[c] + j * block, g[c] + j * block, t.count, dt,
                                               set.comm_of[j], set.comms[c], dstream[c]));
            }
          }
          return absl::OkStatus();
        }));
      }
      for (int c = 0; c < nd; ++c) {
        for (int r : members[c]) {
          RETURN_IF_ERROR(dev_->MemcpyAsync(recv(r), g[c], block * n, dstream[c]));
        }
      }
      return absl::OkStatus();
    }
    case Collective::kBroadcast: {
      const uint64_t bytes = t.count * es;
      const int rc = set.comm_of[t.root];
      // The buffer holding the data on each device once NCCL is done.
      std::vector<device::DevicePtr> src(nd);
      for (int c = 0; c < nd; ++c) src[c] = c == rc ? send(t.root) : recv(members[c][0]);
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
        for (int r : members[c]) {
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
        const int c = set.comm_of[r];
        const uint64_t bytes = soff(r, n);
        if (bytes == 0) continue;
        const int slot = 1 + slot_of_device[c]++;
        ASSIGN_OR_RETURN(from[r], Scratch(set, dstream[c], ddevice[c], slot, bytes));
        RETURN_IF_ERROR(dev_->MemcpyAsync(from[r], send(r), bytes, dstream[c]));
      }
      for (int r = 0; r < n; ++r) {
        for (int j = 0; j < n; ++j) {
          const int c = set.comm_of[r];
          if (set.comm_of[j] != c || scount(r, j) == 0) continue;
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
              const int cr = set.comm_of[r], cj = set.comm_of[j];
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
