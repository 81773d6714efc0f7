// The cross-node reduce-scatter (see cross_node_ops.h): the local partial of
// every rank's block, and node j receives only the blocks of the ranks it
// hosts; chunked, the next chunk's local stage overlapping the network.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "daemon/engine/crossnode/cross_node_internal.h"
#include "daemon/engine/cpu/partial_reduce.h"

namespace hsdp::cross_node_internal {

absl::Status Runner::ReduceScatter() {
  const ReduceSpec& spec = t_.spec;
  const size_t cs = DataTypeSize(cpu::PartialType(spec));
  const int L = static_cast<int>(in_.size());
  const uint64_t N = t_.count;
  const bool identity = L == 1 && cpu::PartialIsIdentity(spec);
  // When every input is a valid partial, the blocks of this node's own
  // ranks get no partial: their final pass reads the local inputs and the
  // remote partials directly (one pass instead of writing a partial and
  // reading it back; about 15% less memory traffic with 2 ranks per node).
  // Only the remote ranks' blocks, which travel, are reduced first.
  const bool fuse = L > 1 && cpu::PartialIsIdentity(spec);
  const int reduced_blocks = fuse ? G_ - L : G_;  // partials made per chunk
  const uint64_t K = StepElements(N, run_.chunk_bytes, cs * G_);
  const uint64_t M = CeilDiv(N, K);
  char* partial[2] = {nullptr, nullptr};
  if (!identity) {
    partial[0] = run_.scratch->Get(0, G_ * K * cs);
    partial[1] = run_.scratch->Get(1, G_ * K * cs);
  }
  char* rsbuf = run_.scratch->Get(2, static_cast<uint64_t>(P_) * L * K * cs);
  auto chunk = [&](uint64_t m) { return Range{m * K, std::min(K, N - m * K)}; };
  // Partial of rank j's block in chunk m.
  auto pptr = [&](uint64_t m, int j) -> const char* {
    return identity ? in_[0] + (j * N + chunk(m).begin) * es_ : partial[m % 2] + j * K * cs;
  };
  auto rs = [&](int p, int l) { return rsbuf + (static_cast<uint64_t>(p) * L + l) * K * cs; };
  auto local_reduce = [&](uint64_t m) {
    if (identity) return;
    const Range c = chunk(m);
    std::vector<const void*> ins(L);
    for (int j = 0; j < G_; ++j) {
      if (fuse && lay_.link_index[j] == s_) continue;
      for (int l = 0; l < L; ++l) ins[l] = in_[l] + (j * N + c.begin) * es_;
      ReducePartial(ins, partial[m % 2] + j * K * cs, c.len);
    }
  };
  auto work_of = [&](uint64_t m) -> uint64_t {
    return identity ? 0 : chunk(m).len * reduced_blocks * (L * es_ + cs);
  };
  if (absl::Status s = HeaderRound(work_of(0), [&] { local_reduce(0); }); !s.ok()) {
    return s;
  }
  for (uint64_t m = 0; m < M; ++m) {
    const Range c = chunk(m);
    std::vector<SendRange> sends;
    std::vector<RecvRange> recvs;
    for (int p = 0; p < P_; ++p) {
      if (p == s_) continue;
      for (int j : lay_.ranks_of[p]) {
        sends.push_back({p, pptr(m, j), c.len * cs, static_cast<uint32_t>(j)});
      }
      for (int l = 0; l < L; ++l) {
        recvs.push_back({p, rs(p, l), c.len * cs, static_cast<uint32_t>(lay_.local()[l])});
      }
    }
    const uint64_t work = m + 1 < M ? work_of(m + 1) : 0;
    absl::Status s = ExchangeWhile(sends, recvs, work, [&, m] { local_reduce(m + 1); });
    if (!s.ok()) return s;
    // In node order; this node's share is its partial, or (fused) its
    // members' inputs in rank order.
    std::vector<const void*> parts;
    for (int l = 0; l < L; ++l) {
      const int j = lay_.local()[l];
      parts.clear();
      for (int p = 0; p < P_; ++p) {
        if (p != s_) {
          parts.push_back(rs(p, l));
        } else if (!fuse) {
          parts.push_back(pptr(m, j));
        } else {
          for (int k = 0; k < L; ++k) parts.push_back(in_[k] + (j * N + c.begin) * es_);
        }
      }
      std::vector<void*> out = {out_[l] + c.begin * es_};
      FinishPartials(parts, out, c.len);
    }
  }
  return absl::OkStatus();
}

}  // namespace hsdp::cross_node_internal
