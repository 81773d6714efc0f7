// The cross-node all-reduce (see cross_node_ops.h): the local partial of
// this node's inputs, a reduce-scatter of the partials among the nodes and
// an all-gather of the results, chunked so that the next chunk's local stage
// overlaps the network; small ones send every node's whole partial to every
// node instead (AllReduceDirect, one round).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "daemon/engine/crossnode/cross_node_internal.h"
#include "daemon/engine/cpu/partial_reduce.h"

namespace hsdp::cross_node_internal {

// Small all-reduce: every node sends its whole partial to every other node
// and reduces all of them in node order (so every node computes the same
// bits): one network round instead of two.
absl::Status Runner::AllReduceDirect() {
  const ReduceSpec& spec = t_.spec;
  const size_t cs = DataTypeSize(cpu::PartialType(spec));
  const int L = static_cast<int>(in_.size());
  const uint64_t N = t_.count;
  const bool identity = L == 1 && cpu::PartialIsIdentity(spec);
  char* partial = identity ? nullptr : run_.scratch->Get(0, N * cs);
  const char* mine = identity ? in_[0] : partial;
  auto local_reduce = [&] {
    std::vector<const void*> ins(in_.begin(), in_.end());
    ReducePartial(ins, partial, N);
  };
  if (absl::Status s = HeaderRound(identity ? 0 : N * (L * es_ + cs), local_reduce); !s.ok()) {
    return s;
  }
  char* theirs = run_.scratch->Get(2, static_cast<uint64_t>(P_) * N * cs);
  std::vector<SendRange> sends;
  std::vector<RecvRange> recvs;
  for (int p = 0; p < P_; ++p) {
    if (p == s_) continue;
    sends.push_back({p, mine, N * cs, 2});
    recvs.push_back({p, theirs + p * N * cs, N * cs, 2});
  }
  if (absl::Status s = Exchange(sends, recvs); !s.ok()) return s;
  std::vector<const void*> parts(P_);
  for (int p = 0; p < P_; ++p) parts[p] = p == s_ ? mine : theirs + p * N * cs;
  std::vector<void*> outs(out_.begin(), out_.end());
  FinishPartials(parts, outs, N);
  return absl::OkStatus();
}

absl::Status Runner::AllReduce() {
  const ReduceSpec& spec = t_.spec;
  const size_t cs = DataTypeSize(cpu::PartialType(spec));
  const int L = static_cast<int>(in_.size());
  const uint64_t N = t_.count;
  // Two nodes whose partial fits one chunk: the one-round exchange moves
  // the same bytes as reduce-scatter + all-gather, in one round.
  const bool one_chunk_pair = P_ == 2 && (run_.chunk_bytes == 0 || N * cs <= run_.chunk_bytes);
  if (one_chunk_pair || N * cs * (P_ - 1) <= run_.small_allreduce_bytes) {
    return AllReduceDirect();
  }
  const bool identity = L == 1 && cpu::PartialIsIdentity(spec);
  // As in ReduceScatter: when every input is a valid partial, this node's
  // own segment of a chunk gets no partial; its final pass reads the local
  // inputs and the other nodes' partials directly.
  const bool fuse = L > 1 && cpu::PartialIsIdentity(spec);
  const uint64_t K = StepElements(N, run_.chunk_bytes, cs);
  const uint64_t M = CeilDiv(N, K);
  const uint64_t seg_max = CeilDiv(K, P_);
  char* partial[2] = {nullptr, nullptr};
  if (!identity) {
    partial[0] = run_.scratch->Get(0, K * cs);
    partial[1] = run_.scratch->Get(1, K * cs);
  }
  char* rsbuf = run_.scratch->Get(2, P_ * seg_max * cs);
  auto chunk = [&](uint64_t m) { return Range{m * K, std::min(K, N - m * K)}; };
  auto pptr = [&](uint64_t m) -> const char* {
    return identity ? in_[0] + chunk(m).begin * es_ : partial[m % 2];
  };
  auto local_reduce = [&](uint64_t m) {
    if (identity) return;
    const Range c = chunk(m);
    std::vector<const void*> ins(L);
    if (!fuse) {
      for (int l = 0; l < L; ++l) ins[l] = in_[l] + c.begin * es_;
      ReducePartial(ins, partial[m % 2], c.len);
      return;
    }
    for (int p = 0; p < P_; ++p) {  // only the segments that travel
      if (p == s_) continue;
      const Range sg = Split(c.len, P_, p);
      for (int l = 0; l < L; ++l) ins[l] = in_[l] + (c.begin + sg.begin) * es_;
      ReducePartial(ins, partial[m % 2] + sg.begin * cs, sg.len);
    }
  };
  // Memory traffic of local_reduce(m), for ExchangeWhile.
  auto reduce_work = [&](uint64_t m) -> uint64_t {
    if (identity) return 0;
    const Range c = chunk(m);
    const uint64_t len = fuse ? c.len - Split(c.len, P_, s_).len : c.len;
    return len * (L * es_ + cs);
  };
  auto copy_out = [&](uint64_t m) {
    const Range c = chunk(m);
    for (int p = 0; p < P_; ++p) {
      if (p == s_) continue;
      const Range sg = Split(c.len, P_, p);
      const uint64_t off = (c.begin + sg.begin) * es_;
      for (int l = 1; l < L; ++l) {
        if (out_[l] != out_[0]) Copy(out_[l] + off, out_[0] + off, sg.len * es_);
      }
    }
  };
  auto finish = [&](uint64_t m) {
    const Range c = chunk(m);
    const Range mine = Split(c.len, P_, s_);
    std::vector<const void*> parts;  // in node order
    for (int p = 0; p < P_; ++p) {
      if (p != s_) {
        parts.push_back(rsbuf + p * seg_max * cs);
      } else if (!fuse) {
        parts.push_back(pptr(m) + mine.begin * cs);
      } else {
        for (int l = 0; l < L; ++l) parts.push_back(in_[l] + (c.begin + mine.begin) * es_);
      }
    }
    std::vector<void*> outs(L);
    for (int l = 0; l < L; ++l) outs[l] = out_[l] + (c.begin + mine.begin) * es_;
    FinishPartials(parts, outs, mine.len);
  };

  if (absl::Status s = HeaderRound(reduce_work(0), [&] { local_reduce(0); }); !s.ok()) {
    return s;
  }
  for (uint64_t step = 0; step <= M; ++step) {
    std::vector<SendRange> sends;
    std::vector<RecvRange> recvs;
    if (step < M) {
      const Range c = chunk(step);
      const Range mine = Split(c.len, P_, s_);
      for (int p = 0; p < P_; ++p) {
        if (p == s_) continue;
        const Range sg = Split(c.len, P_, p);
        sends.push_back({p, pptr(step) + sg.begin * cs, sg.len * cs, 0});
        recvs.push_back({p, rsbuf + p * seg_max * cs, mine.len * cs, 0});
      }
    }
    if (step >= 1) {
      const Range c = chunk(step - 1);
      const Range mine = Split(c.len, P_, s_);
      for (int p = 0; p < P_; ++p) {
        if (p == s_) continue;
        const Range sg = Split(c.len, P_, p);
        sends.push_back({p, out_[0] + (c.begin + mine.begin) * es_, mine.len * es_, 1});
        recvs.push_back({p, out_[0] + (c.begin + sg.begin) * es_, sg.len * es_, 1});
      }
    }
    uint64_t work = 0;
    if (step + 1 < M) work += reduce_work(step + 1);
    if (step >= 2 && L > 1) work += chunk(step - 2).len * es_ * (L - 1);
    absl::Status s = ExchangeWhile(sends, recvs, work, [&, step] {
      if (step + 1 < M) local_reduce(step + 1);
      if (step >= 2) copy_out(step - 2);
    });
    if (!s.ok()) return s;
    if (step < M) finish(step);
  }
  copy_out(M - 1);
  return absl::OkStatus();
}

}  // namespace hsdp::cross_node_internal
