// RunCrossNode (see cross_node_ops.h) and what its algorithms share: the
// dispatch by collective, the local stage (reductions and copies, split
// across the worker's pool), the network exchange overlapped with local
// work on the sidecar, and the task header round every task starts with.
// The algorithms are in cross_node_<collective>.cc.
#include "daemon/engine/crossnode/cross_node_ops.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/engine/crossnode/cross_node_internal.h"
#include "daemon/engine/cpu/partial_reduce.h"
#include "daemon/engine/cpu/thread_pool.h"

namespace hsdp {
namespace cross_node_internal {
namespace {

// Pieces of the local stage split across a worker's pool are at least this
// many elements.
constexpr uint64_t kParallelMinElements = 64 << 10;
// Local work below this many bytes of memory traffic runs inline.
constexpr uint64_t kInlineWorkBytes = 256 << 10;

}  // namespace

Runner::Runner(const EngineTask& t, const TaskLayout& lay, const CrossNodeRun& run)
    : t_(t),
      lay_(lay),
      run_(run),
      es_(DataTypeSize(t.spec.dtype)),
      P_(static_cast<int>(lay.nodes.size())),
      s_(lay.self),
      G_(lay.group_size),
      uneven_(t.collective == Collective::kAllToAll && UnevenAllToAll(t)) {
  for (int r : lay.local()) {
    in_.push_back(static_cast<const char*>(t.members[r].send.data));
    out_.push_back(static_cast<char*>(t.members[r].recv.data));
  }
}

absl::Status Runner::Run() {
  if (absl::Status s = ValidateCrossNode(t_, lay_); !s.ok()) return s;
  // The reductions overlap their first local stage with the header round
  // (it only reads this node's inputs).
  const bool reduction = t_.count > 0 && (t_.collective == Collective::kAllReduce ||
                                          t_.collective == Collective::kReduceScatter);
  if (!reduction) {
    if (absl::Status s = HeaderRound(0, nullptr); !s.ok()) return s;
  }
  switch (t_.collective) {
    case Collective::kAllReduce:
      return t_.count == 0 ? absl::OkStatus() : AllReduce();
    case Collective::kReduceScatter:
      return t_.count == 0 ? absl::OkStatus() : ReduceScatter();
    case Collective::kAllGather:
      return t_.count == 0 ? absl::OkStatus() : AllGather();
    case Collective::kBroadcast:
      return t_.count == 0 ? absl::OkStatus() : Broadcast();
    case Collective::kAllToAll:
      return AllToAll();
    default:
      return absl::OkStatus();  // barrier: the header round was it
  }
}

void Runner::Parallel(uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn) {
  cpu::ThreadPool* pool = run_.pool;
  if (pool == nullptr || pool->threads() <= 1 || n < 2 * kParallelMinElements) {
    fn(0, n);
    return;
  }
  const uint64_t pieces =
      std::min<uint64_t>(4 * static_cast<uint64_t>(pool->threads()), n / kParallelMinElements);
  const uint64_t per = (CeilDiv(n, pieces) + 63) / 64 * 64;
  pool->ParallelFor(CeilDiv(n, per), [&](size_t i) {
    const uint64_t b = i * per;
    fn(b, std::min(per, n - b));
  });
}

void Runner::ReducePartial(const std::vector<const void*>& ins, char* partial, uint64_t n) {
  const size_t cs = DataTypeSize(cpu::PartialType(t_.spec));
  Parallel(n, [&](uint64_t b, uint64_t len) {
    std::vector<const void*> in(ins.size());
    for (size_t k = 0; k < ins.size(); ++k) in[k] = static_cast<const char*>(ins[k]) + b * es_;
    cpu::ReducePartial(t_.spec, in.data(), static_cast<int>(in.size()), partial + b * cs, len);
  });
}

void Runner::FinishPartials(const std::vector<const void*>& parts, const std::vector<void*>& outs,
                            uint64_t n) {
  const size_t cs = DataTypeSize(cpu::PartialType(t_.spec));
  Parallel(n, [&](uint64_t b, uint64_t len) {
    std::vector<const void*> p(parts.size());
    for (size_t k = 0; k < parts.size(); ++k) p[k] = static_cast<const char*>(parts[k]) + b * cs;
    std::vector<void*> o(outs.size());
    for (size_t k = 0; k < outs.size(); ++k) o[k] = static_cast<char*>(outs[k]) + b * es_;
    cpu::FinishPartials(t_.spec, G_, p.data(), static_cast<int>(p.size()), o.data(),
                        static_cast<int>(o.size()), len);
  });
}

void Runner::Copy(char* dst, const char* src, uint64_t bytes) {
  Parallel(bytes, [&](uint64_t b, uint64_t len) { std::memcpy(dst + b, src + b, len); });
}

absl::Status Runner::Exchange(std::vector<SendRange>& sends, std::vector<RecvRange>& recvs) {
  auto empty_send = [](const SendRange& s) { return s.bytes == 0; };
  auto empty_recv = [](const RecvRange& r) { return r.bytes == 0; };
  sends.erase(std::remove_if(sends.begin(), sends.end(), empty_send), sends.end());
  recvs.erase(std::remove_if(recvs.begin(), recvs.end(), empty_recv), recvs.end());
  const uint64_t tag = (*run_.next_tag)++;
  return run_.link->Exchange(sends, recvs, tag, run_.deadline);
}

absl::Status Runner::ExchangeWhile(std::vector<SendRange>& sends, std::vector<RecvRange>& recvs,
                                   uint64_t work_bytes, const std::function<void()>& fn) {
  if (work_bytes == 0) return Exchange(sends, recvs);
  if (work_bytes < kInlineWorkBytes) {
    fn();
    return Exchange(sends, recvs);
  }
  run_.sidecar->Run(fn);
  absl::Status s = Exchange(sends, recvs);
  if (!run_.sidecar->Wait()) return OutOfMemory();
  return s;
}

absl::Status Runner::HeaderRound(uint64_t work_bytes, const std::function<void()>& work) {
  const TaskHeader ours = MakeTaskHeader(t_, run_.chunk_bytes, run_.small_allreduce_bytes);
  std::vector<TaskHeader> theirs(P_);
  std::vector<SendRange> sends;
  std::vector<RecvRange> recvs;
  for (int p = 0; p < P_; ++p) {
    if (p == s_) continue;
    sends.push_back({p, &ours, sizeof(ours), 0});
    recvs.push_back({p, &theirs[p], sizeof(TaskHeader), 0});
  }
  if (absl::Status s = ExchangeWhile(sends, recvs, work_bytes, work); !s.ok()) return s;
  for (int p = 0; p < P_; ++p) {
    if (p == s_) continue;
    const std::string diff = CompareTaskHeaders(theirs[p], ours);
    if (!diff.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("node ", lay_.nodes[p], " ", diff, " for the same operation"));
    }
  }
  return absl::OkStatus();
}

}  // namespace cross_node_internal

absl::Status RunCrossNode(const EngineTask& task, const TaskLayout& layout,
                          const CrossNodeRun& run) {
  try {
    cross_node_internal::Runner runner(task, layout, run);
    return runner.Run();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory staging a cross-node operation");
  }
}

}  // namespace hsdp
