// Test doubles for the dataplane: the fake stream-ordered engine, and helpers that build real Sessions
// (ShmChannel::Create) with registered memfd buffers.
#ifndef HSDP_TESTS_UNIT_DATAPLANE_FAKE_ENGINE_H_
#define HSDP_TESTS_UNIT_DATAPLANE_FAKE_ENGINE_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "daemon/engine/engine.h"
#include "daemon/engine/fake/fake_engine.h"
#include "daemon/session/mapped_buffer.h"
#include "daemon/session/session.h"
#include "daemon/session/shm_channel.h"
#include "hsdp/shm/layout.h"

namespace hsdp::testing {

// The stream-ordered fake from daemon/engine/fake (tasks complete when the
// test says so).
using FakeEngine = FakeStreamEngine;

// A sealed memfd of `bytes`, as the client library makes them.
inline UniqueFd SealedMemfd(uint64_t bytes) {
  UniqueFd fd(::memfd_create("test-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return UniqueFd();
  ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  return fd;
}

inline std::shared_ptr<Session> MakeSession(uint64_t id, int rank, int world_size,
                                            const std::string& job = "job") {
  auto ch = ShmChannel::Create(id, 64);
  if (!ch.ok()) return nullptr;
  SessionInfo info;
  info.job_id = job;
  info.rank = rank;
  info.world_size = world_size;
  info.device = "cpu";
  SessionToken token{};
  token[0] = static_cast<uint8_t>(id);
  auto s = std::make_shared<Session>(id, info, token, std::move(*ch));
  s->MarkDataConnected(1);
  return s;
}

// Registers a buffer of `bytes` with `session`; returns its id (0 on failure).
inline uint64_t AddBuffer(Session& session, uint64_t bytes) {
  auto buf = MappedBuffer::Map(SealedMemfd(bytes), bytes, "test");
  if (!buf.ok()) return 0;
  return session.AddBuffer(std::move(*buf));
}

// The completion record the session's channel holds for `op_id`, or nullptr
// when none was written.
inline const shm::Completion* CompletionOf(Session& session, uint64_t op_id) {
  auto* h = static_cast<shm::ChannelHeader*>(session.channel().region().data());
  const shm::Completion& c = shm::CompletionSlots(h)[op_id & (h->ring_entries - 1)];
  return c.op_id.load(std::memory_order_acquire) == op_id ? &c : nullptr;
}

inline absl::Status StatusOf(const shm::Completion& c) {
  const auto code = static_cast<absl::StatusCode>(c.code);
  if (code == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(code, std::string(c.message, c.message_len));
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_UNIT_DATAPLANE_FAKE_ENGINE_H_
