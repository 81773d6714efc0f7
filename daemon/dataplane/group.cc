#include "daemon/dataplane/group.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_join.h"
#include "hsdp/common/logging.h"
#include "hsdp/shm/doorbell.h"

namespace hsdp {
namespace {

constexpr size_t kMaxRememberedFailures = 4096;
constexpr uint64_t kMaxSeqAhead = 1 << 20;

bool SameDouble(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

int PriorityOf(Collective c) {
  return c == Collective::kAllGather || c == Collective::kReduceScatter ||
                 c == Collective::kReduceScatterAllReduce
             ? 0
             : 1;
}

}  // namespace

Group::Group(uint32_t id, std::string job_id, std::vector<int> ranks, Engine* engine,
             GroupLookup lookup, int64_t timeout_ns)
    : id_(id),
      job_id_(std::move(job_id)),
      ranks_(std::move(ranks)),
      engine_(engine),
      lookup_(std::move(lookup)),
      timeout_ns_(timeout_ns),
      members_(ranks_.size()) {}

int Group::RankOf(int global_rank) const {
  for (size_t i = 0; i < ranks_.size(); ++i) {
    if (ranks_[i] == global_rank) return static_cast<int>(i);
  }
  return -1;
}

absl::Status Group::Join(int group_rank, std::shared_ptr<Session> session) {
  absl::MutexLock l(&mu_);
  if (group_rank < 0 || group_rank >= size()) {
    return absl::InvalidArgumentError(absl::StrCat("group rank ", group_rank, " out of range"));
  }
  if (!broken_.ok()) return broken_;
  std::shared_ptr<Session>& slot = members_[group_rank];
  if (slot != nullptr && slot.get() != session.get() && !slot->closed()) {
    return absl::AlreadyExistsError(absl::StrCat("group ", id_, ": rank ", ranks_[group_rank],
                                                 " already joined by session ", slot->id()));
  }
  slot = std::move(session);
  return absl::OkStatus();
}

bool Group::IsMember(int group_rank, const Session* session) const {
  absl::MutexLock l(&mu_);
  return group_rank >= 0 && group_rank < size() && members_[group_rank].get() == session;
}

std::string Group::RanksList(const std::vector<int>& group_ranks) const {
  std::vector<int> global;
  for (int r : group_ranks) global.push_back(ranks_[r]);
  return absl::StrCat("[", absl::StrJoin(global, ", "), "]");
}

std::string Group::Describe(const PendingOp& op) const {
  Collective c = Collective::kInvalid;
  bool phase2 = false;
  for (const auto& a : op.arrivals) {
    if (a.has_value()) {
      c = static_cast<Collective>(a->desc.collective);
      phase2 = a->phase2;
      break;
    }
  }
  return absl::StrCat(std::string(CollectiveName(c)), phase2 ? " (all-reduce phase)" : "", " seq ", op.seq,
                      " in group ", id_, " (job \"", job_id_, "\", ranks [",
                      absl::StrJoin(ranks_, ", "), "])");
}

std::string Group::Disagreement(const PendingOp& op) const {
  const Arrival& ref = *op.arrivals[0];
  std::vector<std::string> problems;
  auto check = [&](const char* field, auto get, auto show) {
    for (int r = 1; r < size(); ++r) {
      const Arrival& a = *op.arrivals[r];
      if (!(get(a) == get(ref))) {
        problems.push_back(absl::StrCat(field, ": rank ", ranks_[0], " has ", show(ref), ", rank ",
                                        ranks_[r], " has ", show(a)));
        return;
      }
    }
  };
  auto op_name = [](const Arrival& a) {
    return std::string(CollectiveName(static_cast<Collective>(a.desc.collective)));
  };
  check("collective", [](const Arrival& a) { return a.desc.collective; }, op_name);
  check("count", [](const Arrival& a) { return a.desc.count; },
        [](const Arrival& a) { return absl::StrCat(a.desc.count); });
  check("dtype", [](const Arrival& a) { return a.desc.dtype; },
        [](const Arrival& a) { return std::string(DataTypeName(static_cast<DataType>(a.desc.dtype))); });
  const Collective c = static_cast<Collective>(ref.desc.collective);
  const bool reducing = c == Collective::kAllReduce || c == Collective::kReduceScatter ||
                        c == Collective::kReduceScatterAllReduce;
  if (reducing) {
    check("reduce_op", [](const Arrival& a) { return a.desc.reduce_op; },
          [](const Arrival& a) { return std::string(ReduceOpName(static_cast<ReduceOp>(a.desc.reduce_op))); });
    check("reduce_dtype", [](const Arrival& a) { return a.desc.reduce_dtype; },
          [](const Arrival& a) {
            return a.desc.reduce_dtype == 0
                       ? std::string("(buffer dtype)")
                       : std::string(DataTypeName(static_cast<DataType>(a.desc.reduce_dtype)));
          });
    for (auto [field, member] : {std::pair{"premul_factor", &shm::OpDescriptor::premul_factor},
                                 std::pair{"pre_divide", &shm::OpDescriptor::pre_divide},
                                 std::pair{"post_divide", &shm::OpDescriptor::post_divide}}) {
      for (int r = 1; r < size(); ++r) {
        const Arrival& a = *op.arrivals[r];
        if (!SameDouble(a.desc.*member, ref.desc.*member)) {
          problems.push_back(absl::StrCat(field, ": rank ", ranks_[0], " has ", ref.desc.*member,
                                          ", rank ", ranks_[r], " has ", a.desc.*member));
          break;
        }
      }
    }
  }
  if (c == Collective::kBroadcast) {
    check("root", [](const Arrival& a) { return a.desc.root; },
          [](const Arrival& a) { return absl::StrCat(a.desc.root); });
  }
  if (ref.phase2) {
    check("shard group size", [](const Arrival& a) { return a.shard_size; },
          [](const Arrival& a) { return absl::StrCat(a.shard_size); });
  }
  if (problems.empty()) return "";
  return absl::StrCat("members disagree: ", absl::StrJoin(problems, "; "));
}

EngineTask Group::Lower(const PendingOp& op) const {
  const Arrival& ref = *op.arrivals[0];
  const shm::OpDescriptor& d = ref.desc;
  EngineTask t;
  t.collective = static_cast<Collective>(d.collective);
  t.count = d.count;
  t.root = d.root;
  t.spec.dtype = static_cast<DataType>(d.dtype);
  t.spec.op = static_cast<ReduceOp>(d.reduce_op);
  t.spec.wire_dtype = static_cast<DataType>(d.reduce_dtype);
  t.spec.premul_factor = d.premul_factor;
  t.spec.pre_divide = d.pre_divide;
  t.spec.post_divide = d.post_divide;
  for (const auto& a : op.arrivals) {
    t.send.push_back(a->send);
    t.recv.push_back(a->recv);
  }
  if (t.collective == Collective::kReduceScatterAllReduce) {
    const bool sum_like = t.spec.op == ReduceOp::kSum || t.spec.op == ReduceOp::kAvg ||
                          t.spec.op == ReduceOp::kPremulSum;
    if (!ref.phase2) {
      // Phase 1: reduce-scatter with the input-side factors only.
      t.collective = Collective::kReduceScatter;
      if (t.spec.op == ReduceOp::kAvg) t.spec.op = ReduceOp::kSum;
      t.spec.post_divide = 1.0;
    } else {
      // Phase 2: all-reduce of the shard with the output-side factors; AVG
      // divides by the whole mesh (shard size x replicate size) once.
      t.collective = Collective::kAllReduce;
      if (sum_like) {
        if (t.spec.op == ReduceOp::kAvg) t.spec.post_divide *= double(ref.shard_size) * size();
        t.spec.op = ReduceOp::kSum;
      }
      t.spec.premul_factor = 1.0;
      t.spec.pre_divide = 1.0;
    }
  }
  t.priority = PriorityOf(t.collective);
  return t;
}

void Group::Arrive(int group_rank, Arrival arrival) {
  std::vector<Arrival> to_fail;
  absl::Status fail_status;
  {
    absl::MutexLock l(&mu_);
    const uint64_t seq = arrival.seq;
    auto reject_one = [&](absl::Status s) {
      to_fail.push_back(std::move(arrival));
      fail_status = std::move(s);
    };
    if (!broken_.ok()) {
      reject_one(broken_);
    } else if (auto f = failed_.find(seq); f != failed_.end()) {
      reject_one(f->second);
    } else if (seq < next_run_) {
      reject_one(absl::InvalidArgumentError(absl::StrCat(
          "seq: ", seq, " in group ", id_, " already ran (next is ", next_run_, ")")));
    } else if (seq > next_run_ + kMaxSeqAhead) {
      reject_one(absl::InvalidArgumentError(absl::StrCat("seq: ", seq, " in group ", id_,
                                                         " is too far ahead of ", next_run_)));
    } else {
      PendingOp& op = pending_[seq];
      if (op.arrivals.empty()) {
        op.seq = seq;
        op.arrivals.resize(ranks_.size());
        op.first_ns = arrival.first_ns;
      }
      if (op.arrivals[group_rank].has_value()) {
        reject_one(absl::InvalidArgumentError(absl::StrCat(
            "seq: rank ", ranks_[group_rank], " submitted seq ", seq, " of group ", id_, " twice")));
      } else if (!arrival.rejected.ok()) {
        // An invalid submission fails the operation for every member.
        const absl::Status s(arrival.rejected.code(),
                             absl::StrCat(Describe(op), ": rank ", ranks_[group_rank],
                                          "'s submission was rejected: ",
                                          arrival.rejected.message()));
        to_fail = FailLocked(seq, s);
        to_fail.push_back(std::move(arrival));
        fail_status = s;
      } else {
        op.first_ns = std::min(op.first_ns, arrival.first_ns);
        op.arrivals[group_rank] = std::move(arrival);
        if (++op.arrived == size()) {
          if (std::string why = Disagreement(op); !why.empty()) {
            fail_status = absl::InvalidArgumentError(absl::StrCat(Describe(op), ": ", why));
            to_fail = FailLocked(seq, fail_status);
          }
        }
      }
    }
  }
  if (!to_fail.empty()) {
    Notify(std::move(to_fail), fail_status, 0, 0);
    return;
  }
  Pump();
}

std::vector<Arrival> Group::FailLocked(uint64_t seq, const absl::Status& status) {
  std::vector<Arrival> out;
  auto it = pending_.find(seq);
  if (it != pending_.end()) {
    for (auto& a : it->second.arrivals) {
      if (a.has_value()) out.push_back(std::move(*a));
    }
    pending_.erase(it);
  }
  failed_[seq] = status;
  ++ops_failed_;
  PruneFailedLocked();
  return out;
}

void Group::PruneFailedLocked() {
  while (failed_.size() > kMaxRememberedFailures) failed_.erase(failed_.begin());
}

void Group::Pump() {
  for (;;) {
    PendingOp op;
    {
      absl::MutexLock l(&mu_);
      while (failed_.count(next_run_) > 0) ++next_run_;
      auto it = pending_.find(next_run_);
      if (in_flight_ || !broken_.ok() || it == pending_.end() || it->second.arrived < size()) {
        return;
      }
      op = std::move(it->second);
      pending_.erase(it);
      ++next_run_;
      ++ops_started_;
      in_flight_ = true;
    }
    const int64_t start_ns = shm::NowNanos();
    EngineTask task = Lower(op);
    auto shared_op = std::make_shared<PendingOp>(std::move(op));
    // 0: Submit has not returned; 1: finished before Submit returned (this
    // loop goes on); 2: Submit returned first (the callback pumps).
    auto phase = std::make_shared<std::atomic<int>>(0);
    engine_->Submit(std::move(task), [this, self = shared_from_this(), shared_op, start_ns, phase](
                                         absl::Status s, uint64_t exec_ns) {
      {
        absl::MutexLock l(&mu_);
        in_flight_ = false;
      }
      OnDone(std::move(*shared_op), start_ns, std::move(s), exec_ns);
      int expected = 0;
      if (!phase->compare_exchange_strong(expected, 1)) Pump();
    });
    int expected = 0;
    if (phase->compare_exchange_strong(expected, 2)) return;
  }
}

void Group::OnDone(PendingOp op, int64_t start_ns, absl::Status status, uint64_t exec_ns) {
  std::vector<Arrival> arrivals;
  for (auto& a : op.arrivals) arrivals.push_back(std::move(*a));
  const Collective c = static_cast<Collective>(arrivals[0].desc.collective);
  if (c == Collective::kReduceScatterAllReduce && !arrivals[0].phase2) {
    ForwardPhase2(std::move(arrivals), status, start_ns);
    return;
  }
  if (!status.ok()) {
    status = absl::Status(status.code(), absl::StrCat(Describe(op), ": ", status.message()));
  }
  const uint64_t queued = static_cast<uint64_t>(std::max<int64_t>(0, start_ns - op.first_ns));
  Notify(std::move(arrivals), status, queued, exec_ns);
}

void Group::ForwardPhase2(std::vector<Arrival> arrivals, const absl::Status& status,
                          int64_t start_ns) {
  (void)start_ns;
  for (Arrival& a : arrivals) {
    std::shared_ptr<Group> g2 = lookup_(a.desc.group2_id);
    const int r2 = g2 != nullptr ? g2->RankOf(a.session->info().rank) : -1;
    if (g2 == nullptr || r2 < 0) {
      a.session->Complete(a.desc.op_id,
                          absl::FailedPreconditionError(absl::StrCat(
                              "group2_id: replicate group ", a.desc.group2_id, " is gone")),
                          0, 0);
      continue;
    }
    Arrival next;
    next.session = a.session;
    next.desc = a.desc;
    next.seq = a.desc.seq2;
    next.phase2 = true;
    next.shard_size = size();
    next.send = a.recv;
    next.recv = a.recv;
    next.recv_buf = a.recv_buf;
    next.first_ns = a.first_ns;
    if (!status.ok()) {
      next.rejected = absl::Status(status.code(), absl::StrCat("reduce-scatter phase in group ",
                                                               id_, " failed: ", status.message()));
    }
    g2->Arrive(r2, std::move(next));
  }
}

void Group::Notify(std::vector<Arrival> arrivals, const absl::Status& status, uint64_t queued_ns,
                   uint64_t exec_ns) {
  if (!status.ok()) HSDP_LOG(Warning) << status.message();
  for (Arrival& a : arrivals) {
    const Collective c = static_cast<Collective>(a.desc.collective);
    if (!status.ok() && c == Collective::kReduceScatterAllReduce && !a.phase2 &&
        a.rejected.ok()) {
      // A failed first phase still has to release the member's second-phase
      // slot in its replicate group.
      ForwardPhase2({std::move(a)}, status, 0);
      continue;
    }
    a.session->Complete(a.desc.op_id, status, queued_ns, exec_ns);
  }
}

void Group::MemberLeft(const Session* session, const std::string& why) {
  std::vector<Arrival> to_fail;
  absl::Status status;
  {
    absl::MutexLock l(&mu_);
    int rank = -1;
    for (int r = 0; r < size(); ++r) {
      if (members_[r].get() == session) rank = r;
    }
    if (rank < 0) return;
    members_[rank].reset();
    if (broken_.ok()) {
      broken_ = absl::FailedPreconditionError(absl::StrCat(
          "group ", id_, " (job \"", job_id_, "\") is broken: rank ", ranks_[rank], " left (",
          why, "); re-attach the job and create its groups again"));
    }
    status = absl::AbortedError(absl::StrCat("rank ", ranks_[rank], " left the job (", why,
                                             ") while this operation was pending"));
    std::vector<uint64_t> seqs;
    for (auto& [seq, op] : pending_) seqs.push_back(seq);
    for (uint64_t seq : seqs) {
      std::vector<Arrival> f = FailLocked(seq, status);
      for (Arrival& a : f) to_fail.push_back(std::move(a));
    }
  }
  if (!to_fail.empty()) Notify(std::move(to_fail), status, 0, 0);
}

void Group::CheckTimeouts(int64_t now_ns) {
  std::vector<std::pair<std::vector<Arrival>, absl::Status>> fails;
  {
    absl::MutexLock l(&mu_);
    std::vector<uint64_t> expired;
    for (auto& [seq, op] : pending_) {
      if (op.arrived < size() && now_ns - op.first_ns > timeout_ns_) expired.push_back(seq);
    }
    for (uint64_t seq : expired) {
      const PendingOp& op = pending_[seq];
      std::vector<int> missing, arrived;
      for (int r = 0; r < size(); ++r) (op.arrivals[r].has_value() ? arrived : missing).push_back(r);
      absl::Status s = absl::DeadlineExceededError(absl::StrCat(
          Describe(op), ": timed out after ", timeout_ns_ / 1000000, " ms waiting for rank(s) ",
          RanksList(missing), "; arrived: ", RanksList(arrived)));
      fails.emplace_back(FailLocked(seq, s), s);
    }
  }
  bool skipped = false;
  {
    // Complete operations queued behind a sequence number nobody submitted
    // (only a misbehaving client can cause this): fail that number so the
    // queue moves on instead of waiting forever.
    absl::MutexLock l(&mu_);
    if (!in_flight_ && broken_.ok() && !pending_.empty() && pending_.count(next_run_) == 0 &&
        failed_.count(next_run_) == 0) {
      int64_t oldest = now_ns;
      for (auto& [seq, op] : pending_) oldest = std::min(oldest, op.first_ns);
      if (now_ns - oldest > timeout_ns_) {
        failed_[next_run_] = absl::DeadlineExceededError(absl::StrCat(
            "seq ", next_run_, " in group ", id_, " was never submitted by any member within ",
            timeout_ns_ / 1000000, " ms; later operations were waiting for it"));
        ++ops_failed_;
        PruneFailedLocked();
        skipped = true;
      }
    }
  }
  for (auto& [arrivals, s] : fails) Notify(std::move(arrivals), s, 0, 0);
  if (!fails.empty() || skipped) Pump();
}

GroupStats Group::stats() const {
  absl::MutexLock l(&mu_);
  return GroupStats{ops_started_, ops_failed_, pending_.size(), !broken_.ok()};
}

}  // namespace hsdp
