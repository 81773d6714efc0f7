// Group: construction, and the members' submissions of collectives matched per
// (epoch, sequence number): each is checked against the epoch, then against
// the sequence window and the queue bound (OpMatcher, op_matcher.h), then an
// operation's submissions against each other (agreement.h); the operation is
// ready when every local member's is in. Also the descriptions that name an
// operation in errors, one operation failing (counted; OpMatcher remembers it
// for late arrivals), who arrived last (RankWait), and the stats.
// The rest of Group: group.h lists its files (same class, same locking rules).
#include "daemon/dataplane/group.h"

#include <algorithm>
#include <climits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/dataplane/agreement.h"
#include "daemon/dataplane/op_observer.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp {
namespace {

constexpr size_t kMaxListedRanks = 16;

// "[0, 1, 2]", or the first kMaxListedRanks and a count of the rest, so a
// huge group cannot flood logs and completion messages.
std::string ListRanks(const std::vector<int>& ranks) {
  if (ranks.size() <= kMaxListedRanks) return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
  std::vector<int> head(ranks.begin(), ranks.begin() + kMaxListedRanks);
  return absl::StrCat("[", absl::StrJoin(head, ", "), ", ... (", ranks.size() - kMaxListedRanks,
                      " more)]");
}

// How many of the group's members this daemon hosts (as local_ranks_ counts them).
int LocalMembers(const GroupSpec& spec) {
  int n = 0;
  for (size_t r = 0; r < spec.ranks.size(); ++r) {
    if (spec.nodes.empty() || spec.nodes[r] == spec.this_node) ++n;
  }
  return n;
}

}  // namespace

std::string GroupKey(const JobKey& job, const std::vector<int>& ranks, int k) {
  // Unambiguous: the owner, a length-prefixed job id, then numbers.
  return absl::StrCat(job.Encoded(), "/", absl::StrJoin(ranks, ","), "#", k);
}

Group::Group(GroupSpec spec, Engine* engine, GroupLookup lookup)
    : spec_(std::move(spec)),
      clock_(spec_.clock != nullptr ? spec_.clock : Clock::Real()),
      job_{spec_.owner_uid, spec_.job_id},
      job_encoded_(job_.Encoded()),
      engine_(engine),
      lookup_(std::move(lookup)),
      deadlines_(spec_.timeout_ns),
      matcher_(spec_.id, LocalMembers(spec_), spec_.max_pending,
               std::max<uint32_t>(1, spec_.first_epoch)) {
  const int n = size();
  local_index_.assign(n, -1);
  for (int r = 0; r < n; ++r) {
    const bool local = spec_.nodes.empty() || spec_.nodes[r] == spec_.this_node;
    if (local) {
      local_index_[r] = static_cast<int>(local_ranks_.size());
      local_ranks_.push_back(r);
    }
  }
  members_.resize(n);
  epoch_ = std::max<uint32_t>(1, spec_.first_epoch);
  joined_epoch_.assign(n, epoch_);
  waits_.resize(n);
}

int Group::RankOf(int global_rank) const {
  for (size_t i = 0; i < spec_.ranks.size(); ++i) {
    if (spec_.ranks[i] == global_rank) return static_cast<int>(i);
  }
  return -1;
}

bool Group::IsLocal(int group_rank) const {
  return group_rank >= 0 && group_rank < size() && local_index_[group_rank] >= 0;
}

uint32_t Group::epoch() const {
  absl::MutexLock l(&mu_);
  return epoch_;
}

bool Group::IsMember(int group_rank, const Session* session) const {
  absl::MutexLock l(&mu_);
  return IsLocal(group_rank) && members_[group_rank].get() == session;
}

std::string Group::RanksList(const std::vector<int>& group_ranks) const {
  std::vector<int> global;
  for (int r : group_ranks) global.push_back(spec_.ranks[r]);
  return ListRanks(global);
}

const Arrival& Group::AnyArrival(const PendingOp& op) const {
  if (!op.arrivals.empty()) return op.arrivals.begin()->second;
  static const Arrival kNone;
  return kNone;
}

std::string Group::Describe(const PendingOp& op) const {
  const Arrival& a = AnyArrival(op);
  const auto c = static_cast<Collective>(a.desc.collective);
  return absl::StrCat(
      std::string(CollectiveName(c)), a.phase2 ? " (all-reduce phase)" : "", " seq ", op.seq,
      op.epoch > 1 ? absl::StrCat(" epoch ", op.epoch) : "", " in group ", spec_.id, " (job \"",
      spec_.job_id, "\", ",
      // Short, so what follows (who is missing) fits a completion record.
      size() <= 8 ? absl::StrCat("ranks ", ListRanks(spec_.ranks)) : absl::StrCat(size(), " ranks"),
      ")");
}

void Group::Arrive(int group_rank, Arrival arrival) {
  const auto kind = static_cast<Collective>(arrival.desc.collective);
  if (kind == Collective::kSend || kind == Collective::kRecv) {
    return ArriveP2P(group_rank, std::move(arrival));
  }
  std::vector<Arrival> to_fail;
  absl::Status fail_status;
  {
    absl::MutexLock l(&mu_);
    const uint64_t seq = arrival.seq;
    const uint32_t epoch = arrival.epoch;
    arrival.arrived_ns = clock_->NowNanos();
    if (spec_.observer != nullptr) spec_.observer->OnArrival(spec_, arrival);
    auto reject_one = [&](absl::Status s) {
      to_fail.push_back(std::move(arrival));
      fail_status = std::move(s);
    };
    const bool local = IsLocal(group_rank);
    const bool next_epoch_queue = local && !epoch_failure_.ok() && epoch == epoch_ + 1 &&
                                  joined_epoch_[group_rank] == epoch_ + 1;
    const bool runnable_slot = epoch_failure_.ok() && matcher_.InWindow(epoch, seq);
    if (!local) {
      reject_one(absl::InvalidArgumentError(
          absl::StrCat("group_id: group rank ", group_rank, " is not on this node")));
    } else if (!arrival.rejected.ok() && !runnable_slot) {
      // Invalid, and not naming an operation it could fail for the others.
      reject_one(arrival.rejected);
    } else if (epoch < epoch_ || (epoch == epoch_ && !epoch_failure_.ok())) {
      reject_one(epoch == epoch_
                     ? epoch_failure_
                     : absl::FailedPreconditionError(absl::StrCat(
                           "epoch: epoch ", epoch, " of group ", spec_.id, " is over (now ", epoch_,
                           "); join the group again for the current epoch")));
    } else if (epoch != epoch_ && !next_epoch_queue) {
      reject_one(absl::InvalidArgumentError(absl::StrCat(
          "epoch: ", epoch, " is not an epoch group ", spec_.id, " can run (current ", epoch_,
          epoch_failure_.ok() ? ")" : ", failed; join the group again first)")));
    } else if (absl::Status slot = matcher_.Check(epoch, seq); !slot.ok()) {
      reject_one(std::move(slot));
    } else {
      // Read before Add moves the arrival into the operation.
      const absl::Status rejected = arrival.rejected;
      const bool first_phase_failed = arrival.phase2;  // its only way to be rejected
      const PendingOp* op = nullptr;
      switch (matcher_.Add(local_index_[group_rank], arrival, &op)) {
        case OpMatcher::Added::kDuplicate:
          reject_one(absl::InvalidArgumentError(absl::StrCat("seq: rank ", spec_.ranks[group_rank],
                                                             " submitted seq ", seq, " of group ",
                                                             spec_.id, " twice")));
          break;
        case OpMatcher::Added::kRejected: {
          // An invalid submission fails the operation for every member (it
          // is in the operation, so Describe names its collective).
          const absl::Status s =
              first_phase_failed
                  ? rejected
                  : absl::Status(rejected.code(),
                                 absl::StrCat(Describe(*op), ": rank ", spec_.ranks[group_rank],
                                              "'s submission was rejected: ", rejected.message()));
          to_fail = FailLocked({epoch, seq}, s);
          fail_status = s;
          break;
        }
        case OpMatcher::Added::kAllArrived:
          if (std::string why = MembersDisagree(op->arrivals, local_ranks_, spec_.ranks);
              !why.empty()) {
            fail_status = absl::InvalidArgumentError(absl::StrCat(Describe(*op), ": ", why));
            to_fail = FailLocked({epoch, seq}, fail_status);
          } else {
            RecordWaitsLocked(*op);
            if (spec_.observer != nullptr) spec_.observer->OnMatched(spec_, op->arrivals);
          }
          break;
        case OpMatcher::Added::kWaiting:
          break;
      }
    }
  }
  if (!to_fail.empty()) {
    Notify(std::move(to_fail), fail_status, 0, 0);
    return;
  }
  Pump();
}

void Group::RecordWaitsLocked(const PendingOp& op) {
  if (op.arrivals.size() < 2) return;
  int last = -1;
  int64_t last_ns = INT64_MIN, second_ns = INT64_MIN;
  for (const auto& [li, a] : op.arrivals) {
    const int64_t t = a.arrived_ns;
    if (t > last_ns) {
      second_ns = last_ns;
      last_ns = t;
      last = li;
    } else if (t > second_ns) {
      second_ns = t;
    }
  }
  RankWait& w = waits_[local_ranks_[last]];
  ++w.times_last;
  w.waited_ns += static_cast<uint64_t>(last_ns - second_ns);
}

std::vector<Arrival> Group::FailLocked(OpKey key, const absl::Status& status) {
  ++ops_failed_;
  return matcher_.Fail(key, status);
}

GroupStats Group::stats() const {
  absl::MutexLock l(&mu_);
  GroupStats st;
  st.ops_started = ops_started_;
  st.ops_failed = ops_failed_;
  st.pending = matcher_.size();
  st.running = running_.size();
  st.epoch = epoch_;
  st.broken = !epoch_failure_.ok();
  st.waits = waits_;
  return st;
}

}  // namespace hsdp
