// Private to the client library: Client::Impl and the helpers that
// client.cc (host buffers, groups, collectives) and client_device.cc (device
// memory) share.
#ifndef HSDP_CLIENT_SRC_CLIENT_IMPL_H_
#define HSDP_CLIENT_SRC_CLIENT_IMPL_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "arena.h"
#include "channel.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/client.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"
#include "hsdp/shm/op_rules.h"
#include "hsdp/v1/device.grpc.pb.h"
#include "hsdp/v1/node.grpc.pb.h"

namespace hsdp {
namespace internal {

inline constexpr absl::Duration kRpcTimeout = absl::Seconds(30);

inline absl::Status FromGrpc(const grpc::Status& s, const char* what) {
  if (s.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(s.error_code());
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat(what, ": hsdpd unavailable: ", s.error_message()));
  }
  return absl::Status(code, s.error_message());
}

inline void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + kRpcTimeout));
}

// Point-to-point and all-to-all fields of a submission.
struct Peering {
  int peer = 0;
  int tag = 0;
  BufferRef splits;
};

struct LocalBuffer {
  UniqueFd fd;
  void* data = nullptr;
  size_t size = 0;
  uint64_t daemon_id = 0;  // the id the daemon knows it by (changes on a reconnect)
  std::string name;
};

// A group this client created, kept to re-create it after a reconnect.
struct GroupRecord {
  std::vector<int> ranks;
  uint32_t daemon_id = 0;     // the daemon's id (changes on a reconnect)
  uint32_t daemon_epoch = 0;  // the daemon's epoch of it, for submissions
  uint32_t client_epoch = 0;  // the epoch the caller's Group holds
  // The small-operation arena of daemon epoch `arena_epoch` (null: none).
  std::shared_ptr<GroupArena> arena;
  uint32_t arena_epoch = 0;
  // The group's last operation that went to the daemon: an arena operation
  // starts after it ends (a group's operations run in submission order).
  Work last_daemon_op;
};

}  // namespace internal

class Client::Impl {
 public:
  ClientOptions options;
  std::string socket_path;
  std::shared_ptr<grpc::Channel> grpc_channel;
  std::unique_ptr<v1::Node::Stub> stub;
  std::unique_ptr<v1::DeviceMemory::Stub> device_stub;
  std::atomic<uint64_t> session_id{0};
  uint64_t features = 0;  // negotiated at the first Attach; a reconnect must get the same

  // The live session's channel (replaced by a reconnect).
  std::shared_ptr<internal::SessionChannel> Channel() {
    absl::MutexLock l(&mu);
    return channel;
  }

  absl::Mutex mu;
  std::shared_ptr<internal::SessionChannel> channel ABSL_GUARDED_BY(mu);
  // By the id the caller knows (the daemon's id when it was registered).
  std::map<uint64_t, internal::LocalBuffer> buffers ABSL_GUARDED_BY(mu);
  // By the id the caller knows (the daemon's id when it was created).
  std::map<uint32_t, internal::GroupRecord> groups ABSL_GUARDED_BY(mu);
  uint64_t reconnects ABSL_GUARDED_BY(mu) = 0;
  // The uid of the daemon this client first connected to: a reconnect hands
  // its memory (memfds) only to a daemon of the same uid, never to another
  // user's process that took the socket path while hsdpd was down.
  uint32_t daemon_uid ABSL_GUARDED_BY(mu) = 0;
  // Serialises reconnects (held across RPCs; never while holding mu).
  absl::Mutex reconnect_mu;
  // Registered device buffers: id -> size in bytes (ranges are checked here
  // before a submission, as for host buffers).
  std::map<uint64_t, uint64_t> device_buffers ABSL_GUARDED_BY(mu);
  uint64_t next_fd_tag ABSL_GUARDED_BY(mu) = 1;
  bool detached ABSL_GUARDED_BY(mu) = false;

  ~Impl() {
    (void)Detach();
    absl::MutexLock l(&mu);
    for (auto& [id, b] : buffers) ::munmap(b.data, b.size);
  }

  absl::Status Detach() {
    {
      absl::MutexLock l(&mu);
      if (detached) return absl::OkStatus();
      detached = true;
    }
    // The arenas first: the others hear that this member left while hsdpd
    // still holds them (the Detach below ends the groups and releases them).
    CloseArenas(absl::CancelledError("the client detached"));
    absl::Status rpc = absl::OkStatus();
    if (stub != nullptr && session_id != 0) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      v1::DetachRequest req;
      req.set_session_id(session_id);
      v1::DetachResponse resp;
      rpc = internal::FromGrpc(stub->Detach(&ctx, req, &resp), "Detach");
    }
    if (auto ch = Channel(); ch != nullptr) ch->Close(absl::CancelledError("the client detached"));
    return rpc;
  }

  // Fails every arena's pending operations with `why` (nothing is written to
  // a buffer afterwards) and forgets the arenas.
  void CloseArenas(const absl::Status& why) {
    std::vector<std::shared_ptr<internal::GroupArena>> arenas;
    {
      absl::MutexLock l(&mu);
      for (auto& [id, g] : groups) {
        if (g.arena != nullptr) arenas.push_back(std::move(g.arena));
        g.arena = nullptr;
      }
    }
    for (auto& a : arenas) a->Close(why);
  }
  // Completes every pending arena operation (before a buffer is unmapped).
  void DrainArenas() {
    std::vector<std::shared_ptr<internal::GroupArena>> arenas;
    {
      absl::MutexLock l(&mu);
      for (auto& [id, g] : groups) {
        if (g.arena != nullptr) arenas.push_back(g.arena);
      }
    }
    for (auto& a : arenas) (void)a->Drain();
  }
  // The arena a NewGroup reply announced (null when none): its fd from the
  // data connection, mapped for group rank `rank` of `size`.
  absl::StatusOr<std::shared_ptr<internal::GroupArena>> ReceiveArena(
      const internal::SessionChannel& channel, const v1::NewGroupResponse& resp,
      const std::vector<int>& ranks);
  // When a submission to an arena last checked that the daemon is there.
  std::atomic<int64_t> last_health_ns{0};
  // Arena fds that arrived for another thread's NewGroup, by tag.
  absl::Mutex inbox_mu;
  std::map<uint64_t, UniqueFd> arena_inbox ABSL_GUARDED_BY(inbox_mu);

  // A session attached and mapped, not yet in use.
  struct NewSession {
    uint64_t id = 0;
    uint64_t features = 0;
    uint32_t daemon_uid = 0;  // SO_PEERCRED of the data connection
    std::shared_ptr<internal::SessionChannel> channel;
  };
  // Attach (with options), the data connection and the channel's mapping.
  absl::StatusOr<NewSession> AttachAndMap();
  // Makes `s` the session in use.
  void Publish(NewSession s);
  // Sends `fd` over session `session_id`'s data connection `data_fd` and
  // registers it: the daemon's id.
  absl::StatusOr<uint64_t> RegisterFd(uint64_t session_id, int data_fd, int fd, size_t bytes,
                                      const std::string& name);
  // After the daemon went away: waits (options.reconnect_timeout) for one to
  // answer on the same socket, attaches again, registers every host buffer
  // again and re-creates every group in creation order (so each gets the
  // same global key), each in the daemon's first epoch. `seen` is the
  // reconnect count the caller saw fail: when another thread already
  // reconnected since, returns OK at once.
  absl::Status Reconnect(uint64_t seen);
  // Whether the live session's channel is closed because the daemon went
  // away (UNAVAILABLE), so a reconnect may help.
  bool DaemonGone();
  uint64_t ReconnectCount() {
    absl::MutexLock l(&mu);
    return reconnects;
  }
  // Before an RPC: reconnects first when the daemon went away (and
  // options.reconnect is set).
  absl::Status EnsureConnected();
  // The daemon's group id and epoch for the caller's group (INVALID_ARGUMENT
  // for a group this client did not create).
  absl::Status TranslateGroup(const Group& g, uint32_t* id, uint32_t* epoch);
  // The daemon's buffer id for the caller's (device ids pass through).
  uint64_t TranslateBuffer(uint64_t id);

  // Checks that [ref.offset, ref.offset + bytes) lies in a buffer of this client.
  absl::Status CheckRange(const char* field, BufferRef ref, uint64_t bytes) {
    if (bytes == 0) return absl::OkStatus();  // nothing is read or written
    absl::MutexLock l(&mu);
    if (shm::IsDeviceBufferId(ref.buffer_id)) {
      auto d = device_buffers.find(ref.buffer_id);
      if (d == device_buffers.end()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": unknown device buffer id ", ref.buffer_id));
      }
      if (ref.offset_bytes > d->second || bytes > d->second - ref.offset_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ": range [", ref.offset_bytes, ", ", ref.offset_bytes + bytes,
            ") is outside device buffer ", ref.buffer_id, " of ", d->second, " bytes"));
      }
      return absl::OkStatus();
    }
    auto it = buffers.find(ref.buffer_id);
    if (it == buffers.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": unknown buffer id ", ref.buffer_id));
    }
    if (ref.offset_bytes > it->second.size || bytes > it->second.size - ref.offset_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": range [", ref.offset_bytes, ", ", ref.offset_bytes + bytes,
          ") is outside buffer ", ref.buffer_id, " of ", it->second.size, " bytes"));
    }
    return absl::OkStatus();
  }

  // The extents an uneven all-to-all's splits imply (read from our mapping).
  absl::StatusOr<shm::OpExtents> SplitExtents(BufferRef splits, int n, size_t es) {
    RETURN_IF_ERROR(CheckRange("splits", splits, 2 * uint64_t(n) * sizeof(uint64_t)));
    absl::MutexLock l(&mu);
    const auto* counts = reinterpret_cast<const uint64_t*>(
        static_cast<const char*>(buffers.at(splits.buffer_id).data) + splits.offset_bytes);
    uint64_t send = 0, recv = 0;
    for (int i = 0; i < n; ++i) {
      if (counts[i] > shm::kMaxCount || counts[n + i] > shm::kMaxCount) {
        return absl::InvalidArgumentError(absl::StrCat("splits: count for rank ", i, " is above 2^40"));
      }
      send += counts[i];
      recv += counts[n + i];
    }
    if (send > shm::kMaxCount || recv > shm::kMaxCount) {
      return absl::InvalidArgumentError("splits: the counts add up to more than 2^40 elements");
    }
    return shm::OpExtents{send * es, recv * es};
  }

  // Submits; when the daemon went away (the op fails UNAVAILABLE at once)
  // and options.reconnect is set, reconnects and submits it once more.
  absl::StatusOr<Work> Submit(Collective kind, const Group& g, const Group* g2, BufferRef send,
                              BufferRef recv, size_t count, DataType dtype,
                              const ReduceOptions& reduce, int root, internal::Peering peering = {},
                              const SubmitOptions& opts = {}) {
    const uint64_t seen = ReconnectCount();
    absl::StatusOr<Work> w =
        SubmitOnce(kind, g, g2, send, recv, count, dtype, reduce, root, peering, opts);
    if (w.ok() || !absl::IsUnavailable(w.status()) || !options.reconnect || !DaemonGone()) {
      return w;
    }
    RETURN_IF_ERROR(Reconnect(seen));
    return SubmitOnce(kind, g, g2, send, recv, count, dtype, reduce, root, peering, opts);
  }

  absl::StatusOr<Work> SubmitOnce(Collective kind, const Group& g, const Group* g2,
                                  BufferRef send, BufferRef recv, size_t count, DataType dtype,
                                  const ReduceOptions& reduce, int root,
                                  internal::Peering peering, const SubmitOptions& opts) {
    if (g.size <= 0 || (g2 != nullptr && g2->size <= 0)) {
      return absl::InvalidArgumentError("group: not created by NewGroup");
    }
    shm::OpDescriptor d{};
    d.collective = static_cast<uint8_t>(kind);
    RETURN_IF_ERROR(TranslateGroup(g, &d.group_id, &d.epoch));
    if (g2 != nullptr) RETURN_IF_ERROR(TranslateGroup(*g2, &d.group2_id, &d.epoch2));
    d.root = root;
    d.peer = peering.peer;
    d.tag = peering.tag;
    d.splits = {peering.splits.buffer_id == 0 ? 0 : TranslateBuffer(peering.splits.buffer_id),
                peering.splits.offset_bytes};
    d.premul_factor = d.pre_divide = d.post_divide = 1.0;
    if (opts.latency_critical && (features & shm::kFeatureOpPriority) != 0) {
      d.flags |= shm::kFlagLatencyCritical;
    }
    if (opts.wait_event_id != 0) {
      d.flags |= shm::kFlagWaitEvent;
      d.event_id = opts.wait_event_id;
    }
    if (kind != Collective::kBarrier) {
      d.count = count;
      d.dtype = static_cast<uint8_t>(dtype);
      d.send = {send.buffer_id == 0 ? 0 : TranslateBuffer(send.buffer_id), send.offset_bytes};
      d.recv = {recv.buffer_id == 0 ? 0 : TranslateBuffer(recv.buffer_id), recv.offset_bytes};
    }
    if (shm::IsReducing(kind)) {
      d.reduce_op = static_cast<uint8_t>(reduce.op);
      d.reduce_dtype = static_cast<uint8_t>(reduce.reduce_dtype);
      d.premul_factor = reduce.premul_factor;
      d.pre_divide = reduce.pre_divide;
      d.post_divide = reduce.post_divide;
    }
    // The daemon's own rules (hsdp/shm/op_rules.h), applied before anything moves.
    RETURN_IF_ERROR(shm::CheckDescriptorFields(d, features));
    if (kind == Collective::kSend || kind == Collective::kRecv) {
      if (d.peer >= g.size || d.peer == g.rank) {
        return absl::InvalidArgumentError(absl::StrCat(
            "peer: ", d.peer, " is not another rank of a group of size ", g.size));
      }
    }
    if (kind != Collective::kBarrier) {
      shm::OpExtents ext = shm::ComputeOpExtents(kind, count, DataTypeSize(dtype), g.size);
      if (peering.splits.buffer_id != 0) {
        ASSIGN_OR_RETURN(ext, SplitExtents(peering.splits, g.size, DataTypeSize(dtype)));
      }
      RETURN_IF_ERROR(CheckRange("send", send, ext.send_bytes));
      RETURN_IF_ERROR(CheckRange("recv", recv, ext.recv_bytes));
    }
    return Route(kind, g, g2, d, send, recv, count, dtype, reduce, root, opts);
  }

  // The operation's path: the group's arena when it takes it (every member
  // decides alike: the same group, epoch, collective and sizes), else the
  // daemon. A group's operations keep their submission order across the two.
  absl::StatusOr<Work> Route(Collective kind, const Group& g, const Group* g2,
                             const shm::OpDescriptor& d, BufferRef send, BufferRef recv,
                             size_t count, DataType dtype, const ReduceOptions& reduce, int root,
                             const SubmitOptions& opts) {
    std::shared_ptr<internal::GroupArena> arena, arena2;
    Work prior;
    internal::ArenaOp op;
    {
      absl::MutexLock l(&mu);
      internal::GroupRecord& rec = groups.at(g.id);
      if (g2 != nullptr) arena2 = groups.at(g2->id).arena;
      if (rec.arena != nullptr && g2 == nullptr && d.epoch == rec.arena_epoch &&
          opts.wait_event_id == 0 && !shm::IsDeviceBufferId(send.buffer_id) &&
          !shm::IsDeviceBufferId(recv.buffer_id) && rec.arena->Takes(kind, count, dtype)) {
        arena = rec.arena;
        prior = rec.last_daemon_op;
        op.collective = kind;
        op.dtype = dtype;
        op.count = count;
        op.reduce = reduce;
        op.root = root;
        // (CheckRange found both in `buffers` unless nothing is read or written.)
        if (auto it = buffers.find(send.buffer_id); it != buffers.end()) {
          op.send = static_cast<const char*>(it->second.data) + send.offset_bytes;
        }
        if (auto it = buffers.find(recv.buffer_id); it != buffers.end()) {
          op.recv = static_cast<char*>(it->second.data) + recv.offset_bytes;
        }
      } else {
        arena = rec.arena;  // drained below: its operations come first
      }
    }
    if (op.collective != Collective::kInvalid) {
      // The arena works without the daemon, but a session whose daemon went
      // away is over: looked at once a millisecond (a poll), and whenever
      // the arena broke. The first member to see it breaks the arena for all
      // (their operations fail UNAVAILABLE, as in the rings), and this
      // submission reconnects (Submit) and goes to the new session's arena.
      const int64_t now = shm::NowNanos();
      if (now - last_health_ns.load(std::memory_order_relaxed) > 1'000'000 ||
          !arena->Health().ok()) {
        last_health_ns.store(now, std::memory_order_relaxed);
        if (DaemonGone()) {
          absl::Status why = Channel()->Health();
          if (why.ok()) why = absl::UnavailableError("hsdpd went away");
          arena->Fail(why);
          return arena->Submit(op);  // fails: GroupArena::Submit says how
        }
      }
      if (!prior.Test()) (void)prior.Wait();  // ends: failed, or at its deadline
      return arena->Submit(op);
    }
    if (arena != nullptr) (void)arena->Drain();
    if (arena2 != nullptr) (void)arena2->Drain();
    absl::StatusOr<Work> w = Channel()->Submit(d, g2 != nullptr);
    if (w.ok()) {
      absl::MutexLock l(&mu);
      groups.at(g.id).last_daemon_op = *w;
      if (g2 != nullptr) groups.at(g2->id).last_daemon_op = *w;
    }
    return w;
  }
};

}  // namespace hsdp

#endif  // HSDP_CLIENT_SRC_CLIENT_IMPL_H_
