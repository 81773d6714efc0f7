#include "crossnode_test_util.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "daemon/engine/cpu/cpu_engine.h"
#include "hsdp/kernels/reduce_kernels.h"

namespace hsdp::testing {
namespace {

constexpr size_t kGuard = 64;
constexpr char kGuardByte = static_cast<char>(0xAB);
constexpr char kUnwritten = static_cast<char>(0x5A);

bool Reducing(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduceScatter;
}

uint64_t SendElements(const Case& c, int r, int n) {
  switch (c.collective) {
    case Collective::kAllReduce:
    case Collective::kAllGather:
    case Collective::kBroadcast:
      return c.count;
    case Collective::kReduceScatter:
      return c.count * n;
    case Collective::kAllToAll: {
      if (!c.uneven) return c.count * n;
      uint64_t t = 0;
      for (int j = 0; j < n; ++j) t += SplitCount(r, j, n);
      return t;
    }
    default:
      return 0;
  }
}

uint64_t RecvElements(const Case& c, int r, int n) {
  switch (c.collective) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
    case Collective::kBroadcast:
      return c.count;
    case Collective::kAllGather:
      return c.count * n;
    case Collective::kAllToAll: {
      if (!c.uneven) return c.count * n;
      uint64_t t = 0;
      for (int i = 0; i < n; ++i) t += SplitCount(i, r, n);
      return t;
    }
    default:
      return 0;
  }
}

double Tolerance(const ReduceSpec& s) {
  auto tol = [](DataType t) {
    switch (t) {
      case DataType::kFloat64:
        return 1e-12;
      case DataType::kFloat32:
        return 2e-6;
      case DataType::kFloat16:
        return 2e-3;
      case DataType::kBFloat16:
        return 1.6e-2;
      default:
        return 0.0;
    }
  };
  double t = tol(s.dtype);
  if (s.wire_dtype != DataType::kInvalid) t = std::max(t, tol(s.wire_dtype));
  return t;
}

}  // namespace

Placement Contiguous(int nodes, int per_node) {
  Placement p;
  p.nodes = nodes;
  for (int r = 0; r < nodes * per_node; ++r) p.node_of.push_back(r / per_node);
  return p;
}

Placement RoundRobin(int nodes, int per_node) {
  Placement p;
  p.nodes = nodes;
  for (int r = 0; r < nodes * per_node; ++r) p.node_of.push_back(r % nodes);
  return p;
}

std::string Case::Describe() const {
  std::string s = absl::StrCat(std::string(CollectiveName(collective)), " ", std::string(DataTypeName(spec.dtype)),
                               " count ", count);
  if (Reducing(collective)) {
    absl::StrAppend(&s, " op ", std::string(ReduceOpName(spec.op)), " premul ", spec.premul_factor, " pre ",
                    spec.pre_divide, " post ", spec.post_divide);
    if (spec.wire_dtype != DataType::kInvalid) {
      absl::StrAppend(&s, " wire ", std::string(DataTypeName(spec.wire_dtype)));
    }
  }
  if (collective == Collective::kBroadcast) absl::StrAppend(&s, " root ", root);
  if (uneven) absl::StrAppend(&s, " uneven");
  if (in_place) absl::StrAppend(&s, " in-place");
  return s;
}

uint64_t SplitCount(int i, int j, int n) {
  return static_cast<uint64_t>((i * 7 + j * 3 + n) % 5);  // zeros included
}

RankBuffers::RankBuffers(const Case& c, int n, uint32_t seed) : case_(c) {
  const size_t es = DataTypeSize(c.spec.dtype);
  std::mt19937 rng(seed);
  for (int r = 0; r < n; ++r) {
    const uint64_t se = SendElements(c, r, n);
    const uint64_t re = RecvElements(c, r, n);
    send_bytes_.push_back(se * es);
    recv_bytes_.push_back(re * es);
    std::vector<char> send(se * es + kGuard, kGuardByte);
    if (IsFloatingPoint(c.spec.dtype)) {
      std::vector<double> v(se);
      for (double& x : v) {
        int k = static_cast<int>(rng() % 8);
        x = (k < 4 ? k - 4 : k - 3) * 0.5;  // +-0.5 .. +-2, never 0
      }
      cpu::Cast(DataType::kFloat64, v.data(), c.spec.dtype, send.data(), se);
    } else {
      for (uint64_t b = 0; b < se * es; ++b) send[b] = static_cast<char>(rng());
    }
    send_.push_back(std::move(send));
    recv_.emplace_back(re * es + kGuard, kGuardByte);
    std::memset(recv_.back().data(), kUnwritten, re * es);
  }
}

bool RankBuffers::in_place(int r) const {
  return case_.in_place && send_bytes_[r] == recv_bytes_[r];
}

RankBuffers RankBuffers::CloneInputs() const { return *this; }

bool RankBuffers::GuardsIntact() const {
  for (size_t r = 0; r < send_.size(); ++r) {
    for (size_t b = send_bytes_[r]; b < send_[r].size(); ++b) {
      if (send_[r][b] != kGuardByte) return false;
    }
    for (size_t b = recv_bytes_[r]; b < recv_[r].size(); ++b) {
      if (recv_[r][b] != kGuardByte) return false;
    }
  }
  return true;
}

EngineTask BuildTask(const Case& c, const Placement& p, int node, RankBuffers* bufs,
                     const std::string& key, uint32_t epoch, uint64_t seq) {
  EngineTask t;
  t.collective = c.collective;
  t.spec = c.spec;
  t.count = c.count;
  t.root = c.root;
  t.group_key = key;
  t.epoch = epoch;
  t.seq = seq;
  const int n = p.size();
  for (int r = 0; r < n; ++r) {
    EngineMember m;
    m.global_rank = 100 + r;
    m.node = p.node_of[r];
    m.local = node < 0 || p.node_of[r] == node;
    if (m.local) {
      m.send = BufferView{MemoryKind::kHost, -1, bufs->send(r), bufs->send_bytes(r)};
      m.recv = BufferView{MemoryKind::kHost, -1, bufs->recv(r), bufs->recv_bytes(r)};
      if (c.uneven) {
        for (int j = 0; j < n; ++j) {
          m.send_counts.push_back(SplitCount(r, j, n));
          m.recv_counts.push_back(SplitCount(j, r, n));
        }
      }
    }
    t.members.push_back(std::move(m));
  }
  return t;
}

Completions::Completions(int n)
    : left_(n), status_(n), launched_(n, 0), completed_(n, 0), order_ok_(n, true) {}

EngineCallbacks Completions::Callbacks(int i) {
  EngineCallbacks cb;
  cb.launched = [this, i](uint64_t) {
    std::lock_guard<std::mutex> l(mu_);
    ++launched_[i];
  };
  cb.completed = [this, i](absl::Status s, uint64_t) {
    std::lock_guard<std::mutex> l(mu_);
    if (launched_[i] != 1 || completed_[i] != 0) order_ok_[i] = false;
    ++completed_[i];
    status_[i] = std::move(s);
    --left_;
    cv_.notify_all();
  };
  return cb;
}

bool Completions::Wait(absl::Duration timeout) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, absl::ToChronoNanoseconds(timeout), [&] { return left_ <= 0; });
}

absl::Status Completions::status(int i) {
  std::lock_guard<std::mutex> l(mu_);
  return status_[i];
}

bool Completions::launched_before_completed(int i) {
  std::lock_guard<std::mutex> l(mu_);
  return order_ok_[i];
}

std::string CompareOutputs(const Case& c, const Placement& p, RankBuffers& got,
                           RankBuffers& want) {
  const DataType dt = c.spec.dtype;
  const size_t es = DataTypeSize(dt);
  const bool exact = !Reducing(c.collective) || !IsFloatingPoint(dt) ||
                     c.spec.op == ReduceOp::kMin || c.spec.op == ReduceOp::kMax;
  const double tol = Tolerance(c.spec);
  for (int r = 0; r < p.size(); ++r) {
    const uint64_t bytes = got.recv_bytes(r);
    const char* g = static_cast<const char*>(got.recv(r));
    const char* w = static_cast<const char*>(want.recv(r));
    if (exact) {
      for (uint64_t b = 0; b < bytes; ++b) {
        if (g[b] != w[b]) {
          return absl::StrCat("rank ", r, " (node ", p.node_of[r], "): element ", b / es,
                              " differs from the flat result");
        }
      }
      continue;
    }
    const uint64_t n = bytes / es;
    std::vector<double> gv(n), wv(n);
    cpu::Cast(dt, g, DataType::kFloat64, gv.data(), n);
    cpu::Cast(dt, w, DataType::kFloat64, wv.data(), n);
    for (uint64_t i = 0; i < n; ++i) {
      if (gv[i] == wv[i] || (std::isnan(gv[i]) && std::isnan(wv[i]))) continue;
      if (std::fabs(gv[i] - wv[i]) > tol * std::max(1.0, std::fabs(wv[i]))) {
        return absl::StrCat("rank ", r, " (node ", p.node_of[r], "): element ", i, " is ", gv[i],
                            ", the flat result ", wv[i]);
      }
    }
  }
  return "";
}

std::string RunAndCompare(const std::vector<Engine*>& engines, const Case& c, const Placement& p,
                          const std::string& key, uint32_t epoch, uint64_t seq) {
  RankBuffers bufs(c, p.size(), static_cast<uint32_t>(seq * 7919 + p.size()));
  RankBuffers ref = bufs.CloneInputs();
  CpuEngine::Run(BuildTask(c, p, -1, &ref, key, epoch, seq), nullptr);
  Completions done(p.nodes);
  for (int n = 0; n < p.nodes; ++n) {
    engines[n]->Launch(BuildTask(c, p, n, &bufs, key, epoch, seq), done.Callbacks(n));
  }
  if (!done.Wait(absl::Seconds(60))) return "not every node completed within 60 s";
  for (int n = 0; n < p.nodes; ++n) {
    if (!done.status(n).ok()) return absl::StrCat("node ", n, ": ", done.status(n).ToString());
    if (!done.launched_before_completed(n)) {
      return absl::StrCat("node ", n, ": launched/completed out of order");
    }
  }
  if (!bufs.GuardsIntact()) return "a guard byte after a buffer was overwritten";
  return CompareOutputs(c, p, bufs, ref);
}

namespace {

class ProbedLink : public NodeLink {
 public:
  ProbedLink(std::unique_ptr<NodeLink> inner, std::shared_ptr<TransportProbe> probe)
      : inner_(std::move(inner)), probe_(std::move(probe)) {}
  const std::vector<int>& nodes() const override { return inner_->nodes(); }
  int self() const override { return inner_->self(); }
  absl::Status Exchange(const std::vector<SendRange>& sends, const std::vector<RecvRange>& recvs,
                        uint64_t tag, absl::Time deadline) override {
    probe_->exchanges.fetch_add(1);
    return inner_->Exchange(sends, recvs, tag, deadline);
  }
  void Abort(const absl::Status& why) override { inner_->Abort(why); }
  std::string peer_instance(int peer) const override { return inner_->peer_instance(peer); }

 private:
  std::unique_ptr<NodeLink> inner_;
  std::shared_ptr<TransportProbe> probe_;
};

class ProbedTransport : public TransportFactory {
 public:
  ProbedTransport(std::unique_ptr<TransportFactory> inner, std::shared_ptr<TransportProbe> probe)
      : inner_(std::move(inner)), probe_(std::move(probe)) {}
  absl::StatusOr<std::unique_ptr<NodeLink>> Connect(const std::string& key, uint32_t epoch,
                                                    const std::vector<int>& nodes, int this_node,
                                                    absl::Time deadline) override {
    probe_->connects.fetch_add(1);
    auto link = inner_->Connect(key, epoch, nodes, this_node, deadline);
    if (!link.ok()) return link.status();
    return std::unique_ptr<NodeLink>(std::make_unique<ProbedLink>(std::move(*link), probe_));
  }

 private:
  std::unique_ptr<TransportFactory> inner_;
  std::shared_ptr<TransportProbe> probe_;
};

}  // namespace

std::unique_ptr<TransportFactory> Probed(std::unique_ptr<TransportFactory> inner,
                                         std::shared_ptr<TransportProbe> probe) {
  return std::make_unique<ProbedTransport>(std::move(inner), std::move(probe));
}

}  // namespace hsdp::testing
