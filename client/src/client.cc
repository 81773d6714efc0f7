#include "hsdp/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <algorithm>
#include <map>
#include <tuple>
#include <random>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "channel.h"
#include "client_impl.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/socket_path.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/common/version.h"
#include "hsdp/common/unix_socket.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/layout.h"
#include "hsdp/shm/op_rules.h"
#include "hsdp/v1/node.grpc.pb.h"

namespace hsdp {

using internal::FromGrpc;
using internal::LocalBuffer;
using internal::SetDeadline;

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  if (impl->options.job_id.empty()) {
    ASSIGN_OR_RETURN(impl->options.job_id, DefaultJobId(options.world_size));
  }
  impl->socket_path = options.socket_path.empty() ? ClientDefaultSocketPath() : options.socket_path;
  const std::string& path = impl->socket_path;

  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  impl->grpc_channel = grpc::CreateCustomChannel("unix:" + path,
                                                 grpc::InsecureChannelCredentials(), args);
  if (!impl->grpc_channel->WaitForConnected(
          absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat("cannot reach hsdpd at ", path,
                                               " (is it running? start it with `hsdpd` or set "
                                               "HSDPD_SOCKET)"));
  }
  impl->stub = v1::Node::NewStub(impl->grpc_channel);
  impl->device_stub = v1::DeviceMemory::NewStub(impl->grpc_channel);
  absl::StatusOr<Impl::NewSession> session = impl->AttachAndMap();
  if (!session.ok() && absl::IsUnavailable(session.status())) {
    // gRPC shares connections between channels to one address: one this
    // process made to an earlier daemon on this socket fails the first call
    // ("Broken pipe") and is then replaced. Once more, shortly after.
    absl::SleepFor(absl::Milliseconds(100));
    session = impl->AttachAndMap();
  }
  if (!session.ok()) return session.status();
  impl->Publish(*std::move(session));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

void Client::Impl::Publish(NewSession s) {
  absl::MutexLock l(&mu);
  daemon_uid = s.daemon_uid;
  features = s.features;
  session_id = s.id;
  channel = std::move(s.channel);
}

absl::StatusOr<Client::Impl::NewSession> Client::Impl::AttachAndMap() {
  const bool first = session_id.load() == 0 && ReconnectCount() == 0;
  if (!first) {
    // Reconnecting: the job's identity (job id, rank, pid) goes only to a
    // daemon of the uid this client first attached to. The data connection
    // below checks again (the socket could change in between).
    uint32_t expected = 0;
    {
      absl::MutexLock l(&mu);
      expected = daemon_uid;
    }
    ASSIGN_OR_RETURN(UniqueFd probe, ConnectUnix(socket_path));
    ASSIGN_OR_RETURN(const PeerCred serving, GetPeerCred(probe.get()));
    if (serving.uid != expected) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the process now serving ", socket_path, " runs as uid ", serving.uid,
          ", hsdpd ran as uid ", expected, ": not telling it this job's identity"));
    }
  }
  v1::AttachRequest req;
  req.set_job_id(options.job_id);
  if (options.owner_uid.has_value()) req.set_owner_uid(*options.owner_uid);
  req.set_priority_class(options.priority_class);
  req.set_rank(options.rank);
  req.set_world_size(options.world_size);
  req.set_local_rank(options.local_rank);
  req.set_device(options.device);
  req.set_pid(::getpid());
  req.set_protocol_version(shm::kLayoutVersion);
  // Device memory is offered too: the daemon agrees only when it runs a
  // device engine (Client::device_memory()).
  req.set_features(shm::kFeaturesImplemented |
                   (options.offer_device_memory ? uint64_t{shm::kFeatureDeviceMemory} : 0));
  v1::AttachResponse resp;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    RETURN_IF_ERROR(FromGrpc(stub->Attach(&ctx, req, &resp), "Attach"));
  }
  if ((resp.features() & ~(shm::kFeaturesImplemented | shm::kFeatureDeviceMemory)) != 0 ||
      (resp.features() & shm::kFeaturesRequired) != shm::kFeaturesRequired) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hsdpd ", resp.daemon_version(), " negotiated features 0x", absl::Hex(resp.features()),
        " that this client (", kHsdpVersion, ") cannot use"));
  }
  if (!first && resp.features() != features) {
    // The caller's groups and buffers were set up for the first set.
    return absl::FailedPreconditionError(absl::StrCat(
        "the restarted hsdpd ", resp.daemon_version(), " negotiated features 0x",
        absl::Hex(resp.features()), " where the first session had 0x", absl::Hex(features),
        "; connect anew"));
  }

  // Claim the session's shared-memory channel over a data connection.
  ASSIGN_OR_RETURN(UniqueFd conn, ConnectUnix(socket_path));
  ASSIGN_OR_RETURN(const PeerCred peer, GetPeerCred(conn.get()));
  shm::DataHello hello{};
  std::memcpy(hello.magic, shm::kDataHelloMagic, sizeof(hello.magic));
  hello.version = shm::kLayoutVersion;
  hello.session_id = resp.session_id();
  if (resp.session_token().size() != shm::kSessionTokenBytes) {
    return absl::InternalError("hsdpd returned a malformed session token");
  }
  std::memcpy(hello.token, resp.session_token().data(), shm::kSessionTokenBytes);
  RETURN_IF_ERROR(SendWithFds(conn.get(), &hello, sizeof(hello), {}));
  shm::DataHelloReply reply{};
  std::vector<UniqueFd> fds;
  RETURN_IF_ERROR(RecvWithFds(conn.get(), &reply, sizeof(reply), &fds,
                              static_cast<int>(absl::ToInt64Milliseconds(options.connect_timeout))));
  if (reply.code != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply.code),
                        std::string(reply.message, std::min<size_t>(reply.message_len,
                                                                    sizeof(reply.message))));
  }
  if (fds.size() != 2) {
    return absl::InternalError(absl::StrCat("hsdpd sent ", fds.size(), " fds, expected 2"));
  }
  NewSession out;
  ASSIGN_OR_RETURN(out.channel, internal::SessionChannel::Map(
                                    std::move(fds[0]), reply.channel_bytes, std::move(fds[1]),
                                    std::move(conn), resp.session_id(), resp.features()));
  out.id = resp.session_id();
  out.features = resp.features();
  out.daemon_uid = peer.uid;
  return out;
}

absl::StatusOr<std::shared_ptr<internal::GroupArena>> Client::Impl::ReceiveArena(
    const internal::SessionChannel& channel, const v1::NewGroupResponse& resp,
    const std::vector<int>& ranks) {
  if (resp.arena_fd_tag() == 0) return nullptr;
  if (static_cast<int>(ranks.size()) != resp.group_size()) {
    return absl::InternalError(absl::StrCat("hsdpd answered a group of ", resp.group_size(),
                                            " for ", ranks.size(), " ranks"));
  }
  const uint64_t tag = resp.arena_fd_tag();
  UniqueFd fd;
  {
    absl::MutexLock l(&inbox_mu);
    // Sent before the reply, so it is here already (or another thread's
    // NewGroup read it first and left it in the inbox).
    while (arena_inbox.count(tag) == 0) {
      shm::ArenaMessage msg{};
      std::vector<UniqueFd> fds;
      RETURN_IF_ERROR(RecvWithFds(channel.data_fd(), &msg, sizeof(msg), &fds, 10000));
      if (msg.magic != shm::kArenaMessageMagic || fds.size() != 1 || msg.fd_tag == 0 ||
          arena_inbox.size() >= 1024) {
        return absl::InternalError(absl::StrCat("hsdpd sent a malformed arena message (",
                                                fds.size(), " fds)"));
      }
      arena_inbox[msg.fd_tag] = std::move(fds[0]);
    }
    auto it = arena_inbox.find(tag);
    fd = std::move(it->second);
    arena_inbox.erase(it);
  }
  return internal::GroupArena::Map(std::move(fd), resp.arena_bytes(), ranks, resp.group_rank(), absl::Milliseconds(resp.arena_timeout_ms()),
                                   channel.spin_ns(), channel.SpinMode(),
                                   [weak = std::weak_ptr<const internal::SessionChannel>(
                                        channel.shared_from_this())] {
                                     auto ch = std::const_pointer_cast<internal::SessionChannel>(
                                         weak.lock());
                                     if (ch == nullptr) return absl::UnavailableError("session over");
                                     absl::Status h = ch->Health();
                                     return absl::IsUnavailable(h) ? h : absl::OkStatus();
                                   });
}

absl::StatusOr<uint64_t> Client::Impl::RegisterFd(uint64_t session, int data_fd, int fd,
                                                  size_t bytes, const std::string& name) {
  uint64_t tag;
  {
    absl::MutexLock l(&mu);
    tag = next_fd_tag++;
  }
  shm::FdMessage msg{shm::kFdMessageMagic, 0, tag};
  RETURN_IF_ERROR(SendWithFds(data_fd, &msg, sizeof(msg), {fd}));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::RegisterBufferRequest req;
  req.set_session_id(session);
  req.set_fd_tag(tag);
  req.set_size_bytes(bytes);
  req.set_name(name);
  v1::RegisterBufferResponse resp;
  RETURN_IF_ERROR(FromGrpc(stub->RegisterBuffer(&ctx, req, &resp), "RegisterBuffer"));
  return resp.buffer_id();
}

bool Client::Impl::DaemonGone() {
  auto ch = Channel();
  return ch != nullptr && absl::IsUnavailable(ch->Health());
}

absl::Status Client::Impl::EnsureConnected() {
  if (!options.reconnect) return absl::OkStatus();
  const uint64_t seen = ReconnectCount();
  if (!DaemonGone()) return absl::OkStatus();
  return Reconnect(seen);
}

absl::Status Client::Impl::Reconnect(uint64_t seen) {
  absl::MutexLock serial(&reconnect_mu);
  if (ReconnectCount() != seen) return absl::OkStatus();  // another thread did it
  {
    absl::MutexLock l(&mu);
    if (detached) return absl::FailedPreconditionError("the client detached");
    if (!device_buffers.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "hsdpd went away, and this client has ", device_buffers.size(),
          " registered device buffers, which are not re-registered by themselves: connect anew"));
    }
  }
  // Wait for a daemon on the same socket (a drained one refuses attaching
  // with UNAVAILABLE until its successor runs).
  // Nothing is published before the buffers and groups exist in the new
  // session: other threads' ops meanwhile fail on the old channel and wait
  // for this reconnect (reconnect_mu), never reach a half-made session.
  const absl::Time deadline = absl::Now() + options.reconnect_timeout;
  absl::StatusOr<NewSession> attached;
  for (;;) {
    attached = AttachAndMap();
    // A daemon shutting down cancels the calls it is serving (CANCELLED):
    // as transient as one that is not there yet.
    const bool transient =
        absl::IsUnavailable(attached.status()) || absl::IsCancelled(attached.status());
    if (attached.ok() || !transient || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!attached.ok()) {
    return absl::Status(attached.status().code(),
                        absl::StrCat("hsdpd went away and did not take this client back within ",
                                     absl::FormatDuration(options.reconnect_timeout), ": ",
                                     attached.status().message()));
  }
  const uint64_t new_session = attached->id;
  {
    absl::MutexLock l(&mu);
    if (attached->daemon_uid != daemon_uid) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the process now serving ", socket_path, " runs as uid ", attached->daemon_uid,
          ", hsdpd ran as uid ", daemon_uid, ": not handing it this client's buffers"));
    }
  }
  // Buffers, in the order they were registered; then groups in creation
  // order, so each gets the global key it had.
  std::vector<std::tuple<uint64_t, int, size_t, std::string>> bufs;
  std::vector<std::pair<uint32_t, std::vector<int>>> grps;
  {
    absl::MutexLock l(&mu);
    for (const auto& [id, b] : buffers) bufs.emplace_back(b.daemon_id, b.fd.get(), b.size, b.name);
    for (const auto& [id, g] : groups) grps.emplace_back(g.daemon_id, g.ranks);
  }
  std::sort(bufs.begin(), bufs.end());
  std::sort(grps.begin(), grps.end());
  std::map<uint64_t, uint64_t> new_buffer_ids;
  for (const auto& [old_id, fd, size, name] : bufs) {
    absl::StatusOr<uint64_t> id =
        RegisterFd(new_session, attached->channel->data_fd(), fd, size, name);
    if (!id.ok()) {
      return absl::Status(id.status().code(),
                          absl::StrCat("re-registering a buffer after a reconnect: ",
                                       id.status().message()));
    }
    new_buffer_ids[old_id] = *id;
  }
  // Operations in the old daemon's arenas fail like those in its rings.
  CloseArenas(absl::UnavailableError("hsdpd went away; the client reconnected (retry)"));
  std::map<uint32_t, std::pair<uint32_t, uint32_t>> new_groups;  // old daemon id -> (id, epoch)
  std::map<uint32_t, std::shared_ptr<internal::GroupArena>> new_arenas;
  for (const auto& [old_id, ranks] : grps) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::NewGroupRequest req;
    req.set_session_id(new_session);
    for (int r : ranks) req.add_ranks(r);
    v1::NewGroupResponse resp;
    absl::Status s = FromGrpc(stub->NewGroup(&ctx, req, &resp), "NewGroup");
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("re-creating a group after a reconnect: ",
                                                 s.message()));
    }
    new_groups[old_id] = {resp.group_id(), resp.epoch()};
    absl::StatusOr<std::shared_ptr<internal::GroupArena>> arena =
        ReceiveArena(*attached->channel, resp, ranks);
    if (!arena.ok()) {
      return absl::Status(arena.status().code(),
                          absl::StrCat("re-creating a group after a reconnect: ",
                                       arena.status().message()));
    }
    new_arenas[old_id] = *std::move(arena);
  }
  absl::MutexLock l(&mu);
  features = attached->features;
  session_id = new_session;
  channel = std::move(attached->channel);
  // (A buffer or group another thread made meanwhile went to the old
  // session and failed there; it is not in the maps and stays as it is.)
  for (auto& [id, b] : buffers) {
    if (auto it = new_buffer_ids.find(b.daemon_id); it != new_buffer_ids.end()) {
      b.daemon_id = it->second;
    }
  }
  for (auto& [id, g] : groups) {
    if (auto it = new_groups.find(g.daemon_id); it != new_groups.end()) {
      g.daemon_id = it->second.first;
      g.daemon_epoch = it->second.second;  // the caller's Group keeps its epoch
      g.arena = new_arenas[it->first];
      g.arena_epoch = it->second.second;
      g.last_daemon_op = Work();
    }
  }
  ++reconnects;
  return absl::OkStatus();
}

absl::Status Client::Impl::TranslateGroup(const Group& g, uint32_t* id, uint32_t* epoch) {
  absl::MutexLock l(&mu);
  auto it = groups.find(g.id);
  if (it == groups.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group: id ", g.id, " was not created by this client's NewGroup"));
  }
  *id = it->second.daemon_id;
  // The caller's current epoch maps to the daemon's; an older one stays
  // older, so the daemon refuses it as over.
  *epoch = g.epoch == it->second.client_epoch
               ? it->second.daemon_epoch
               : it->second.daemon_epoch - std::min(it->second.daemon_epoch,
                                                    it->second.client_epoch - g.epoch);
  return absl::OkStatus();
}

uint64_t Client::Impl::TranslateBuffer(uint64_t id) {
  if (shm::IsDeviceBufferId(id)) return id;
  absl::MutexLock l(&mu);
  auto it = buffers.find(id);
  return it == buffers.end() ? id : it->second.daemon_id;  // unknown ones fail in CheckRange
}

uint64_t Client::reconnects() const { return impl_->ReconnectCount(); }
absl::Status Client::Reconnect() {
  const uint64_t seen = impl_->ReconnectCount();
  if (!impl_->DaemonGone()) return absl::OkStatus();  // the session is fine
  return impl_->Reconnect(seen);
}

absl::StatusOr<Buffer> Client::AllocateBuffer(size_t bytes, const std::string& name) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocateBuffer: size must be > 0");
  Impl& im = *impl_;
  RETURN_IF_ERROR(im.EnsureConnected());
  // Ask the daemon first, so an impossible request fails before we reserve memory.
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    v1::RegisterBufferRequest req;
    req.set_session_id(im.session_id);
    req.set_fd_tag(0);  // 0 = check the limits only
    req.set_size_bytes(bytes);
    v1::RegisterBufferResponse resp;
    RETURN_IF_ERROR(FromGrpc(im.stub->RegisterBuffer(&ctx, req, &resp), "RegisterBuffer"));
  }
  const std::string memfd_name = "hsdp:" + (name.empty() ? std::string("buffer") : name);
  UniqueFd fd(::memfd_create(memfd_name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return ErrnoStatus(errno, "memfd_create", __FILE__, __LINE__);
  SYSCALL_OR_RETURN(::ftruncate(fd.get(), static_cast<off_t>(bytes)));
  // Reserve the pages now: running out later would be a SIGBUS, not a status.
  if (int rc = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); rc != 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot reserve ", bytes, " bytes of shared memory for a buffer: ", std::strerror(rc)));
  }
  SYSCALL_OR_RETURN(::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
  void* data = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (data == MAP_FAILED) return ErrnoStatus(errno, "mmap(buffer)", __FILE__, __LINE__);
  absl::StatusOr<uint64_t> daemon_id =
      im.RegisterFd(im.session_id, im.Channel()->data_fd(), fd.get(), bytes, name);
  if (!daemon_id.ok()) {
    ::munmap(data, bytes);
    return daemon_id.status();
  }
  absl::MutexLock l(&im.mu);
  // The caller's id is the daemon's, unless a reconnect gave that number
  // to another buffer of this client already.
  uint64_t id = *daemon_id;
  if (im.buffers.count(id) > 0) id = im.buffers.rbegin()->first + 1;
  im.buffers[id] = LocalBuffer{std::move(fd), data, bytes, *daemon_id, name};
  return Buffer{id, data, bytes};
}

absl::Status Client::FreeBuffer(uint64_t buffer_id) {
  Impl& im = *impl_;
  im.DrainArenas();  // an arena operation writes its output when it completes
  LocalBuffer local;
  {
    absl::MutexLock l(&im.mu);
    auto it = im.buffers.find(buffer_id);
    if (it == im.buffers.end()) {
      return absl::NotFoundError(absl::StrCat("FreeBuffer: unknown buffer id ", buffer_id));
    }
    local = std::move(it->second);
    im.buffers.erase(it);
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::FreeBufferRequest req;
  req.set_session_id(im.session_id);
  req.set_buffer_id(local.daemon_id);
  v1::FreeBufferResponse resp;
  absl::Status s = FromGrpc(im.stub->FreeBuffer(&ctx, req, &resp), "FreeBuffer");
  ::munmap(local.data, local.size);
  return s;
}

absl::StatusOr<Buffer> Client::GetBuffer(uint64_t buffer_id) const {
  absl::MutexLock l(&impl_->mu);
  auto it = impl_->buffers.find(buffer_id);
  if (it == impl_->buffers.end()) {
    return absl::NotFoundError(absl::StrCat("unknown buffer id ", buffer_id));
  }
  return Buffer{buffer_id, it->second.data, it->second.size};
}

absl::StatusOr<Group> Client::NewGroup(const std::vector<int>& ranks) {
  Impl& im = *impl_;
  RETURN_IF_ERROR(im.EnsureConnected());
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::NewGroupRequest req;
  req.set_session_id(im.session_id);
  for (int r : ranks) req.add_ranks(r);
  v1::NewGroupResponse resp;
  RETURN_IF_ERROR(FromGrpc(im.stub->NewGroup(&ctx, req, &resp), "NewGroup"));
  ASSIGN_OR_RETURN(std::shared_ptr<internal::GroupArena> arena,
                   im.ReceiveArena(*im.Channel(), resp, ranks));
  absl::MutexLock l(&im.mu);
  // The caller's id is the daemon's, unless a reconnect gave that number to
  // another group of this client already.
  uint32_t id = resp.group_id();
  if (im.groups.count(id) > 0) id = im.groups.rbegin()->first + 1;
  im.groups[id] = internal::GroupRecord{ranks,        resp.group_id(), resp.epoch(),
                                        resp.epoch(), std::move(arena), resp.epoch(),
                                        {}};
  return Group{id, resp.group_rank(), resp.group_size(), ranks, resp.epoch()};
}

absl::StatusOr<Group> Client::RejoinGroup(const Group& group) {
  Impl& im = *impl_;
  RETURN_IF_ERROR(im.EnsureConnected());
  uint32_t daemon_id, daemon_epoch;
  RETURN_IF_ERROR(im.TranslateGroup(group, &daemon_id, &daemon_epoch));
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::NewGroupRequest req;
  req.set_session_id(im.session_id);
  req.set_rejoin_group_id(daemon_id);
  for (int r : group.ranks) req.add_ranks(r);
  v1::NewGroupResponse resp;
  RETURN_IF_ERROR(FromGrpc(im.stub->NewGroup(&ctx, req, &resp), "NewGroup(rejoin)"));
  ASSIGN_OR_RETURN(std::shared_ptr<internal::GroupArena> arena,
                   im.ReceiveArena(*im.Channel(), resp, group.ranks));
  std::shared_ptr<internal::GroupArena> old_arena;
  absl::MutexLock l(&im.mu);
  internal::GroupRecord& g = im.groups.at(group.id);
  // The old epoch's arena is over; the new epoch has its own or none.
  if (g.arena != nullptr && g.arena != arena) old_arena = std::move(g.arena);
  g.arena = std::move(arena);
  g.arena_epoch = resp.epoch();
  if (old_arena != nullptr) {
    old_arena->Close(absl::AbortedError("the group was rejoined in a new epoch"));
  }
  // The caller's epochs keep counting from its own; the daemon's from its.
  const uint32_t client_epoch = g.client_epoch + (resp.epoch() - g.daemon_epoch);
  g.daemon_epoch = resp.epoch();
  g.client_epoch = client_epoch;
  return Group{group.id, resp.group_rank(), resp.group_size(), group.ranks, client_epoch};
}

absl::StatusOr<Work> Client::AllReduce(const Group& g, BufferRef send, BufferRef recv,
                                       size_t count, DataType dtype, const ReduceOptions& r,
                                       const SubmitOptions& o) {
  return impl_->Submit(Collective::kAllReduce, g, nullptr, send, recv, count, dtype, r, 0, {}, o);
}
absl::StatusOr<Work> Client::AllGather(const Group& g, BufferRef send, BufferRef recv,
                                       size_t count, DataType dtype, const SubmitOptions& o) {
  return impl_->Submit(Collective::kAllGather, g, nullptr, send, recv, count, dtype, {}, 0, {},
                       o);
}
absl::StatusOr<Work> Client::ReduceScatter(const Group& g, BufferRef send, BufferRef recv,
                                           size_t count, DataType dtype,
                                           const ReduceOptions& r, const SubmitOptions& o) {
  return impl_->Submit(Collective::kReduceScatter, g, nullptr, send, recv, count, dtype, r, 0,
                       {}, o);
}
absl::StatusOr<Work> Client::Broadcast(const Group& g, BufferRef send, BufferRef recv,
                                       size_t count, DataType dtype, int root,
                                       const SubmitOptions& o) {
  if (root < 0 || root >= g.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("root: ", root, " is not a rank of a group of size ", g.size));
  }
  return impl_->Submit(Collective::kBroadcast, g, nullptr, send, recv, count, dtype, {}, root, {},
                       o);
}
absl::StatusOr<Work> Client::Barrier(const Group& g) {
  return impl_->Submit(Collective::kBarrier, g, nullptr, {}, {}, 0, DataType::kInvalid, {}, 0);
}
absl::StatusOr<Work> Client::ReduceScatterAllReduce(const Group& shard, const Group& replicate,
                                                    BufferRef send, BufferRef recv,
                                                    size_t count, DataType dtype,
                                                    const ReduceOptions& r,
                                                    const SubmitOptions& o) {
  return impl_->Submit(Collective::kReduceScatterAllReduce, shard, &replicate, send, recv, count,
                       dtype, r, 0, {}, o);
}

absl::StatusOr<Work> Client::Send(const Group& g, BufferRef send, size_t count, DataType dtype,
                                  int dst, int tag) {
  return impl_->Submit(Collective::kSend, g, nullptr, send, {}, count, dtype, {}, 0,
                       {dst, tag, {}});
}
absl::StatusOr<Work> Client::Recv(const Group& g, BufferRef recv, size_t count, DataType dtype,
                                  int src, int tag) {
  return impl_->Submit(Collective::kRecv, g, nullptr, {}, recv, count, dtype, {}, 0,
                       {src, tag, {}});
}
absl::StatusOr<Work> Client::AllToAll(const Group& g, BufferRef send, BufferRef recv,
                                      size_t count, DataType dtype) {
  return impl_->Submit(Collective::kAllToAll, g, nullptr, send, recv, count, dtype, {}, 0);
}
absl::StatusOr<Work> Client::AllToAllV(const Group& g, BufferRef send, BufferRef recv,
                                       BufferRef splits, DataType dtype) {
  if (splits.buffer_id == 0) {
    return absl::InvalidArgumentError("splits: name a registered buffer holding the counts");
  }
  return impl_->Submit(Collective::kAllToAll, g, nullptr, send, recv, 0, dtype, {}, 0,
                       {0, 0, splits});
}

absl::Status Client::Detach() { return impl_->Detach(); }
uint64_t Client::session_id() const { return impl_->session_id; }
const ClientOptions& Client::options() const { return impl_->options; }
const std::string& Client::socket_path() const { return impl_->socket_path; }

}  // namespace hsdp
