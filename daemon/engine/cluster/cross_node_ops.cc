#include "daemon/engine/cluster/cross_node_ops.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <new>

#include "absl/strings/str_cat.h"
#include "daemon/engine/cpu/partial_reduce.h"

namespace hsdp {
namespace {

constexpr uint64_t kMaxElements = uint64_t{1} << 40;  // shm::kMaxCount
// Message parts of an all-to-all are i * G + j: G^2 must fit in 32 bits.
constexpr int kMaxGroupSize = 65535;
constexpr uint32_t kHeaderMagic = 0x4e584853;         // "SHXN"
constexpr uint32_t kHeaderVersion = 1;
// The smallest chunk worth a network round (elements of a step).
constexpr uint64_t kMinChunkElements = 1024;
// Local work below this many bytes of memory traffic runs inline.
constexpr uint64_t kInlineWorkBytes = 256 << 10;

uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// The shape of a task; every node must run the same one.
struct TaskHeader {
  uint32_t magic = kHeaderMagic;
  uint32_t version = kHeaderVersion;
  uint8_t collective = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t wire = 0;
  int32_t root = 0;
  uint32_t group_size = 0;
  uint32_t uneven = 0;
  uint64_t count = 0;
  uint64_t seq = 0;
  uint64_t members_hash = 0;  // global rank and node of every member
  uint64_t spec_hash = 0;     // premul_factor, pre_divide, post_divide
  uint64_t chunk_bytes = 0;
  uint64_t small_allreduce_bytes = 0;
};
static_assert(sizeof(TaskHeader) == 72);

bool Uneven(const EngineTask& t) {
  for (const EngineMember& m : t.members) {
    if (m.local && (!m.send_counts.empty() || !m.recv_counts.empty())) return true;
  }
  return false;
}

TaskHeader MakeHeader(const EngineTask& t, size_t chunk_bytes, size_t small_allreduce_bytes) {
  TaskHeader h;
  h.collective = static_cast<uint8_t>(t.collective);
  h.dtype = static_cast<uint8_t>(t.spec.dtype);
  const bool reducing =
      t.collective == Collective::kAllReduce || t.collective == Collective::kReduceScatter;
  if (reducing) {
    h.op = static_cast<uint8_t>(t.spec.op);
    h.wire = static_cast<uint8_t>(t.spec.wire_dtype);
    uint64_t sh = 14695981039346656037ull;
    for (double d : {t.spec.premul_factor, t.spec.pre_divide, t.spec.post_divide}) {
      sh = Fnv1a(sh, &d, sizeof(d));
    }
    h.spec_hash = sh;
  }
  h.root = t.collective == Collective::kBroadcast ? t.root : 0;
  h.group_size = static_cast<uint32_t>(t.members.size());
  h.uneven = t.collective == Collective::kAllToAll && Uneven(t) ? 1 : 0;
  h.count = h.uneven ? 0 : t.count;  // splits carry the sizes (compared in their own round)
  h.seq = t.seq;
  uint64_t mh = 14695981039346656037ull;
  for (const EngineMember& m : t.members) {
    const int64_t v[2] = {m.global_rank, m.node};
    mh = Fnv1a(mh, v, sizeof(v));
  }
  h.members_hash = mh;
  h.chunk_bytes = chunk_bytes;
  h.small_allreduce_bytes = small_allreduce_bytes;
  return h;
}

// "" when equal, else what differs (theirs vs ours).
std::string CompareHeaders(const TaskHeader& theirs, const TaskHeader& ours) {
  if (theirs.magic != ours.magic || theirs.version != ours.version) {
    return absl::StrCat("protocol version ", theirs.version, " (this node: ", ours.version, ")");
  }
  auto name = [](uint8_t c) { return std::string(CollectiveName(static_cast<Collective>(c))); };
  auto dname = [](uint8_t d) { return std::string(DataTypeName(static_cast<DataType>(d))); };
  if (theirs.collective != ours.collective) {
    return absl::StrCat("runs ", name(theirs.collective), " (this node: ", name(ours.collective),
                        ")");
  }
  if (theirs.seq != ours.seq) {
    return absl::StrCat("runs seq ", theirs.seq, " (this node: seq ", ours.seq, ")");
  }
  if (theirs.count != ours.count || theirs.dtype != ours.dtype) {
    return absl::StrCat("has ", theirs.count, " ", dname(theirs.dtype), " (this node: ",
                        ours.count, " ", dname(ours.dtype), ")");
  }
  if (theirs.op != ours.op || theirs.wire != ours.wire || theirs.spec_hash != ours.spec_hash) {
    return "reduces differently (op, reduce dtype or divide factors)";
  }
  if (theirs.root != ours.root) {
    return absl::StrCat("has root ", theirs.root, " (this node: ", ours.root, ")");
  }
  if (theirs.group_size != ours.group_size || theirs.members_hash != ours.members_hash) {
    return "sees different group members or placement";
  }
  if (theirs.uneven != ours.uneven) {
    return absl::StrCat("uses ", theirs.uneven ? "splits" : "equal blocks", " (this node: ",
                        ours.uneven ? "splits" : "equal blocks", ")");
  }
  if (theirs.chunk_bytes != ours.chunk_bytes ||
      theirs.small_allreduce_bytes != ours.small_allreduce_bytes) {
    return absl::StrCat("chunks by ", theirs.chunk_bytes, " bytes, small all-reduce up to ",
                        theirs.small_allreduce_bytes, " (this node: ", ours.chunk_bytes, ", ",
                        ours.small_allreduce_bytes, ")");
  }
  return "";
}

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
        P_(static_cast<int>(lay.nodes.size())), s_(lay.self), G_(lay.group_size) {
    for (int r : lay.local()) {
      in_.push_back(static_cast<const char*>(t.members[r].send.data));
      out_.push_back(static_cast<char*>(t.members[r].recv.data));
    }
  }

  // Checks the task against this node's buffers; touches no memory.
  absl::Status Validate() { return CheckTask(); }

  absl::Status Run() {
    if (absl::Status s = CheckTask(); !s.ok()) return s;
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
  // --- checks ---------------------------------------------------------------

  static absl::Status OutOfMemory() {
    return absl::ResourceExhaustedError("out of memory staging a cross-node operation");
  }

  absl::Status Bad(const std::string& what) const {
    return absl::InvalidArgumentError(what);
  }

  absl::Status NeedBytes(int r, const BufferView& b, uint64_t bytes, const char* which) const {
    if (b.kind != MemoryKind::kHost) {
      return absl::UnimplementedError("the cross-node engine runs on host memory only");
    }
    if (bytes == 0) return absl::OkStatus();
    if (b.data == nullptr || b.bytes < bytes) {
      return Bad(absl::StrCat("rank ", t_.members[r].global_rank, ": ", which, " buffer of ",
                              b.bytes, " bytes, the operation needs ", bytes));
    }
    return absl::OkStatus();
  }

  uint64_t SendCount(int li, int j) const {
    const EngineMember& m = t_.members[lay_.local()[li]];
    return m.send_counts.empty() ? t_.count : m.send_counts[j];
  }
  uint64_t RecvCount(int li, int i) const {
    const EngineMember& m = t_.members[lay_.local()[li]];
    return m.recv_counts.empty() ? t_.count : m.recv_counts[i];
  }

  absl::Status CheckTask() {
    if (es_ == 0) return Bad("dtype: not a known type");
    if (G_ > kMaxGroupSize) {
      return Bad(absl::StrCat("a group of ", G_, " ranks (at most ", kMaxGroupSize, ")"));
    }
    if (t_.count > kMaxElements) return Bad(absl::StrCat("count ", t_.count, " is too large"));
    const uint64_t n = t_.count * es_;  // < 2^43
    const uint64_t gn = n * static_cast<uint64_t>(G_);
    const bool reducing =
        t_.collective == Collective::kAllReduce || t_.collective == Collective::kReduceScatter;
    if (reducing) {
      if (t_.spec.op == ReduceOp::kInvalid || static_cast<uint8_t>(t_.spec.op) > kMaxReduceOp) {
        return Bad("reduce_op: not a known op");
      }
      const DataType w = t_.spec.wire_dtype;
      if (w != DataType::kInvalid && w != t_.spec.dtype && !IsFloatingPoint(w)) {
        return Bad("reduce_dtype: not a floating-point type");
      }
      if (!IsFloatingPoint(t_.spec.dtype) &&
          (t_.spec.pre_divide != 1.0 || t_.spec.post_divide != 1.0)) {
        return Bad("pre/post divide on an integer type");
      }
    }
    if (t_.collective == Collective::kBroadcast && (t_.root < 0 || t_.root >= G_)) {
      return Bad(absl::StrCat("root ", t_.root, " is not a rank of a group of ", G_));
    }
    const std::vector<int>& local = lay_.local();
    for (size_t li = 0; li < local.size(); ++li) {
      const int r = local[li];
      const EngineMember& m = t_.members[r];
      uint64_t send = 0, recv = 0;
      switch (t_.collective) {
        case Collective::kAllReduce:
          send = recv = n;
          break;
        case Collective::kReduceScatter:
          send = gn;
          recv = n;
          break;
        case Collective::kAllGather:
          send = n;
          recv = gn;
          break;
        case Collective::kBroadcast:
          send = r == t_.root ? n : 0;
          recv = n;
          break;
        case Collective::kAllToAll: {
          if (m.send_counts.empty() != m.recv_counts.empty() ||
              m.send_counts.empty() != !uneven_) {
            return Bad("splits: every member of this node must give both splits, or none");
          }
          if (uneven_) {
            if (m.send_counts.size() != static_cast<size_t>(G_) ||
                m.recv_counts.size() != static_cast<size_t>(G_)) {
              return Bad(absl::StrCat("splits of rank ", m.global_rank, ": ",
                                      m.send_counts.size(), " counts for a group of ", G_));
            }
            uint64_t st = 0, rt = 0;
            for (int j = 0; j < G_; ++j) {
              if (m.send_counts[j] > kMaxElements || m.recv_counts[j] > kMaxElements) {
                return Bad("splits: a count is too large");
              }
              st += m.send_counts[j];
              rt += m.recv_counts[j];
            }
            if (st > kMaxElements || rt > kMaxElements) return Bad("splits: too many elements");
            send = st * es_;
            recv = rt * es_;
          } else {
            send = recv = gn;
          }
          break;
        }
        case Collective::kBarrier:
          break;
        default:
          return absl::UnimplementedError(absl::StrCat(
              "the cross-node engine does not run ",
              std::string(CollectiveName(t_.collective))));
      }
      if (absl::Status s = NeedBytes(r, m.send, send, "send"); !s.ok()) return s;
      if (absl::Status s = NeedBytes(r, m.recv, recv, "recv"); !s.ok()) return s;
    }
    if (t_.collective == Collective::kAllToAll && uneven_) {
      // Pairs on this node must agree (their own daemon is the only judge).
      for (size_t li = 0; li < local.size(); ++li) {
        for (size_t lj = 0; lj < local.size(); ++lj) {
          if (SendCount(li, local[lj]) != RecvCount(lj, local[li])) {
            return Bad(SplitsMismatch(local[li], local[lj], SendCount(li, local[lj]),
                                      RecvCount(lj, local[li])));
          }
        }
      }
    }
    return absl::OkStatus();
  }

  std::string SplitsMismatch(int i, int j, uint64_t sends, uint64_t expects) const {
    return absl::StrCat("splits disagree: rank ", t_.members[i].global_rank, " sends ", sends,
                        " elements to rank ", t_.members[j].global_rank, ", which expects ",
                        expects);
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
    const TaskHeader ours = MakeHeader(t_, run_.chunk_bytes, run_.small_allreduce_bytes);
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
      const std::string diff = CompareHeaders(theirs[p], ours);
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
      cpu::ReducePartial(spec, ins.data(), L, partial, N);
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
    cpu::FinishPartials(spec, G_, parts.data(), P_, outs.data(), L, N);
    return absl::OkStatus();
  }

  absl::Status AllReduce() {
    const ReduceSpec& spec = t_.spec;
    const size_t cs = DataTypeSize(cpu::PartialType(spec));
    const int L = static_cast<int>(in_.size());
    const uint64_t N = t_.count;
    if (N * cs * (P_ - 1) <= run_.small_allreduce_bytes) return AllReduceDirect();
    const bool identity = L == 1 && cpu::PartialIsIdentity(spec);
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
      for (int l = 0; l < L; ++l) ins[l] = in_[l] + c.begin * es_;
      cpu::ReducePartial(spec, ins.data(), L, partial[m % 2], c.len);
    };
    auto copy_out = [&](uint64_t m) {
      const Range c = chunk(m);
      for (int p = 0; p < P_; ++p) {
        if (p == s_) continue;
        const Range sg = Split(c.len, P_, p);
        const uint64_t off = (c.begin + sg.begin) * es_;
        for (int l = 1; l < L; ++l) {
          if (out_[l] + off != out_[0] + off) std::memcpy(out_[l] + off, out_[0] + off, sg.len * es_);
        }
      }
    };
    auto finish = [&](uint64_t m) {
      const Range c = chunk(m);
      const Range mine = Split(c.len, P_, s_);
      std::vector<const void*> parts(P_);
      for (int p = 0; p < P_; ++p) {
        parts[p] = p == s_ ? pptr(m) + mine.begin * cs : rsbuf + p * seg_max * cs;
      }
      std::vector<void*> outs(L);
      for (int l = 0; l < L; ++l) outs[l] = out_[l] + (c.begin + mine.begin) * es_;
      cpu::FinishPartials(spec, G_, parts.data(), P_, outs.data(), L, mine.len);
    };

    if (absl::Status s = HeaderRound(identity ? 0 : chunk(0).len * (L * es_ + cs),
                                     [&] { local_reduce(0); });
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
      if (step + 1 < M && !identity) work += chunk(step + 1).len * (L * es_ + cs);
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
        for (int l = 0; l < L; ++l) ins[l] = in_[l] + (j * N + c.begin) * es_;
        cpu::ReducePartial(spec, ins.data(), L, partial[m % 2] + j * K * cs, c.len);
      }
    };
    if (absl::Status s = HeaderRound(identity ? 0 : chunk(0).len * G_ * (L * es_ + cs),
                                     [&] { local_reduce(0); });
        !s.ok()) {
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
      const uint64_t work = m + 1 < M && !identity ? chunk(m + 1).len * G_ * (L * es_ + cs) : 0;
      absl::Status s =
          ExchangeWhile(sends, recvs, work, [&, m] { local_reduce(m + 1); });
      if (!s.ok()) return s;
      std::vector<const void*> parts(P_);
      for (int l = 0; l < L; ++l) {
        for (int p = 0; p < P_; ++p) parts[p] = p == s_ ? pptr(m, lay_.local()[l]) : rs(p, l);
        void* out = out_[l] + c.begin * es_;
        cpu::FinishPartials(spec, G_, parts.data(), P_, &out, 1, c.len);
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
          if (dst != src) std::memcpy(dst, src, c.len * es_);
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
            if (out_[o] != out_[0]) std::memcpy(out_[o] + off, out_[0] + off, c.len * es_);
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
        if (dst != from) std::memcpy(dst, from, c.len * es_);
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

 public:
  void set_uneven(bool u) { uneven_ = u; }

 private:
  const EngineTask& t_;
  const TaskLayout& lay_;
  const CrossNodeRun& run_;
  const size_t es_;
  const int P_;
  const int s_;
  const int G_;
  bool uneven_ = false;
  std::vector<const char*> in_;
  std::vector<char*> out_;
};

}  // namespace

absl::StatusOr<TaskLayout> MakeTaskLayout(const EngineTask& task) {
  TaskLayout lay;
  lay.group_size = static_cast<int>(task.members.size());
  if (lay.group_size == 0) return absl::InvalidArgumentError("a task without members");
  int this_node = -1;
  for (const EngineMember& m : task.members) {
    if (m.node < 0) return absl::InvalidArgumentError(absl::StrCat("node ", m.node));
    if (!m.local) continue;
    if (this_node >= 0 && m.node != this_node) {
      return absl::InvalidArgumentError(absl::StrCat("local members on nodes ", this_node,
                                                     " and ", m.node));
    }
    this_node = m.node;
  }
  if (this_node < 0) return absl::InvalidArgumentError("a task without a member on this node");
  for (const EngineMember& m : task.members) {
    if (!m.local && m.node == this_node) {
      return absl::InvalidArgumentError(absl::StrCat(
          "rank ", m.global_rank, " is on this node (", this_node, ") but not local"));
    }
    lay.nodes.push_back(m.node);
  }
  std::sort(lay.nodes.begin(), lay.nodes.end());
  lay.nodes.erase(std::unique(lay.nodes.begin(), lay.nodes.end()), lay.nodes.end());
  lay.this_node = this_node;
  lay.self = static_cast<int>(std::lower_bound(lay.nodes.begin(), lay.nodes.end(), this_node) -
                              lay.nodes.begin());
  lay.ranks_of.resize(lay.nodes.size());
  for (int r = 0; r < lay.group_size; ++r) {
    const int idx = static_cast<int>(
        std::lower_bound(lay.nodes.begin(), lay.nodes.end(), task.members[r].node) -
        lay.nodes.begin());
    lay.link_index.push_back(idx);
    lay.ranks_of[idx].push_back(r);
  }
  return lay;
}

absl::Status ValidateCrossNode(const EngineTask& task, const TaskLayout& layout) {
  const CrossNodeRun none;
  Runner runner(task, layout, none);
  runner.set_uneven(task.collective == Collective::kAllToAll && Uneven(task));
  return runner.Validate();
}

absl::Status RunCrossNode(const EngineTask& task, const TaskLayout& layout,
                          const CrossNodeRun& run) {
  try {
    Runner runner(task, layout, run);
    runner.set_uneven(task.collective == Collective::kAllToAll && Uneven(task));
    return runner.Run();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory staging a cross-node operation");
  }
}

// --- Sidecar -------------------------------------------------------------------

Sidecar::Sidecar() : thread_([this] { Loop(); }) {}

Sidecar::~Sidecar() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Sidecar::Run(std::function<void()> fn) {
  std::lock_guard<std::mutex> l(mu_);
  fn_ = std::move(fn);
  busy_ = true;
  cv_.notify_all();
}

bool Sidecar::Wait() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return !busy_; });
  const bool ok = !threw_;
  threw_ = false;
  return ok;
}

void Sidecar::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    cv_.wait(l, [&] { return stop_ || fn_ != nullptr; });
    if (fn_ == nullptr) return;
    std::function<void()> fn = std::move(fn_);
    fn_ = nullptr;
    l.unlock();
    bool threw = false;
    try {
      fn();
    } catch (...) {
      threw = true;
    }
    l.lock();
    threw_ = threw;
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace hsdp
