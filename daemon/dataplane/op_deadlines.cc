// OpDeadlines: which waiting operations are past the matching timeout.
// Rules in the header.
#include "daemon/dataplane/op_deadlines.h"

#include <algorithm>

namespace hsdp {

std::vector<OpMatcher::Key> OpDeadlines::ExpiredOps(const OpMatcher& matcher,
                                                    int64_t now_ns) const {
  std::vector<OpMatcher::Key> expired;
  for (const auto& [key, op] : matcher.ops()) {
    const bool waiting = op.arrived < matcher.local_members() || key.first != matcher.epoch();
    if (waiting && Expired(op.first_ns, now_ns)) expired.push_back(key);
  }
  return expired;
}

bool OpDeadlines::NextNeverSubmitted(const OpMatcher& matcher, int64_t now_ns) const {
  if (!matcher.NextMissing()) return false;
  // No operation of the current epoch waits: nothing is held up (yet).
  const int64_t oldest = std::min(now_ns, matcher.OldestFirstNs(matcher.epoch()).value_or(now_ns));
  return Expired(oldest, now_ns);
}

}  // namespace hsdp
