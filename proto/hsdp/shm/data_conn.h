// The data connection: a plain stream on the daemon's Unix socket that a
// session opens after Attach, used only to pass file descriptors
// (SCM_RIGHTS) and to tie the session's life to the client process: when it
// closes (the process exits or dies), the daemon ends the session.
//
// The daemon tells data connections from gRPC connections by their first 8
// bytes: kDataHelloMagic here, the HTTP/2 preface ("PRI * HT") for gRPC.
#ifndef HSDP_SHM_DATA_CONN_H_
#define HSDP_SHM_DATA_CONN_H_

#include <cstdint>
#include <cstring>

namespace hsdp::shm {

inline constexpr char kDataHelloMagic[8] = {'H', 'S', 'D', 'P', 'D', 'A', 'T', '1'};
inline constexpr uint32_t kSessionTokenBytes = 16;

// client -> daemon, first message.
struct DataHello {
  char magic[8];
  uint32_t version;  // kLayoutVersion
  uint32_t reserved;
  uint64_t session_id;
  uint8_t token[kSessionTokenBytes];
};
static_assert(sizeof(DataHello) == 40);

// daemon -> client, reply to DataHello. On success (code 0) it carries two
// fds: the session channel (a sealed memfd of `channel_bytes`) and the
// daemon's wake eventfd (write 8 bytes to wake a sleeping dispatcher).
struct DataHelloReply {
  int32_t code;  // absl::StatusCode
  uint32_t message_len;
  uint64_t channel_bytes;
  uint64_t reserved;  // 0
  char message[232];
};
static_assert(sizeof(DataHelloReply) == 256);

inline constexpr uint32_t kFdMessageMagic = 0x31444648;  // "HFD1"
// What an FdMessage carries (FdMessage::kind).
enum FdKind : uint32_t {
  // A host memfd, claimed by RegisterBuffer(fd_tag). The only kind before
  // device memory; the field was a reserved 0 then, so old clients send it.
  kFdKindMemfd = 0,
  // A device-memory handle (a cuMem allocation exported as a POSIX fd),
  // claimed only by RegisterDeviceBuffer(fd_tag). Accepted only from a
  // session that negotiated kFeatureDeviceMemory; never a socket, pipe,
  // directory or plain file.
  kFdKindDeviceHandle = 1,
};
// client -> daemon: one fd attached, to be claimed by the registration call
// that names fd_tag. Any other `kind` ends the session.
struct FdMessage {
  uint32_t magic;
  uint32_t kind;  // FdKind
  uint64_t fd_tag;
};
static_assert(sizeof(FdMessage) == 16);

// daemon -> client, after the hello: a group's small-operation arena
// (arena.h), one fd attached, sent before the NewGroup reply that names
// `fd_tag` (NewGroupResponse.arena_fd_tag). The only message the daemon
// sends after the hello.
inline constexpr uint32_t kArenaMessageMagic = 0x31524148;  // "HAR1"
struct ArenaMessage {
  uint32_t magic;
  uint32_t reserved;  // 0
  uint64_t fd_tag;
};
static_assert(sizeof(ArenaMessage) == 16);

}  // namespace hsdp::shm

#endif  // HSDP_SHM_DATA_CONN_H_
