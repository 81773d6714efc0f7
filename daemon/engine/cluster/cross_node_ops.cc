#include "daemon/engine/cluster/cross_node_ops.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <new>

#include "absl/strings/str_cat.h"
#include "daemon/engine/cpu/partial_reduce.h"
#include "daemon/engine/cpu/thread_pool.h"

namespace hsdp {
namespace {

// The smallest chunk worth a network round (elements of a step).
constexpr uint64_t kMinChunkElements = 1024;
// Pieces of the local stage split across a worker's pool are at least this
// many elements.
constexpr uint64_t kParallelMinElements = 64 << 10;
// Local work below this many bytes of memory traffic runs inline.
constexpr uint64_t kInlineWorkBytes = 256 << 10;

struct Range {
  uint64_t begin = 0;
  uint64_t len = 0;
};

// Part p of P of `len` elements (balanced; the same on every node).
Range Split(uint64_t len, int parts, int p) {
  const uint64_t b = len * p / parts;
  const uint64_t e = len * (p + 1) / parts;
  return {b, e - b};
}

uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Elements per pipeline step when one step moves `bytes_per_element` bytes
// per element (the whole message when chunking is off).
uint64_t StepElements(uint64_t count, size_t chunk_bytes, uint64_t bytes_per_element) {
  if (chunk_bytes == 0 || count == 0) return std::max<uint64_t>(count, 1);
  const uint64_t k = std::max<uint64_t>(kMinChunkElements, chunk_bytes / bytes_per_element);
  return std::min(k, count);
}

class Runner {
 public:
  Runner(const EngineTask& t, const TaskLayout& lay, const CrossNodeRun& run)
      : t_(t), lay_(lay), run_(run), es_(DataTypeSize(t.spec.dtype)),
        P_(static_cast<int>(lay.nodes.size())), s_(lay.self), G_(lay.group_size),
        uneven_(t.collective == Collective::kAllToAll && UnevenAllToAll(t)) {
    for (int r : lay.local()) {
      in_.push_back(static_cast<const char*>(t.members[r].send.data));
      out_.push_back(static_cast<char*>(t.members[r].recv.data));
    }
  }

  absl::Status Run() {
    if (absl::Status s = ValidateCrossNode(t_, lay_); !s.ok()) return s;
    // The reductions overlap their first local stage with the header round
    // (it only reads this node's inputs).
    const bool reduction =
        t_.count > 0 && (t_.collective == Collective::kAllReduce ||
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

 private:
  // --- local stage, split across the worker's pool when it has one ----------

  // fn(begin, len) over [0, n) elements.
  void Parallel(uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn) {
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

  // The local members' inputs `ins` (in dtype) into `partial` (compute type).
  void ReducePartial(const std::vector<const void*>& ins, char* partial, uint64_t n) {
    const size_t cs = DataTypeSize(cpu::PartialType(t_.spec));
    Parallel(n, [&](uint64_t b, uint64_t len) {
      std::vector<const void*> in(ins.size());
      for (size_t k = 0; k < ins.size(); ++k) in[k] = static_cast<const char*>(ins[k]) + b * es_;
      cpu::ReducePartial(t_.spec, in.data(), static_cast<int>(in.size()), partial + b * cs, len);
    });
  }

  // The nodes' partials, in node order, into every output.
  void FinishPartials(const std::vector<const void*>& parts, const std::vector<void*>& outs,
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

  void Copy(char* dst, const char* src, uint64_t bytes) {
    Parallel(bytes, [&](uint64_t b, uint64_t len) { std::memcpy(dst + b, src + b, len); });
  }

  static absl::Status OutOfMemory() {
    return absl::ResourceExhaustedError("out of memory staging a cross-node operation");
  }
  absl::Status Bad(const std::string& what) const { return absl::InvalidArgumentError(what); }
  uint64_t SendCount(int li, int j) const { return hsdp::SendCount(t_, lay_.local()[li], j); }
  uint64_t RecvCount(int li, int i) const { return hsdp::RecvCount(t_, lay_.local()[li], i); }
  std::string SplitsMismatch(int i, int j, uint64_t sends, uint64_t expects) const {
    return hsdp::SplitsMismatch(t_, i, j, sends, expects);
  }

  // --- network --------------------------------------------------------------

  absl::Status Exchange(std::vector<SendRange>& sends, std::vector<RecvRange>& recvs) {
    auto empty_send = [](const SendRange& s) { return s.bytes == 0; };
    auto empty_recv = [](const RecvRange& r) { return r.bytes == 0; };
    sends.erase(std::remove_if(sends.begin(), sends.end(), empty_send), sends.end());
    recvs.erase(std::remove_if(recvs.begin(), recvs.end(), empty_recv), recvs.end());
    const uint64_t tag = (*run_.next_tag)++;
    return run_.link->Exchange(sends, recvs, tag, run_.deadline);
  }

  // Exchange, with `fn` (about `work_bytes` of memory traffic) overlapping
  // it on the sidecar; small work runs inline first (a thread handoff would
  // cost more).
  absl::Status ExchangeWhile(std::vector<SendRange>& sends, std::vector<RecvRange>& recvs,
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

  absl::Status HeaderRound(uint64_t work_bytes, const std::function<void()>& work) {
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

  // --- all-reduce -------------------------------------------------------------

  // Small all-reduce: every node sends its whole partial to every other node
  // and reduces all of them in node order (so every node computes the same
  // bits): one network round instead of two.
  absl::Status AllReduceDirect() {
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

  absl::Status AllReduce() {
    const ReduceSpec& spec = t_.spec;
    const size_t cs = DataTypeSize(cpu::PartialType(spec));
    const int L = static_cast<int>(in_.size());
    const uint64_t N = t_.count;
    // Two nodes whose partial fits one chunk: the one-round exchange moves
    // the same bytes as reduce-scatter + all-gather, in one round.
    const bool one_chunk_pair =
        P_ == 2 && (run_.chunk_bytes == 0 || N * cs <= run_.chunk_bytes);
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

    if (absl::Status s = HeaderRound(reduce_work(0), [&] { local_reduce(0); });
        !s.ok()) {
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

  // --- reduce-scatter ---------------------------------------------------------

  absl::Status ReduceScatter() {
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
      absl::Status s =
          ExchangeWhile(sends, recvs, work, [&, m] { local_reduce(m + 1); });
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

  // --- all-gather -------------------------------------------------------------

  absl::Status AllGather() {
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
          sends.push_back({p, in_[l] + c.begin * es_, c.len * es_,
                           static_cast<uint32_t>(lay_.local()[l])});
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

  // --- broadcast --------------------------------------------------------------

  absl::Status Broadcast() {
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

  // --- all-to-all -------------------------------------------------------------

  absl::Status AllToAll() {
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
          std::memcpy(out_[b] + roff[b][local[a]] * es_, in_[a] + soff[a][local[b]] * es_,
                      c * es_);
        }
      }
    });
    return s;
  }

  // Both ends of every node pair compare the splits between their ranks, so
  // both fail on a disagreement before any block moves.
  absl::Status SplitsRound() {
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

  const EngineTask& t_;
  const TaskLayout& lay_;
  const CrossNodeRun& run_;
  const size_t es_;
  const int P_;
  const int s_;
  const int G_;
  const bool uneven_;
  std::vector<const char*> in_;
  std::vector<char*> out_;
};

}  // namespace

absl::Status RunCrossNode(const EngineTask& task, const TaskLayout& layout,
                          const CrossNodeRun& run) {
  try {
    Runner runner(task, layout, run);
    return runner.Run();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory staging a cross-node operation");
  }
}

}  // namespace hsdp
