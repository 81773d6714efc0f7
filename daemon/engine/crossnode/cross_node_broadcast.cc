// The cross-node broadcast (see cross_node_ops.h; send/recv is a two-member
// broadcast): the root's node sends to every other node; chunked, the copies
// to the local outputs overlapping the network.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "daemon/engine/crossnode/cross_node_internal.h"

namespace hsdp::cross_node_internal {

absl::Status Runner::Broadcast() {
  const int L = static_cast<int>(in_.size());
  const uint64_t N = t_.count;
  const int root_node = lay_.link_index[t_.root];
  const bool at_root = root_node == s_;
  const char* src = nullptr;
  if (at_root) src = static_cast<const char*>(t_.members[t_.root].send.data);
  const uint64_t K = StepElements(N, run_.chunk_bytes, es_);
  const uint64_t M = CeilDiv(N, K);
  auto chunk = [&](uint64_t m) { return Range{m * K, std::min(K, N - m * K)}; };
  // Copies chunk m to every local output from where it is on this node.
  auto copy_out = [&](uint64_t m) {
    const Range c = chunk(m);
    const char* from = at_root ? src + c.begin * es_ : out_[0] + c.begin * es_;
    for (int l = at_root ? 0 : 1; l < L; ++l) {
      char* dst = out_[l] + c.begin * es_;
      if (dst != from) Copy(dst, from, c.len * es_);
    }
  };
  for (uint64_t m = 0; m < M; ++m) {
    const Range c = chunk(m);
    std::vector<SendRange> sends;
    std::vector<RecvRange> recvs;
    if (at_root) {
      for (int p = 0; p < P_; ++p) {
        if (p != s_) sends.push_back({p, src + c.begin * es_, c.len * es_, 0});
      }
    } else {
      recvs.push_back({root_node, out_[0] + c.begin * es_, c.len * es_, 0});
    }
    const uint64_t work = (at_root || m >= 1) ? c.len * es_ * L : 0;
    absl::Status s = ExchangeWhile(sends, recvs, work, [&, m] {
      if (at_root) {
        copy_out(m);
      } else if (m >= 1) {
        copy_out(m - 1);
      }
    });
    if (!s.ok()) return s;
  }
  if (!at_root) copy_out(M - 1);
  return absl::OkStatus();
}

}  // namespace hsdp::cross_node_internal
