// OpMatcher: the sequence window, adding submissions, taking the next
// operation out to run, failing operations (remembered for late
// submissions), and a leaving member's queued submissions. Rules in the
// header.
#include "daemon/dataplane/op_matcher.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace hsdp {

OpMatcher::OpMatcher(uint32_t group_id, int local_members, uint32_t max_pending, uint32_t epoch)
    : group_id_(group_id),
      local_members_(local_members),
      max_pending_(max_pending),
      epoch_(epoch) {}

const PendingOp* OpMatcher::Find(Key key) const {
  auto it = pending_.find(key);
  return it == pending_.end() ? nullptr : &it->second;
}

void OpMatcher::StartEpoch(uint32_t epoch) {
  epoch_ = epoch;
  next_seq_ = 1;
  failed_.clear();
}

bool OpMatcher::InWindow(uint32_t epoch, uint64_t seq) const {
  return epoch == epoch_ && seq >= next_seq_ && seq <= next_seq_ + max_pending_;
}

absl::Status OpMatcher::Check(uint32_t epoch, uint64_t seq) const {
  if (epoch == epoch_) {
    if (auto it = failed_.find(seq); it != failed_.end()) return it->second;
  }
  if (seq == 0 || (epoch == epoch_ && seq < next_seq_)) {
    return absl::InvalidArgumentError(absl::StrCat("seq: ", seq, " in group ", group_id_,
                                                   " already ran (next is ", next_seq_, ")"));
  }
  if (seq > (epoch == epoch_ ? next_seq_ : 1) + max_pending_) {
    return absl::InvalidArgumentError(
        absl::StrCat("seq: ", seq, " in group ", group_id_, " is more than ", max_pending_,
                     " operations ahead of the next one to run"));
  }
  if (pending_.count({epoch, seq}) == 0 && pending_.size() >= max_pending_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("group ", group_id_, " already has ", pending_.size(),
                     " operations waiting for members (limits.max_pending_ops)"));
  }
  return absl::OkStatus();
}

OpMatcher::Added OpMatcher::Add(int local_index, Arrival& arrival, const PendingOp** out) {
  PendingOp& op = pending_[{arrival.epoch, arrival.seq}];
  if (out != nullptr) *out = &op;
  if (op.seq == 0) {  // new (sequence numbers start at 1)
    op.epoch = arrival.epoch;
    op.seq = arrival.seq;
    op.first_ns = arrival.first_ns;
  }
  if (op.arrivals.count(local_index) > 0) return Added::kDuplicate;
  if (!arrival.rejected.ok()) {
    // Stored so the operation can still be described; the caller fails it.
    op.arrivals[local_index] = std::move(arrival);
    return Added::kRejected;
  }
  op.first_ns = std::min(op.first_ns, arrival.first_ns);
  op.arrivals[local_index] = std::move(arrival);
  return ++op.arrived == local_members_ ? Added::kAllArrived : Added::kWaiting;
}

void OpMatcher::SkipFailed() {
  while (failed_.count(next_seq_) > 0) ++next_seq_;
}

std::optional<PendingOp> OpMatcher::TakeReady() {
  auto it = pending_.find({epoch_, next_seq_});
  if (it == pending_.end() || it->second.arrived < local_members_) return std::nullopt;
  std::optional<PendingOp> op(std::move(it->second));
  pending_.erase(it);
  ++next_seq_;
  return op;
}

std::vector<Arrival> OpMatcher::Fail(Key key, const absl::Status& status) {
  std::vector<Arrival> out;
  auto it = pending_.find(key);
  if (it != pending_.end()) {
    for (auto& [li, a] : it->second.arrivals) out.push_back(std::move(a));
    pending_.erase(it);
  }
  if (key.first == epoch_) {
    failed_[key.second] = status;
    while (failed_.size() > kMaxRememberedFailures) failed_.erase(failed_.begin());
  }
  return out;
}

std::vector<Arrival> OpMatcher::FailEpoch(uint32_t epoch, const absl::Status& status,
                                          size_t* ops) {
  std::vector<Key> keys;
  for (const auto& [key, op] : pending_) {
    if (key.first == epoch) keys.push_back(key);
  }
  std::vector<Arrival> out;
  for (const Key& key : keys) {
    for (Arrival& a : Fail(key, status)) out.push_back(std::move(a));
  }
  if (ops != nullptr) *ops = keys.size();
  return out;
}

std::vector<Arrival> OpMatcher::TakeQueued(const Session* session) {
  std::vector<Arrival> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    PendingOp& op = it->second;
    if (it->first.first != epoch_) {
      for (auto a = op.arrivals.begin(); a != op.arrivals.end();) {
        if (a->second.session.get() == session) {
          out.push_back(std::move(a->second));
          a = op.arrivals.erase(a);
          --op.arrived;
        } else {
          ++a;
        }
      }
    }
    it = op.arrivals.empty() ? pending_.erase(it) : std::next(it);
  }
  return out;
}

bool OpMatcher::NextMissing() const {
  return !pending_.empty() && pending_.count({epoch_, next_seq_}) == 0 &&
         failed_.count(next_seq_) == 0;
}

std::optional<int64_t> OpMatcher::OldestFirstNs(uint32_t epoch) const {
  std::optional<int64_t> oldest;
  for (const auto& [key, op] : pending_) {
    if (key.first == epoch) oldest = std::min(oldest.value_or(op.first_ns), op.first_ns);
  }
  return oldest;
}

void OpMatcher::FailNext(const absl::Status& status) { failed_[next_seq_] = status; }

}  // namespace hsdp
