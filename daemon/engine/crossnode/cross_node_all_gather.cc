// The cross-node all-gather (see cross_node_ops.h): each node sends its
// members' blocks to every other node; chunked, the local copies
// overlapping the network.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "daemon/engine/crossnode/cross_node_internal.h"

namespace hsdp::cross_node_internal {

absl::Status Runner::AllGather() {
  const int L = static_cast<int>(in_.size());
  const uint64_t N = t_.count;
  const uint64_t K = StepElements(N, run_.chunk_bytes, es_ * G_);
  const uint64_t M = CeilDiv(N, K);
  auto chunk = [&](uint64_t m) { return Range{m * K, std::min(K, N - m * K)}; };
  auto copy_local = [&](uint64_t m) {
    const Range c = chunk(m);
    for (int l = 0; l < L; ++l) {
      const int r = lay_.local()[l];
      const char* src = in_[l] + c.begin * es_;
      for (int o = 0; o < L; ++o) {
        char* dst = out_[o] + (r * N + c.begin) * es_;
        if (dst != src) Copy(dst, src, c.len * es_);
      }
    }
  };
  auto copy_remote = [&](uint64_t m) {
    const Range c = chunk(m);
    for (int p = 0; p < P_; ++p) {
      if (p == s_) continue;
      for (int r : lay_.ranks_of[p]) {
        const uint64_t off = (r * N + c.begin) * es_;
        for (int o = 1; o < L; ++o) {
          if (out_[o] != out_[0]) Copy(out_[o] + off, out_[0] + off, c.len * es_);
        }
      }
    }
  };
  for (uint64_t m = 0; m < M; ++m) {
    const Range c = chunk(m);
    std::vector<SendRange> sends;
    std::vector<RecvRange> recvs;
    for (int p = 0; p < P_; ++p) {
      if (p == s_) continue;
      for (int l = 0; l < L; ++l) {
        sends.push_back(
            {p, in_[l] + c.begin * es_, c.len * es_, static_cast<uint32_t>(lay_.local()[l])});
      }
      for (int r : lay_.ranks_of[p]) {
        recvs.push_back(
            {p, out_[0] + (r * N + c.begin) * es_, c.len * es_, static_cast<uint32_t>(r)});
      }
    }
    const uint64_t work = c.len * es_ * L * (L + (m >= 1 ? G_ : 0));
    absl::Status s = ExchangeWhile(sends, recvs, work, [&, m] {
      copy_local(m);
      if (m >= 1) copy_remote(m - 1);
    });
    if (!s.ok()) return s;
  }
  copy_remote(M - 1);
  return absl::OkStatus();
}

}  // namespace hsdp::cross_node_internal
