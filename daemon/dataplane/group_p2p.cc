// Point-to-point in a group: sends and receives matched per (source,
// destination, tag) in posting order, a receive from any source taking the
// oldest matching send; lowered to a two-member copy on the engine. Between
// nodes neither daemon sees the other side: the k-th send of (src, dst, tag)
// in an epoch pairs with the k-th receive of it on the peer's daemon, each
// launched as a two-member broadcast (root = src) on an engine group of its
// own per (src, dst, tag), with k as the sequence number. A receive from any
// source cannot be matched soundly without a cross-node handshake, so it is
// UNIMPLEMENTED in a group that spans nodes. The rest of Group: group.h
// lists its files (same class, same locking rules).
#include <algorithm>

#include "daemon/dataplane/group.h"
#include "hsdp/common/logging.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {

void Group::ArriveP2P(int group_rank, Arrival arrival) {
  const auto kind = static_cast<Collective>(arrival.desc.collective);
  const int peer = arrival.desc.peer;
  const int tag = arrival.desc.tag;
  const int src = kind == Collective::kSend ? group_rank : peer;
  const int dst = kind == Collective::kSend ? peer : group_rank;
  std::optional<P2POp> match;
  absl::Status reject;
  bool remote = false;
  uint64_t k = 0;
  {
    absl::MutexLock l(&mu_);
    arrival.arrived_ns = clock_->NowNanos();
    const bool any = kind == Collective::kRecv && peer == kAnySource;
    if (!IsLocal(group_rank)) {
      reject = absl::InvalidArgumentError("group_id: this rank is not on this node");
    } else if (!arrival.rejected.ok()) {
      reject = arrival.rejected;
    } else if (arrival.epoch < epoch_ || (arrival.epoch == epoch_ && !epoch_failure_.ok())) {
      reject = arrival.epoch == epoch_
                   ? epoch_failure_
                   : absl::FailedPreconditionError(absl::StrCat(
                         "epoch: epoch ", arrival.epoch, " of group ", spec_.id, " is over"));
    } else if (arrival.epoch != epoch_) {
      reject = absl::InvalidArgumentError(
          absl::StrCat("epoch: ", arrival.epoch, " is not group ", spec_.id, "'s current epoch ",
                       epoch_, " (point-to-point does not queue for a future epoch)"));
    } else if (any && spans_nodes()) {
      reject = absl::UnimplementedError(absl::StrCat(
          "peer: a receive from any source is not supported in group ", spec_.id,
          " because it spans nodes (a send on another node cannot be matched without a "
          "cross-node handshake); name the source rank"));
    } else if (!any && (peer < 0 || peer >= size())) {
      reject = absl::InvalidArgumentError(
          absl::StrCat("peer: ", peer, " is not a rank of group ", spec_.id));
    } else if (!any && !IsLocal(peer) && p2p_posted_.count({src, dst, tag}) == 0 &&
               p2p_engine_keys_.size() >= kMaxRemoteP2PStreams) {
      reject = absl::ResourceExhaustedError(absl::StrCat(
          "tag: group ", spec_.id, " already has ", kMaxRemoteP2PStreams,
          " distinct (source, destination, tag) between nodes; reuse tags"));
    } else if (!any && !IsLocal(peer)) {
      remote = true;
      k = ++p2p_posted_[{src, dst, tag}];
      p2p_engine_keys_.insert(absl::StrCat(spec_.key, "/p2p/", src, ">", dst, "/", tag));
    } else {
      match = kind == Collective::kSend ? TakeRecvForLocked(src, dst, tag)
                                        : TakeSendForLocked(src, dst, tag);
      if (!match.has_value()) {
        if (p2p_queued_ >= spec_.max_pending) {
          reject = absl::ResourceExhaustedError(absl::StrCat(
              "group ", spec_.id, " already has ", p2p_queued_,
              " unmatched sends and receives (limits: the ring size)"));
        } else {
          auto& queues = kind == Collective::kSend ? p2p_sends_ : p2p_recvs_;
          queues[{src, dst, tag}].push_back(P2POp{std::move(arrival), group_rank, ++p2p_order_});
          ++p2p_queued_;
          return;
        }
      }
    }
  }
  if (!reject.ok()) {
    Notify({std::move(arrival)}, reject, 0, 0);
    return;
  }
  P2POp mine{std::move(arrival), group_rank, 0};
  if (remote) return LaunchRemoteP2P(std::move(mine), src, dst, tag, k);
  if (kind == Collective::kSend) {
    LaunchP2P(std::move(mine), std::move(*match));
  } else {
    LaunchP2P(std::move(*match), std::move(mine));
  }
}

std::vector<std::string> Group::engine_keys() const {
  absl::MutexLock l(&mu_);
  std::vector<std::string> keys = {spec_.key};
  keys.insert(keys.end(), p2p_engine_keys_.begin(), p2p_engine_keys_.end());
  return keys;
}

std::optional<Group::P2POp> Group::TakeRecvForLocked(int src, int dst, int tag) {
  // A specific receive from `src`, or one from any source: the older wins.
  std::deque<P2POp>* best = nullptr;
  for (const P2PKey& key : {P2PKey{src, dst, tag}, P2PKey{kAnySource, dst, tag}}) {
    auto it = p2p_recvs_.find(key);
    if (it == p2p_recvs_.end() || it->second.empty()) continue;
    if (best == nullptr || it->second.front().order < best->front().order) best = &it->second;
  }
  if (best == nullptr) return std::nullopt;
  P2POp op = std::move(best->front());
  best->pop_front();
  --p2p_queued_;
  return op;
}

std::optional<Group::P2POp> Group::TakeSendForLocked(int src, int dst, int tag) {
  std::deque<P2POp>* best = nullptr;
  if (src != kAnySource) {
    auto it = p2p_sends_.find({src, dst, tag});
    if (it != p2p_sends_.end() && !it->second.empty()) best = &it->second;
  } else {
    for (auto& [key, q] : p2p_sends_) {  // the oldest send to dst with this tag
      if (std::get<1>(key) != dst || std::get<2>(key) != tag || q.empty()) continue;
      if (best == nullptr || q.front().order < best->front().order) best = &q;
    }
  }
  if (best == nullptr) return std::nullopt;
  P2POp op = std::move(best->front());
  best->pop_front();
  --p2p_queued_;
  return op;
}

std::vector<Group::P2POp> Group::TakeAllP2PLocked() {
  std::vector<P2POp> out;
  for (auto* queues : {&p2p_sends_, &p2p_recvs_}) {
    for (auto& [key, q] : *queues) {
      for (P2POp& p : q) out.push_back(std::move(p));
    }
    queues->clear();
  }
  p2p_queued_ = 0;
  return out;
}

void Group::LaunchP2P(P2POp send, P2POp recv) {
  const shm::OpDescriptor& s = send.arrival.desc;
  const shm::OpDescriptor& r = recv.arrival.desc;
  const std::string what = absl::StrCat("send/recv (tag ", s.tag, ") from rank ",
                                        spec_.ranks[send.rank], " to rank ",
                                        spec_.ranks[recv.rank], " in group ", spec_.id);
  if (s.count != r.count || s.dtype != r.dtype) {
    const absl::Status bad = absl::InvalidArgumentError(absl::StrCat(
        what, ": the sender sends ", s.count, " ", std::string(DataTypeName(static_cast<DataType>(s.dtype))),
        ", the receiver expects ", r.count, " ",
        std::string(DataTypeName(static_cast<DataType>(r.dtype)))));
    Notify({std::move(send.arrival), std::move(recv.arrival)}, bad, 0, 0);
    return;
  }
  // Lowered to a two-member broadcast from the sender (the sender's own
  // "output" is its input, so nothing is copied there).
  EngineTask t;
  t.collective = Collective::kBroadcast;
  t.count = s.count;
  t.root = 0;
  t.group_key = spec_.key + "/p2p";
  t.epoch = send.arrival.epoch;
  t.spec.dtype = static_cast<DataType>(s.dtype);
  const uint64_t bytes = s.count * DataTypeSize(t.spec.dtype);
  for (const P2POp* p : {&send, &recv}) {
    EngineMember m;
    m.global_rank = spec_.ranks[p->rank];
    m.node = spec_.nodes.empty() ? spec_.this_node : spec_.nodes[p->rank];
    m.local = true;
    void* data = p == &send ? const_cast<void*>(p->arrival.send) : p->arrival.recv;
    m.send = BufferView{MemoryKind::kHost, -1, data, bytes};
    m.recv = BufferView{MemoryKind::kHost, -1, data, bytes};
    t.members.push_back(std::move(m));
  }
  const int64_t start_ns = shm::NowNanos();
  const int src = send.rank;
  auto pair = std::make_shared<std::pair<Arrival, Arrival>>(std::move(send.arrival),
                                                            std::move(recv.arrival));
  EngineCallbacks cb;
  cb.launched = [](uint64_t) {};
  cb.completed = [self = shared_from_this(), pair, what, start_ns, src](absl::Status st,
                                                                      uint64_t exec_ns) {
    if (!st.ok()) {
      st = absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
      HSDP_LOG_EVERY_N_SEC(Warning, 1) << st.message();
    }
    const int64_t first = std::min(pair->first.first_ns, pair->second.first_ns);
    const uint64_t queued = static_cast<uint64_t>(std::max<int64_t>(0, start_ns - first));
    pair->first.session->Complete(pair->first.desc.op_id, st, queued, exec_ns);
    pair->second.session->Complete(pair->second.desc.op_id, st, queued, exec_ns, src);
  };
  engine_->Launch(std::move(t), std::move(cb));
}

void Group::LaunchRemoteP2P(P2POp mine, int src, int dst, int tag, uint64_t k) {
  const bool sending = mine.rank == src;
  const shm::OpDescriptor& d = mine.arrival.desc;
  const std::string what = absl::StrCat(sending ? "send" : "recv", " (tag ", tag, ") from rank ",
                                        spec_.ranks[src], " to rank ", spec_.ranks[dst],
                                        " in group ", spec_.id, " across nodes");
  EngineTask t;
  t.collective = Collective::kBroadcast;
  t.count = d.count;
  t.root = 0;
  t.group_key = absl::StrCat(spec_.key, "/p2p/", src, ">", dst, "/", tag);  // in p2p_engine_keys_
  t.epoch = mine.arrival.epoch;
  t.spec.dtype = static_cast<DataType>(d.dtype);
  t.seq = k;
  const uint64_t bytes = d.count * DataTypeSize(t.spec.dtype);
  for (int r : {src, dst}) {
    EngineMember m;
    m.global_rank = spec_.ranks[r];
    m.node = spec_.nodes[r];
    m.local = r == mine.rank;
    if (m.local) {
      void* data = sending ? const_cast<void*>(mine.arrival.send) : mine.arrival.recv;
      m.send = BufferView{MemoryKind::kHost, -1, data, bytes};
      m.recv = BufferView{MemoryKind::kHost, -1, data, bytes};
    }
    t.members.push_back(std::move(m));
  }
  if (t.seq == 1) {
    EngineGroupSpec es{t.group_key, t.epoch, {spec_.ranks[src], spec_.ranks[dst]},
                       {spec_.nodes[src], spec_.nodes[dst]}, spec_.this_node};
    if (absl::Status s = engine_->CreateGroup(es); !s.ok()) {
      Notify({std::move(mine.arrival)},
             absl::Status(s.code(), absl::StrCat(what, ": ", s.message())), 0, 0);
      return;
    }
  }
  const int64_t start_ns = shm::NowNanos();
  auto arrival = std::make_shared<Arrival>(std::move(mine.arrival));
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto ticket_of = std::make_shared<std::atomic<uint64_t>>(0);
  EngineCallbacks cb;
  cb.launched = [](uint64_t) {};
  cb.completed = [self = shared_from_this(), arrival, what, start_ns, src, sending, done,
                  ticket_of](absl::Status st, uint64_t exec_ns) {
    done->store(true);
    if (const uint64_t t = ticket_of->load(); t != 0) {
      absl::MutexLock l(&self->mu_);
      self->p2p_running_.erase(t);
    }
    if (!st.ok()) {
      st = absl::Status(st.code(), absl::StrCat(what, ": ", st.message()));
      HSDP_LOG_EVERY_N_SEC(Warning, 1) << st.message();
    }
    const uint64_t queued =
        static_cast<uint64_t>(std::max<int64_t>(0, start_ns - arrival->first_ns));
    if (sending) {
      arrival->session->Complete(arrival->desc.op_id, st, queued, exec_ns);
    } else {
      arrival->session->Complete(arrival->desc.op_id, st, queued, exec_ns, src);
    }
  };
  const uint32_t epoch = t.epoch;
  const uint64_t ticket = engine_->Launch(std::move(t), std::move(cb));
  absl::MutexLock l(&mu_);
  ticket_of->store(ticket);
  if (!done->load()) p2p_running_[ticket] = epoch;
}

}  // namespace hsdp
