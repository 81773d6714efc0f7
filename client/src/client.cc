#include "hsdp/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <random>

#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "channel.h"
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
namespace {

constexpr absl::Duration kRpcTimeout = absl::Seconds(30);

absl::Status FromGrpc(const grpc::Status& s, const char* what) {
  if (s.ok()) return absl::OkStatus();
  auto code = static_cast<absl::StatusCode>(s.error_code());
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE) {
    return absl::UnavailableError(absl::StrCat(what, ": hsdpd unavailable: ", s.error_message()));
  }
  return absl::Status(code, s.error_message());
}

void SetDeadline(grpc::ClientContext* ctx) {
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
};

}  // namespace

class Client::Impl {
 public:
  ClientOptions options;
  std::string socket_path;
  std::shared_ptr<grpc::Channel> grpc_channel;
  std::unique_ptr<v1::Node::Stub> stub;
  uint64_t session_id = 0;
  uint64_t features = 0;  // negotiated at Attach
  std::shared_ptr<internal::SessionChannel> channel;

  absl::Mutex mu;
  std::map<uint64_t, LocalBuffer> buffers ABSL_GUARDED_BY(mu);
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
    absl::Status rpc = absl::OkStatus();
    if (stub != nullptr && session_id != 0) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      v1::DetachRequest req;
      req.set_session_id(session_id);
      v1::DetachResponse resp;
      rpc = FromGrpc(stub->Detach(&ctx, req, &resp), "Detach");
    }
    if (channel != nullptr) channel->Close(absl::CancelledError("the client detached"));
    return rpc;
  }

  // Checks that [ref.offset, ref.offset + bytes) lies in a buffer of this client.
  absl::Status CheckRange(const char* field, BufferRef ref, uint64_t bytes) {
    if (bytes == 0) return absl::OkStatus();  // nothing is read or written
    absl::MutexLock l(&mu);
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

  absl::StatusOr<Work> Submit(Collective kind, const Group& g, const Group* g2, BufferRef send,
                              BufferRef recv, size_t count, DataType dtype,
                              const ReduceOptions& reduce, int root, Peering peering = {}) {
    if (g.size <= 0 || (g2 != nullptr && g2->size <= 0)) {
      return absl::InvalidArgumentError("group: not created by NewGroup");
    }
    shm::OpDescriptor d{};
    d.collective = static_cast<uint8_t>(kind);
    d.group_id = g.id;
    d.epoch = g.epoch;
    if (g2 != nullptr) {
      d.group2_id = g2->id;
      d.epoch2 = g2->epoch;
    }
    d.root = root;
    d.peer = peering.peer;
    d.tag = peering.tag;
    d.splits = {peering.splits.buffer_id, peering.splits.offset_bytes};
    d.premul_factor = d.pre_divide = d.post_divide = 1.0;
    if (kind != Collective::kBarrier) {
      d.count = count;
      d.dtype = static_cast<uint8_t>(dtype);
      d.send = {send.buffer_id, send.offset_bytes};
      d.recv = {recv.buffer_id, recv.offset_bytes};
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
    return channel->Submit(d, g2 != nullptr);
  }
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
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

  v1::AttachRequest req;
  req.set_job_id(options.job_id);
  req.set_rank(options.rank);
  req.set_world_size(options.world_size);
  req.set_local_rank(options.local_rank);
  req.set_device(options.device);
  req.set_pid(::getpid());
  req.set_protocol_version(shm::kLayoutVersion);
  req.set_features(shm::kFeaturesImplemented);
  v1::AttachResponse resp;
  {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    RETURN_IF_ERROR(FromGrpc(impl->stub->Attach(&ctx, req, &resp), "Attach"));
  }
  impl->session_id = resp.session_id();
  impl->features = resp.features();
  if ((impl->features & ~shm::kFeaturesImplemented) != 0 ||
      (impl->features & shm::kFeaturesRequired) != shm::kFeaturesRequired) {
    return absl::FailedPreconditionError(absl::StrCat(
        "hsdpd ", resp.daemon_version(), " negotiated features 0x", absl::Hex(impl->features),
        " that this client (", kHsdpVersion, ") cannot use"));
  }

  // Claim the session's shared-memory channel over a data connection.
  ASSIGN_OR_RETURN(UniqueFd conn, ConnectUnix(path));
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
  ASSIGN_OR_RETURN(impl->channel,
                   internal::SessionChannel::Map(std::move(fds[0]), reply.channel_bytes,
                                                 std::move(fds[1]), std::move(conn),
                                                 resp.session_id(), impl->features));
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::StatusOr<Buffer> Client::AllocateBuffer(size_t bytes, const std::string& name) {
  if (bytes == 0) return absl::InvalidArgumentError("AllocateBuffer: size must be > 0");
  Impl& im = *impl_;
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

  uint64_t tag;
  {
    absl::MutexLock l(&im.mu);
    tag = im.next_fd_tag++;
  }
  shm::FdMessage msg{shm::kFdMessageMagic, 0, tag};
  absl::Status sent = SendWithFds(im.channel->data_fd(), &msg, sizeof(msg), {fd.get()});
  if (!sent.ok()) {
    ::munmap(data, bytes);
    return sent;
  }
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::RegisterBufferRequest req;
  req.set_session_id(im.session_id);
  req.set_fd_tag(tag);
  req.set_size_bytes(bytes);
  req.set_name(name);
  v1::RegisterBufferResponse resp;
  absl::Status reg = FromGrpc(im.stub->RegisterBuffer(&ctx, req, &resp), "RegisterBuffer");
  if (!reg.ok()) {
    ::munmap(data, bytes);
    return reg;
  }
  absl::MutexLock l(&im.mu);
  im.buffers[resp.buffer_id()] = LocalBuffer{std::move(fd), data, bytes};
  return Buffer{resp.buffer_id(), data, bytes};
}

absl::Status Client::FreeBuffer(uint64_t buffer_id) {
  Impl& im = *impl_;
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
  req.set_buffer_id(buffer_id);
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
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::NewGroupRequest req;
  req.set_session_id(impl_->session_id);
  for (int r : ranks) req.add_ranks(r);
  v1::NewGroupResponse resp;
  RETURN_IF_ERROR(FromGrpc(impl_->stub->NewGroup(&ctx, req, &resp), "NewGroup"));
  return Group{resp.group_id(), resp.group_rank(), resp.group_size(), ranks, resp.epoch()};
}

absl::StatusOr<Group> Client::RejoinGroup(const Group& group) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::NewGroupRequest req;
  req.set_session_id(impl_->session_id);
  req.set_rejoin_group_id(group.id);
  for (int r : group.ranks) req.add_ranks(r);
  v1::NewGroupResponse resp;
  RETURN_IF_ERROR(FromGrpc(impl_->stub->NewGroup(&ctx, req, &resp), "NewGroup(rejoin)"));
  return Group{resp.group_id(), resp.group_rank(), resp.group_size(), group.ranks, resp.epoch()};
}

absl::StatusOr<Work> Client::AllReduce(const Group& g, BufferRef send, BufferRef recv,
                                       size_t count, DataType dtype, const ReduceOptions& r) {
  return impl_->Submit(Collective::kAllReduce, g, nullptr, send, recv, count, dtype, r, 0);
}
absl::StatusOr<Work> Client::AllGather(const Group& g, BufferRef send, BufferRef recv,
                                       size_t count, DataType dtype) {
  return impl_->Submit(Collective::kAllGather, g, nullptr, send, recv, count, dtype, {}, 0);
}
absl::StatusOr<Work> Client::ReduceScatter(const Group& g, BufferRef send, BufferRef recv,
                                           size_t count, DataType dtype,
                                           const ReduceOptions& r) {
  return impl_->Submit(Collective::kReduceScatter, g, nullptr, send, recv, count, dtype, r, 0);
}
absl::StatusOr<Work> Client::Broadcast(const Group& g, BufferRef send, BufferRef recv,
                                       size_t count, DataType dtype, int root) {
  if (root < 0 || root >= g.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("root: ", root, " is not a rank of a group of size ", g.size));
  }
  return impl_->Submit(Collective::kBroadcast, g, nullptr, send, recv, count, dtype, {}, root);
}
absl::StatusOr<Work> Client::Barrier(const Group& g) {
  return impl_->Submit(Collective::kBarrier, g, nullptr, {}, {}, 0, DataType::kInvalid, {}, 0);
}
absl::StatusOr<Work> Client::ReduceScatterAllReduce(const Group& shard, const Group& replicate,
                                                    BufferRef send, BufferRef recv,
                                                    size_t count, DataType dtype,
                                                    const ReduceOptions& r) {
  return impl_->Submit(Collective::kReduceScatterAllReduce, shard, &replicate, send, recv, count,
                       dtype, r, 0);
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
