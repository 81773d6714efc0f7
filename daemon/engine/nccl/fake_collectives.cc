#include "daemon/engine/nccl/fake_collectives.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <set>
#include <tuple>

#include "hsdp/common/status_macros.h"

#include "absl/strings/str_cat.h"
#include "hsdp/kernels/reduce_kernels.h"

namespace hsdp::nccl {
namespace {

constexpr auto kPoll = std::chrono::milliseconds(2);

void* Ptr(DevicePtr p) { return reinterpret_cast<void*>(p); }

}  // namespace

struct FakeCollectives::Item {
  Call call;
  DevicePtr send = 0;
  DevicePtr recv = 0;
  int root = 0;
  std::shared_ptr<Comm> comm;
  uint64_t seq = 0;  // collective round, or the p2p sequence for (rank, peer)
  bool stalled = false;
};

struct FakeCollectives::Clique {
  explicit Clique(int n) : nranks(n) {}
  struct Round {
    std::vector<const Item*> items;  // by rank
    int arrived = 0;
    int left = 0;
    bool done = false;
    absl::Status status;
  };
  const int nranks;
  std::mutex mu;
  std::condition_variable cv;
  int local = 0;                 // ranks hosted here
  std::set<int> devices;         // of the local ranks
  std::set<int> ranks;
  bool aborted = false;          // guarded by mu
  std::map<uint64_t, Round> rounds;                                       // guarded by mu
  std::map<std::tuple<int, int, uint64_t>, std::vector<char>> mail;       // guarded by mu
};

struct FakeCollectives::Comm {
  std::shared_ptr<Clique> clique;
  std::string clique_key;
  int rank = 0;
  int device = 0;
  std::thread::id owner;             // the thread that created it
  bool freed = false;                // released: its resources are gone; guarded by clique->mu
  int queued = 0;                    // items enqueued, not started; guarded by clique->mu
  uint64_t coll_seq = 0;             // guarded by the api's mu_
  std::map<int, uint64_t> send_seq;  // by peer; guarded by the api's mu_
  std::map<int, uint64_t> recv_seq;  // by peer; guarded by the api's mu_
  int init_polls = 0;                // guarded by the api's mu_
  absl::Status async_error;          // guarded by the api's mu_
};

namespace {

// Runs one collective round for every rank of the clique (all items present).
absl::Status Compute(const std::vector<const FakeCollectives::Item*>& items) {
  const FakeCollectives::Call& c0 = items[0]->call;
  const int n = static_cast<int>(items.size());
  for (const auto* it : items) {
    if (it->call.kind != c0.kind || it->call.count != c0.count || it->call.dtype != c0.dtype ||
        it->call.op.op != c0.op.op || it->root != items[0]->root) {
      return absl::InternalError(absl::StrCat("fake nccl: ranks disagree on round (", c0.kind,
                                              " vs ", it->call.kind, ")"));
    }
  }
  const size_t es = DataTypeSize(c0.dtype);
  const uint64_t count = c0.count;
  ReduceSpec spec;
  spec.dtype = c0.dtype;
  spec.op = c0.op.op;
  spec.premul_factor = c0.premul;
  std::vector<std::vector<char>> out(n);
  if (c0.kind == "all_reduce" || c0.kind == "reduce_scatter") {
    const bool rs = c0.kind == "reduce_scatter";
    std::vector<const void*> ins(n);
    for (int r = 0; r < n; ++r) {
      out[r].resize(count * es);
      for (int j = 0; j < n; ++j) {
        ins[j] = static_cast<const char*>(Ptr(items[j]->send)) + (rs ? r * count * es : 0);
      }
      void* o = out[r].data();
      if (count > 0) cpu::Reduce(spec, ins.data(), n, &o, 1, count);
    }
  } else if (c0.kind == "all_gather") {
    for (int r = 0; r < n; ++r) {
      out[r].resize(count * es * n);
      for (int j = 0; j < n; ++j) {
        std::memcpy(out[r].data() + j * count * es, Ptr(items[j]->send), count * es);
      }
    }
  } else if (c0.kind == "broadcast") {
    const int root = items[0]->root;
    for (int r = 0; r < n; ++r) {
      out[r].resize(count * es);
      std::memcpy(out[r].data(), Ptr(items[root]->send), count * es);
    }
  } else {
    return absl::InternalError(absl::StrCat("fake nccl: unknown collective ", c0.kind));
  }
  for (int r = 0; r < n; ++r) std::memcpy(Ptr(items[r]->recv), out[r].data(), out[r].size());
  return absl::OkStatus();
}

}  // namespace

FakeCollectives::FakeCollectives(device::FakeDeviceApi* dev, bool supports_shrink)
    : dev_(dev), supports_shrink_(supports_shrink) {}

FakeCollectives::~FakeCollectives() {
  // Release anything still waiting so stream threads can be joined.
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [key, clique] : cliques_) {
    std::lock_guard<std::mutex> cl(clique->mu);
    clique->aborted = true;
    clique->cv.notify_all();
  }
}

absl::StatusOr<UniqueId> FakeCollectives::NewUniqueId() {
  std::lock_guard<std::mutex> l(mu_);
  UniqueId id;
  const uint64_t v = next_id_++;
  std::memcpy(id.bytes.data(), "fakenccl", 8);
  std::memcpy(id.bytes.data() + 8, &v, sizeof(v));
  return id;
}

absl::StatusOr<std::vector<CommHandle>> FakeCollectives::InitRanks(
    const UniqueId& id, int nranks, const std::vector<int>& ranks,
    const std::vector<int>& devices) {
  if (nranks < 1 || ranks.size() != devices.size() || ranks.empty()) {
    return absl::InvalidArgumentError("init: bad rank count");
  }
  const std::string key(reinterpret_cast<const char*>(id.bytes.data()), id.bytes.size());
  std::lock_guard<std::mutex> l(mu_);
  auto& clique = cliques_[key];
  if (clique == nullptr) clique = std::make_shared<Clique>(nranks);
  if (clique->nranks != nranks) {
    return absl::InvalidArgumentError("init: rank count differs from the clique's");
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= nranks || clique->ranks.count(ranks[i]) != 0) {
      return absl::InvalidArgumentError(absl::StrCat("init: rank ", ranks[i], " is invalid or taken"));
    }
    if (devices[i] < 0 || devices[i] >= dev_->DeviceCount()) {
      return absl::InvalidArgumentError(absl::StrCat("init: device ", devices[i], " does not exist"));
    }
    if (clique->devices.count(devices[i]) != 0 ||
        std::count(devices.begin(), devices.end(), devices[i]) > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "init: duplicate GPU: two ranks of one communicator on device ", devices[i]));
    }
  }
  std::vector<CommHandle> out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    auto c = std::make_shared<Comm>();
    c->clique = clique;
    c->clique_key = key;
    c->rank = ranks[i];
    c->device = devices[i];
    c->owner = std::this_thread::get_id();
    c->init_polls = init_polls_;
    clique->ranks.insert(ranks[i]);
    clique->devices.insert(devices[i]);
    ++clique->local;
    const CommHandle h = next_handle_++;
    comms_[h] = std::move(c);
    out.push_back(h);
  }
  ++inits_;
  return out;
}

absl::StatusOr<std::vector<CommHandle>> FakeCollectives::ShrinkRanks(
    const std::vector<CommHandle>& comms, const std::vector<int>& exclude) {
  if (!supports_shrink_) return absl::UnimplementedError("ncclCommShrink is not available");
  std::vector<std::shared_ptr<Comm>> olds;
  for (CommHandle h : comms) {
    ASSIGN_OR_RETURN(auto c, FindComm(h));
    olds.push_back(std::move(c));
  }
  if (olds.empty()) return absl::InvalidArgumentError("shrink: no communicators");
  const int n = olds[0]->clique->nranks - static_cast<int>(exclude.size());
  if (n < 1) return absl::InvalidArgumentError("shrink: nobody left");
  ASSIGN_OR_RETURN(UniqueId id, NewUniqueId());
  std::vector<int> ranks, devices;
  for (const auto& c : olds) {
    if (std::find(exclude.begin(), exclude.end(), c->rank) != exclude.end()) continue;
    int below = 0;
    for (int e : exclude) below += e < c->rank ? 1 : 0;
    ranks.push_back(c->rank - below);
    devices.push_back(c->device);
  }
  // The old communicators' devices are free again for the new clique.
  return InitRanks(id, n, ranks, devices);
}

absl::Status FakeCollectives::GroupStart() {
  std::lock_guard<std::mutex> l(mu_);
  ++groups_[std::this_thread::get_id()].depth;
  return absl::OkStatus();
}

absl::Status FakeCollectives::GroupEnd() {
  std::vector<Item> items;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto g = groups_.find(std::this_thread::get_id());
    if (g == groups_.end()) return absl::FailedPreconditionError("GroupEnd without GroupStart");
    if (--g->second.depth > 0) return absl::OkStatus();
    items = std::move(g->second.pending);
    groups_.erase(g);
    std::vector<Call> batch;
    for (const Item& it : items) batch.push_back(it.call);
    batches_.push_back(std::move(batch));
  }
  // One batch per (communicator, stream), in issue order.
  std::map<std::pair<CommHandle, StreamHandle>, std::vector<Item>> per;
  std::vector<std::pair<CommHandle, StreamHandle>> order;
  for (Item& it : items) {
    auto key = std::make_pair(it.call.comm, it.call.stream);
    if (per.find(key) == per.end()) order.push_back(key);
    per[key].push_back(std::move(it));
  }
  absl::Status first;
  for (const auto& key : order) {
    absl::Status s = Enqueue(std::move(per[key]));
    if (first.ok()) first = s;
  }
  return first;
}

absl::StatusOr<std::shared_ptr<FakeCollectives::Comm>> FakeCollectives::FindComm(
    CommHandle h) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = comms_.find(h);
  if (it == comms_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("communicator ", h, " is unknown, aborted or destroyed"));
  }
  return it->second;
}

absl::Status FakeCollectives::Issue(Item item) {
  ASSIGN_OR_RETURN(item.comm, FindComm(item.call.comm));
  ASSIGN_OR_RETURN(int sdev, dev_->DeviceOf(item.call.stream));
  if (sdev != item.comm->device) {
    return absl::InvalidArgumentError(absl::StrCat("stream is on device ", sdev,
                                                   ", the communicator on ", item.comm->device));
  }
  std::unique_lock<std::mutex> l(mu_);
  item.call.rank = item.comm->rank;
  if (item.call.kind == "send") {
    item.seq = item.comm->send_seq[item.call.peer]++;
  } else if (item.call.kind == "recv") {
    item.seq = item.comm->recv_seq[item.call.peer]++;
  } else {
    item.seq = item.comm->coll_seq++;
  }
  item.stalled = stall_;
  if (item.call.op.op == ReduceOp::kPremulSum) {
    auto p = premul_.find(item.call.op.custom);
    if (p == premul_.end()) return absl::InvalidArgumentError("unknown PreMulSum op");
    item.call.premul = p->second;
  }
  calls_.push_back(item.call);
  if (auto g = groups_.find(std::this_thread::get_id()); g != groups_.end()) {
    g->second.pending.push_back(std::move(item));
    return absl::OkStatus();
  }
  if (item.comm->clique->local > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        item.call.kind, " on a communicator whose clique has ", item.comm->clique->local,
        " ranks in this process, outside GroupStart/GroupEnd (real NCCL would deadlock)"));
  }
  batches_.push_back({item.call});
  l.unlock();
  std::vector<Item> one;
  one.push_back(std::move(item));
  return Enqueue(std::move(one));
}

absl::Status FakeCollectives::Enqueue(std::vector<Item> items) {
  const StreamHandle stream = items[0].call.stream;
  for (const Item& it : items) {
    std::lock_guard<std::mutex> l(it.comm->clique->mu);
    ++it.comm->queued;
  }
  auto shared = std::make_shared<std::vector<Item>>(std::move(items));
  device::FakeDeviceApi* dev = dev_;
  return dev_->EnqueueHostFn(stream, [shared, dev]() -> absl::Status {
    for (size_t k = 0; k < shared->size(); ++k) {
      const Item& it = (*shared)[k];
      Clique& q = *it.comm->clique;
      std::unique_lock<std::mutex> l(q.mu);
      --it.comm->queued;
      q.cv.notify_all();
      if (it.comm->freed) {
        // Queued before the release, started after it: NCCL's kernel would
        // read the freed communicator's memory.
        for (size_t j = k + 1; j < shared->size(); ++j) --(*shared)[j].comm->queued;
        q.cv.notify_all();
        l.unlock();
        const std::string what =
            absl::StrCat("fake nccl: ", it.call.kind, " of rank ", it.comm->rank,
                         " started after its communicator was released");
        dev->ReportFault(what);
        return absl::InternalError(what);
      }
      auto skip_rest = [&] {
        for (size_t j = k + 1; j < shared->size(); ++j) --(*shared)[j].comm->queued;
        q.cv.notify_all();
      };
      absl::Status access = [&]() -> absl::Status {
        const uint64_t bytes = it.call.count * DataTypeSize(it.call.dtype);
        const uint64_t n = static_cast<uint64_t>(q.nranks);
        const bool rs = it.call.kind == "reduce_scatter", ag = it.call.kind == "all_gather";
        if (it.send != 0) RETURN_IF_ERROR(dev->CheckAccess(it.send, rs ? bytes * n : bytes, "fake nccl (send buffer)"));
        if (it.recv != 0) RETURN_IF_ERROR(dev->CheckAccess(it.recv, ag ? bytes * n : bytes, "fake nccl (receive buffer)"));
        return absl::OkStatus();
      }();
      if (!access.ok()) {
        skip_rest();
        return access;
      }
      if (it.stalled) {  // a lost peer: only an abort ends it
        while (!q.aborted) q.cv.wait_for(l, kPoll);
        skip_rest();
        return absl::AbortedError("fake nccl: communicator aborted");
      }
      if (q.aborted) {
        skip_rest();
        return absl::AbortedError("fake nccl: communicator aborted");
      }
      if (it.call.kind == "send") {
        std::vector<char> data(it.call.count * DataTypeSize(it.call.dtype));
        if (!data.empty()) std::memcpy(data.data(), Ptr(it.send), data.size());
        q.mail[{it.comm->rank, it.call.peer, it.seq}] = std::move(data);
        q.cv.notify_all();
        continue;
      }
      if (it.call.kind == "recv") {
        const auto key = std::make_tuple(it.call.peer, it.comm->rank, it.seq);
        while (!q.aborted && q.mail.find(key) == q.mail.end()) q.cv.wait_for(l, kPoll);
        if (q.aborted) {
          skip_rest();
          return absl::AbortedError("fake nccl: communicator aborted");
        }
        std::vector<char>& data = q.mail[key];
        if (data.size() != it.call.count * DataTypeSize(it.call.dtype)) {
          skip_rest();
          return absl::InternalError("fake nccl: send and recv sizes differ");
        }
        if (!data.empty()) std::memcpy(Ptr(it.recv), data.data(), data.size());
        q.mail.erase(key);
        continue;
      }
      Clique::Round& round = q.rounds[it.seq];
      if (round.items.empty()) round.items.assign(q.nranks, nullptr);
      round.items[it.comm->rank] = &it;
      if (++round.arrived == q.nranks) {
        round.status = Compute(round.items);
        round.done = true;
        q.cv.notify_all();
      }
      while (!round.done && !q.aborted) q.cv.wait_for(l, kPoll);
      if (!round.done) {
        skip_rest();
        return absl::AbortedError("fake nccl: communicator aborted");
      }
      absl::Status s = round.status;
      if (++round.left == q.nranks) q.rounds.erase(it.seq);
      if (!s.ok()) {
        skip_rest();
        return s;
      }
    }
    return absl::OkStatus();
  });
}

absl::Status FakeCollectives::AllReduce(DevicePtr send, DevicePtr recv, uint64_t count,
                                        DataType dtype, RedOp op, CommHandle comm,
                                        StreamHandle stream) {
  Item it;
  it.call = Call{"all_reduce", comm, -1, stream, count, dtype, op};
  it.send = send;
  it.recv = recv;
  return Issue(std::move(it));
}

absl::Status FakeCollectives::AllGather(DevicePtr send, DevicePtr recv, uint64_t send_count,
                                        DataType dtype, CommHandle comm, StreamHandle stream) {
  Item it;
  it.call = Call{"all_gather", comm, -1, stream, send_count, dtype, RedOp{}};
  it.send = send;
  it.recv = recv;
  return Issue(std::move(it));
}

absl::Status FakeCollectives::ReduceScatter(DevicePtr send, DevicePtr recv, uint64_t recv_count,
                                            DataType dtype, RedOp op, CommHandle comm,
                                            StreamHandle stream) {
  Item it;
  it.call = Call{"reduce_scatter", comm, -1, stream, recv_count, dtype, op};
  it.send = send;
  it.recv = recv;
  return Issue(std::move(it));
}

absl::Status FakeCollectives::Broadcast(DevicePtr send, DevicePtr recv, uint64_t count,
                                        DataType dtype, int root, CommHandle comm,
                                        StreamHandle stream) {
  Item it;
  it.call = Call{"broadcast", comm, -1, stream, count, dtype, RedOp{}};
  it.send = send;
  it.recv = recv;
  it.root = root;
  return Issue(std::move(it));
}

absl::Status FakeCollectives::Send(DevicePtr buf, uint64_t count, DataType dtype, int peer,
                                   CommHandle comm, StreamHandle stream) {
  Item it;
  it.call = Call{"send", comm, -1, stream, count, dtype, RedOp{}};
  it.call.peer = peer;
  it.send = buf;
  return Issue(std::move(it));
}

absl::Status FakeCollectives::Recv(DevicePtr buf, uint64_t count, DataType dtype, int peer,
                                   CommHandle comm, StreamHandle stream) {
  Item it;
  it.call = Call{"recv", comm, -1, stream, count, dtype, RedOp{}};
  it.call.peer = peer;
  it.recv = buf;
  return Issue(std::move(it));
}

absl::StatusOr<RedOp> FakeCollectives::CreatePreMulSum(double scalar, DataType dtype,
                                                       CommHandle comm) {
  if (!IsFloatingPoint(dtype)) return absl::InvalidArgumentError("PreMulSum: float types only");
  RETURN_IF_ERROR(FindComm(comm).status());
  std::lock_guard<std::mutex> l(mu_);
  const int64_t id = static_cast<int64_t>(next_handle_++);
  premul_[id] = scalar;
  return RedOp{ReduceOp::kPremulSum, id};
}

void FakeCollectives::DestroyRedOp(RedOp op, CommHandle) {
  std::lock_guard<std::mutex> l(mu_);
  premul_.erase(op.custom);
}

AsyncState FakeCollectives::Query(CommHandle comm, absl::Status* error) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = comms_.find(comm);
  if (it == comms_.end()) {
    *error = absl::FailedPreconditionError("communicator is aborted or destroyed");
    return AsyncState::kFailed;
  }
  if (!it->second->async_error.ok()) {
    *error = it->second->async_error;
    return AsyncState::kFailed;
  }
  if (it->second->init_polls > 0) {
    --it->second->init_polls;
    return AsyncState::kInProgress;
  }
  return AsyncState::kReady;
}

absl::Status FakeCollectives::Release(const std::vector<CommHandle>& handles, bool abort) {
  std::vector<std::shared_ptr<Comm>> comms;
  std::chrono::milliseconds bound;
  {
    std::lock_guard<std::mutex> l(mu_);
    bound = release_bound_;
    std::set<CommHandle> named(handles.begin(), handles.end());
    for (CommHandle h : handles) {
      auto it = comms_.find(h);
      if (it == comms_.end()) {
        return absl::NotFoundError(absl::StrCat("release of an unknown communicator ", h));
      }
      comms.push_back(it->second);
    }
    // Every live communicator of these cliques that this thread created must
    // be in this call (NCCL: one group call, or it hangs).
    const std::thread::id self = std::this_thread::get_id();
    for (const auto& [h, c] : comms_) {
      if (named.count(h) != 0 || c->owner != self) continue;
      for (const auto& r : comms) {
        if (r->clique == c->clique) {
          return absl::FailedPreconditionError(absl::StrCat(
              abort ? "ncclCommAbort" : "ncclCommFinalize", " of rank ", r->rank,
              " while this thread also drives rank ", c->rank,
              " of the communicator, outside one group call (real NCCL would hang)"));
        }
      }
    }
    for (CommHandle h : handles) comms_.erase(h);
    if (abort) aborted_ += static_cast<int>(handles.size());
  }
  // Abort stops what runs; finalize lets it finish. Either way the free that
  // follows waits (NCCL: a device synchronisation) for the work already
  // queued to start — bounded here, a hang with real NCCL.
  absl::Status status;
  const auto deadline = std::chrono::steady_clock::now() + bound;
  if (abort) {
    for (const auto& c : comms) {
      std::lock_guard<std::mutex> l(c->clique->mu);
      c->clique->aborted = true;
      c->clique->cv.notify_all();
    }
  }
  for (const auto& c : comms) {
    Clique& q = *c->clique;
    std::unique_lock<std::mutex> l(q.mu);
    while (c->queued > 0 && std::chrono::steady_clock::now() < deadline) q.cv.wait_for(l, kPoll);
    if (c->queued > 0 && status.ok()) {
      status = absl::DeadlineExceededError(absl::StrCat(
          abort ? "ncclCommAbort" : "ncclCommDestroy", " of rank ", c->rank, ": ", c->queued,
          " operations are queued behind work that does not finish; the free's device "
          "synchronisation would wait for them (real NCCL hangs here)"));
    }
    c->freed = true;
  }
  return status;
}

void FakeCollectives::set_release_bound(std::chrono::milliseconds bound) {
  std::lock_guard<std::mutex> l(mu_);
  release_bound_ = bound;
}

std::vector<FakeCollectives::Call> FakeCollectives::calls() const {
  std::lock_guard<std::mutex> l(mu_);
  return calls_;
}
std::vector<std::vector<FakeCollectives::Call>> FakeCollectives::batches() const {
  std::lock_guard<std::mutex> l(mu_);
  return batches_;
}
void FakeCollectives::Stall(bool stall) {
  std::lock_guard<std::mutex> l(mu_);
  stall_ = stall;
}
void FakeCollectives::FailAsync(CommHandle comm, absl::Status error) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = comms_.find(comm);
  if (it != comms_.end()) it->second->async_error = std::move(error);
}
void FakeCollectives::set_init_polls(int n) {
  std::lock_guard<std::mutex> l(mu_);
  init_polls_ = n;
}
int FakeCollectives::live_comms() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(comms_.size());
}
int FakeCollectives::aborted_comms() const {
  std::lock_guard<std::mutex> l(mu_);
  return aborted_;
}
int FakeCollectives::inits() const {
  std::lock_guard<std::mutex> l(mu_);
  return inits_;
}
int FakeCollectives::premul_ops_live() const {
  std::lock_guard<std::mutex> l(mu_);
  return static_cast<int>(premul_.size());
}

}  // namespace hsdp::nccl
