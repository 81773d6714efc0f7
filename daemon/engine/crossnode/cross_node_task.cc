#include "daemon/engine/crossnode/cross_node_task.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace hsdp {
namespace {

uint64_t Fnv1a(uint64_t h, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

absl::Status NeedBytes(const EngineTask& t, int r, const BufferView& b, uint64_t bytes,
                       const char* which) {
  if (b.kind != MemoryKind::kHost) {
    return absl::UnimplementedError("the cross-node engine runs on host memory only");
  }
  if (bytes == 0) return absl::OkStatus();
  if (b.data == nullptr || b.bytes < bytes) {
    return Invalid(absl::StrCat("rank ", t.members[r].global_rank, ": ", which, " buffer of ",
                                b.bytes, " bytes, the operation needs ", bytes));
  }
  return absl::OkStatus();
}

}  // namespace

bool UnevenAllToAll(const EngineTask& t) {
  for (const EngineMember& m : t.members) {
    if (m.local && (!m.send_counts.empty() || !m.recv_counts.empty())) return true;
  }
  return false;
}

TaskHeader MakeTaskHeader(const EngineTask& t, size_t chunk_bytes, size_t small_allreduce_bytes) {
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
  h.uneven = t.collective == Collective::kAllToAll && UnevenAllToAll(t) ? 1 : 0;
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
std::string CompareTaskHeaders(const TaskHeader& theirs, const TaskHeader& ours) {
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

uint64_t SendCount(const EngineTask& t, int rank, int to) {
  const EngineMember& m = t.members[rank];
  return m.send_counts.empty() ? t.count : m.send_counts[to];
}

uint64_t RecvCount(const EngineTask& t, int rank, int from) {
  const EngineMember& m = t.members[rank];
  return m.recv_counts.empty() ? t.count : m.recv_counts[from];
}

std::string SplitsMismatch(const EngineTask& t, int i, int j, uint64_t sends, uint64_t expects) {
  return absl::StrCat("splits disagree: rank ", t.members[i].global_rank, " sends ", sends,
                      " elements to rank ", t.members[j].global_rank, ", which expects ", expects);
}

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

absl::Status ValidateCrossNode(const EngineTask& t, const TaskLayout& lay) {
  const size_t es = DataTypeSize(t.spec.dtype);
  const int G = lay.group_size;
  const bool uneven = t.collective == Collective::kAllToAll && UnevenAllToAll(t);
  // A barrier moves no elements: clients send it without a dtype.
  if (es == 0 && t.collective != Collective::kBarrier) {
    return Invalid("dtype: not a known type");
  }
  if (G > kMaxGroupSize) {
    return Invalid(absl::StrCat("a group of ", G, " ranks (at most ", kMaxGroupSize, ")"));
  }
  if (t.count > kMaxElements) return Invalid(absl::StrCat("count ", t.count, " is too large"));
  const uint64_t n = t.count * es;  // < 2^43
  const uint64_t gn = n * static_cast<uint64_t>(G);
  const bool reducing =
      t.collective == Collective::kAllReduce || t.collective == Collective::kReduceScatter;
  if (reducing) {
    if (t.spec.op == ReduceOp::kInvalid || static_cast<uint8_t>(t.spec.op) > kMaxReduceOp) {
      return Invalid("reduce_op: not a known op");
    }
    const DataType w = t.spec.wire_dtype;
    if (w != DataType::kInvalid && w != t.spec.dtype && !IsFloatingPoint(w)) {
      return Invalid("reduce_dtype: not a floating-point type");
    }
    if (!IsFloatingPoint(t.spec.dtype) &&
        (t.spec.pre_divide != 1.0 || t.spec.post_divide != 1.0)) {
      return Invalid("pre/post divide on an integer type");
    }
  }
  if (t.collective == Collective::kBroadcast && (t.root < 0 || t.root >= G)) {
    return Invalid(absl::StrCat("root ", t.root, " is not a rank of a group of ", G));
  }
  const std::vector<int>& local = lay.local();
  for (size_t li = 0; li < local.size(); ++li) {
    const int r = local[li];
    const EngineMember& m = t.members[r];
    uint64_t send = 0, recv = 0;
    switch (t.collective) {
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
        send = r == t.root ? n : 0;
        recv = n;
        break;
      case Collective::kAllToAll: {
        if (m.send_counts.empty() != m.recv_counts.empty() ||
            m.send_counts.empty() != !uneven) {
          return Invalid("splits: every member of this node must give both splits, or none");
        }
        if (uneven) {
          if (m.send_counts.size() != static_cast<size_t>(G) ||
              m.recv_counts.size() != static_cast<size_t>(G)) {
            return Invalid(absl::StrCat("splits of rank ", m.global_rank, ": ",
                                    m.send_counts.size(), " counts for a group of ", G));
          }
          uint64_t st = 0, rt = 0;
          for (int j = 0; j < G; ++j) {
            if (m.send_counts[j] > kMaxElements || m.recv_counts[j] > kMaxElements) {
              return Invalid("splits: a count is too large");
            }
            st += m.send_counts[j];
            rt += m.recv_counts[j];
          }
          if (st > kMaxElements || rt > kMaxElements) return Invalid("splits: too many elements");
          send = st * es;
          recv = rt * es;
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
            std::string(CollectiveName(t.collective))));
    }
    if (absl::Status s = NeedBytes(t, r, m.send, send, "send"); !s.ok()) return s;
    if (absl::Status s = NeedBytes(t, r, m.recv, recv, "recv"); !s.ok()) return s;
  }
  if (t.collective == Collective::kAllToAll && uneven) {
    // Pairs on this node must agree (their own daemon is the only judge).
    for (size_t li = 0; li < local.size(); ++li) {
      for (size_t lj = 0; lj < local.size(); ++lj) {
        if (SendCount(t, local[li], local[lj]) != RecvCount(t, local[lj], local[li])) {
          return Invalid(SplitsMismatch(t, local[li], local[lj], SendCount(t, local[li], local[lj]),
                                    RecvCount(t, local[lj], local[li])));
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hsdp
