#include "daemon/engine/engine.h"

#include <algorithm>

namespace hsdp {

uint64_t EngineTask::BytesPerRank() const {
  uint64_t b = count * DataTypeSize(spec.dtype);
  if (collective == Collective::kAllGather || collective == Collective::kReduceScatter ||
      collective == Collective::kAllToAll) {
    b *= members.size();
  }
  for (const EngineMember& m : members) {  // uneven all-to-all: the largest sender
    uint64_t sent = 0;
    for (uint64_t c : m.send_counts) sent += c;
    b = std::max(b, sent * DataTypeSize(spec.dtype));
  }
  return b;
}

bool EngineTask::AllLocal() const {
  for (const EngineMember& m : members) {
    if (!m.local) return false;
  }
  return true;
}

bool EngineTask::AllHost() const {
  for (const EngineMember& m : members) {
    if (m.local && (m.send.kind != MemoryKind::kHost || m.recv.kind != MemoryKind::kHost)) {
      return false;
    }
  }
  return true;
}

}  // namespace hsdp
