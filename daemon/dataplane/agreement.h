// Whether the members' submissions of one collective agree: the same
// collective, count, dtype and memory kind; for reductions the same reduce op,
// reduce dtype and factors (bit for bit); the same root for a broadcast; for
// an uneven all-to-all, what each member sends to another is what that one
// expects; for a composite's second phase the same shard group size. The
// daemon runs an operation only when they do; otherwise every member gets
// the same message naming the fields and the ranks.
#ifndef HSDP_DAEMON_DATAPLANE_AGREEMENT_H_
#define HSDP_DAEMON_DATAPLANE_AGREEMENT_H_

#include <map>
#include <string>
#include <vector>

#include "daemon/dataplane/group.h"

namespace hsdp {

// `arrivals` by local index; `local_ranks[li]` is local member li's group
// rank, `ranks[group_rank]` its global rank (what the message names). Empty
// when they agree, else "members disagree: <field>: rank A has X, rank B has
// Y; ...", one problem per field.
std::string MembersDisagree(const std::map<int, Arrival>& arrivals,
                            const std::vector<int>& local_ranks, const std::vector<int>& ranks);

}  // namespace hsdp

#endif  // HSDP_DAEMON_DATAPLANE_AGREEMENT_H_
