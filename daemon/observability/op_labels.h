// What observability reports about one operation, derived from its group
// and one of its arrivals: low-cardinality labels (operation, dtype, group
// kind) and its size. Shared by metrics, the trace and straggler stats.
#ifndef HSDP_DAEMON_OBSERVABILITY_OP_LABELS_H_
#define HSDP_DAEMON_OBSERVABILITY_OP_LABELS_H_

#include <cstdint>
#include <string_view>

#include "daemon/dataplane/group.h"

namespace hsdp {

// "all_reduce", ...; the HSDP composite is "reduce_scatter_all_reduce" in
// both of its groups (GroupKind tells the phases apart).
std::string_view OpName(const Arrival& a);
// "float32", ...; "none" when unset (barriers).
std::string_view DtypeName(const Arrival& a);
// "shard" / "replicate" for the two phases of the HSDP composite, else
// "world" when the group spans the job's world, else "sub".
std::string_view GroupKind(const GroupSpec& group, const Arrival& a);
// The operation's buffer size per rank, as nccl-tests counts it: the
// all-gather output, the reduce-scatter input, the all-reduce buffer; 0 for
// a barrier. Only meaningful for validated arrivals.
uint64_t OpBytes(const GroupSpec& group, const Arrival& a);
// The submitting member's global rank (-1 without a session).
int GlobalRank(const Arrival& a);

}  // namespace hsdp

#endif  // HSDP_DAEMON_OBSERVABILITY_OP_LABELS_H_
