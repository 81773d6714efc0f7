#include "daemon/observability/op_labels.h"

#include <algorithm>

#include "hsdp/shm/layout.h"

namespace hsdp {

std::string_view OpName(const Arrival& a) {
  return CollectiveName(static_cast<Collective>(a.desc.collective));
}

std::string_view DtypeName(const Arrival& a) {
  if (a.desc.dtype == 0) return "none";  // barriers carry no data
  return DataTypeName(static_cast<DataType>(a.desc.dtype));
}

std::string_view GroupKind(const GroupSpec& group, const Arrival& a) {
  if (static_cast<Collective>(a.desc.collective) == Collective::kReduceScatterAllReduce) {
    return a.phase2 ? "replicate" : "shard";
  }
  if (a.session != nullptr &&
      a.session->info().world_size == static_cast<int>(group.ranks.size())) {
    return "world";
  }
  return "sub";
}

uint64_t OpBytes(const GroupSpec& group, const Arrival& a) {
  Collective c = static_cast<Collective>(a.desc.collective);
  if (c == Collective::kReduceScatterAllReduce && a.phase2) c = Collective::kAllReduce;
  const shm::OpExtents e = shm::ComputeOpExtents(
      c, a.desc.count, DataTypeSize(static_cast<DataType>(a.desc.dtype)), group.ranks.size());
  return std::max(e.send_bytes, e.recv_bytes);
}

int GlobalRank(const Arrival& a) { return a.session != nullptr ? a.session->info().rank : -1; }

}  // namespace hsdp
