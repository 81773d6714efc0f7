#include "daemon/engine/engine.h"

namespace hsdp {

uint64_t EngineTask::BytesPerRank() const {
  uint64_t b = count * DataTypeSize(spec.dtype);
  if (collective == Collective::kAllGather || collective == Collective::kReduceScatter) {
    b *= members.size();
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
