// The cross-node all-to-all (see cross_node_ops.h): node A sends node B
// exactly the blocks from A's ranks to B's ranks, in one exchange; uneven
// splits are first compared between every two nodes (SplitsRound) and a
// disagreement fails the task on both sides.
#include <cstdint>
#include <cstring>
#include <vector>

#include "daemon/engine/crossnode/cross_node_internal.h"

namespace hsdp::cross_node_internal {

absl::Status Runner::AllToAll() {
  const int L = static_cast<int>(in_.size());
  const std::vector<int>& local = lay_.local();
  if (uneven_) {
    if (absl::Status s = SplitsRound(); !s.ok()) return s;
  }
  // Offsets (elements) of every block in the local members' buffers.
  std::vector<std::vector<uint64_t>> soff(L, std::vector<uint64_t>(G_ + 1, 0));
  std::vector<std::vector<uint64_t>> roff(L, std::vector<uint64_t>(G_ + 1, 0));
  for (int l = 0; l < L; ++l) {
    for (int j = 0; j < G_; ++j) {
      soff[l][j + 1] = soff[l][j] + SendCount(l, j);
      roff[l][j + 1] = roff[l][j] + RecvCount(l, j);
    }
  }
  std::vector<SendRange> sends;
  std::vector<RecvRange> recvs;
  for (int p = 0; p < P_; ++p) {
    if (p == s_) continue;
    for (int l = 0; l < L; ++l) {
      const int i = local[l];
      for (int j : lay_.ranks_of[p]) {
        sends.push_back({p, in_[l] + soff[l][j] * es_, SendCount(l, j) * es_,
                         static_cast<uint32_t>(i * G_ + j)});
      }
    }
    for (int l = 0; l < L; ++l) {
      const int j = local[l];
      for (int i : lay_.ranks_of[p]) {
        recvs.push_back({p, out_[l] + roff[l][i] * es_, RecvCount(l, i) * es_,
                         static_cast<uint32_t>(i * G_ + j)});
      }
    }
  }
  uint64_t work = 0;
  for (int a = 0; a < L; ++a) {
    for (int b = 0; b < L; ++b) work += SendCount(a, local[b]) * es_;
  }
  absl::Status s = ExchangeWhile(sends, recvs, work, [&] {
    for (int a = 0; a < L; ++a) {
      for (int b = 0; b < L; ++b) {
        const uint64_t c = SendCount(a, local[b]);  // == RecvCount(b, local[a]) (validated)
        if (c == 0) continue;
        std::memcpy(out_[b] + roff[b][local[a]] * es_, in_[a] + soff[a][local[b]] * es_, c * es_);
      }
    }
  });
  return s;
}

// Both ends of every node pair compare the splits between their ranks, so
// both fail on a disagreement before any block moves.
absl::Status Runner::SplitsRound() {
  const int L = static_cast<int>(lay_.local().size());
  const std::vector<int>& local = lay_.local();
  std::vector<std::vector<uint64_t>> mine(P_), theirs(P_);
  std::vector<SendRange> sends;
  std::vector<RecvRange> recvs;
  for (int p = 0; p < P_; ++p) {
    if (p == s_) continue;
    const std::vector<int>& remote = lay_.ranks_of[p];
    for (int l = 0; l < L; ++l) {
      for (int j : remote) mine[p].push_back(SendCount(l, j));
    }
    for (int l = 0; l < L; ++l) {
      for (int i : remote) mine[p].push_back(RecvCount(l, i));
    }
    theirs[p].resize(2 * remote.size() * L);
    sends.push_back({p, mine[p].data(), mine[p].size() * sizeof(uint64_t), 0});
    recvs.push_back({p, theirs[p].data(), theirs[p].size() * sizeof(uint64_t), 0});
  }
  if (absl::Status s = Exchange(sends, recvs); !s.ok()) return s;
  for (int p = 0; p < P_; ++p) {
    if (p == s_) continue;
    const std::vector<int>& remote = lay_.ranks_of[p];
    const size_t R = remote.size();
    // theirs: [their rank a][my rank l] send counts, then [their a][my l] receive counts.
    for (size_t a = 0; a < R; ++a) {
      for (int l = 0; l < L; ++l) {
        const uint64_t they_send = theirs[p][a * L + l];
        const uint64_t they_expect = theirs[p][R * L + a * L + l];
        if (they_send != RecvCount(l, remote[a])) {
          return Bad(SplitsMismatch(remote[a], local[l], they_send, RecvCount(l, remote[a])));
        }
        if (they_expect != SendCount(l, remote[a])) {
          return Bad(SplitsMismatch(local[l], remote[a], SendCount(l, remote[a]), they_expect));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hsdp::cross_node_internal
