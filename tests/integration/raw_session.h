// A minimal raw client for tests that must write the shared-memory ring
// themselves: Attach RPC, data-connection hello (shm::DataHello), the
// channel and node page mapped from the fds the daemon sends back, buffers
// registered by passing a sealed memfd. No validation on our side: the
// daemon must cope with whatever is written here.
#ifndef HSDP_TESTS_INTEGRATION_RAW_SESSION_H_
#define HSDP_TESTS_INTEGRATION_RAW_SESSION_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/wait.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/unix_socket.h"
#include "hsdp/shm/data_conn.h"
#include "hsdp/shm/doorbell.h"
#include "hsdp/shm/layout.h"
#include "hsdp/v1/node.grpc.pb.h"

namespace hsdp::testing {

// The Attach request a current client sends (layout version and features
// of this build), for tests that speak the raw protocol.
inline v1::AttachRequest RawAttachRequest(const std::string& job, int rank, int world,
                                          uint64_t features = shm::kFeaturesImplemented) {
  v1::AttachRequest req;
  req.set_job_id(job);
  req.set_rank(rank);
  req.set_world_size(world);
  req.set_device("cpu");
  req.set_pid(::getpid());
  req.set_protocol_version(shm::kLayoutVersion);
  req.set_features(features);
  return req;
}

class RawSession {
 public:
  ~RawSession() {
    if (channel_ != nullptr) ::munmap(channel_, channel_bytes_);
    for (auto& [p, n] : maps_) ::munmap(p, n);
  }

  // `features`: what the Attach offers (device-memory tests add
  // shm::kFeatureDeviceMemory).
  absl::Status Open(const std::string& socket, const std::string& job, int rank, int world,
                    uint64_t features = shm::kFeaturesImplemented) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    stub_ = v1::Node::NewStub(
        grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), args));
    const v1::AttachRequest req = RawAttachRequest(job, rank, world, features);
    v1::AttachResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ctx.set_wait_for_ready(true);
    grpc::Status s = stub_->Attach(&ctx, req, &resp);
    if (!s.ok()) return absl::UnknownError("Attach: " + s.error_message());
    session_id_ = resp.session_id();
    features_ = resp.features();
    auto conn = ConnectUnix(socket);
    if (!conn.ok()) return conn.status();
    conn_ = std::move(*conn);
    shm::DataHello hello{};
    std::memcpy(hello.magic, shm::kDataHelloMagic, 8);
    hello.version = shm::kLayoutVersion;
    hello.session_id = session_id_;
    std::memcpy(hello.token, resp.session_token().data(), shm::kSessionTokenBytes);
    if (absl::Status st = SendWithFds(conn_.get(), &hello, sizeof(hello), {}); !st.ok()) return st;
    shm::DataHelloReply reply{};
    std::vector<UniqueFd> fds;
    if (absl::Status st = RecvWithFds(conn_.get(), &reply, sizeof(reply), &fds, 10000); !st.ok()) {
      return st;
    }
    if (reply.code != 0 || fds.size() != 2) {
      return absl::UnknownError("hello refused: " + std::string(reply.message, reply.message_len));
    }
    channel_bytes_ = reply.channel_bytes;
    channel_ = ::mmap(nullptr, channel_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
    if (channel_ == MAP_FAILED) return absl::InternalError("mmap");
    channel_fd_ = std::move(fds[0]);
    wake_ = std::move(fds[1]);
    entries_ = header()->ring_entries;
    ring_offset_ = header()->ring_offset;
    completion_offset_ = header()->completion_offset;
    return absl::OkStatus();
  }

  absl::StatusOr<uint32_t> NewGroup(const std::vector<int>& ranks) {
    absl::StatusOr<v1::NewGroupResponse> resp = NewGroupReply(ranks);
    if (!resp.ok()) return resp.status();
    return resp->group_id();
  }
  // The whole reply (arena_fd_tag, arena_bytes: whether the group has an arena).
  absl::StatusOr<v1::NewGroupResponse> NewGroupReply(const std::vector<int>& ranks) {
    v1::NewGroupRequest req;
    req.set_session_id(session_id_);
    for (int r : ranks) req.add_ranks(r);
    v1::NewGroupResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->NewGroup(&ctx, req, &resp);
    if (!s.ok()) return absl::UnknownError("NewGroup: " + s.error_message());
    return resp;
  }

  // Returns the buffer id; *data points at our mapping.
  absl::StatusOr<uint64_t> RegisterBuffer(uint64_t bytes, char** data) {
    UniqueFd fd(::memfd_create("raw", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) return absl::InternalError("ftruncate");
    ::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (m == MAP_FAILED) return absl::InternalError("mmap");
    maps_.emplace_back(m, bytes);
    *data = static_cast<char*>(m);
    const uint64_t tag = next_tag_++;
    shm::FdMessage msg{shm::kFdMessageMagic, 0, tag};
    if (absl::Status st = SendWithFds(conn_.get(), &msg, sizeof(msg), {fd.get()}); !st.ok()) return st;
    v1::RegisterBufferRequest req;
    req.set_session_id(session_id_);
    req.set_fd_tag(tag);
    req.set_size_bytes(bytes);
    v1::RegisterBufferResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->RegisterBuffer(&ctx, req, &resp);
    if (!s.ok()) return absl::UnknownError("RegisterBuffer: " + s.error_message());
    return resp.buffer_id();
  }

  absl::Status Detach() {
    v1::DetachRequest req;
    req.set_session_id(session_id_);
    v1::DetachResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Detach(&ctx, req, &resp);
    return s.ok() ? absl::OkStatus() : absl::UnknownError(s.error_message());
  }

  // Writes `d` at the head of the ring and rings the daemon.
  void Push(const shm::OpDescriptor& d) {
    shm::ChannelHeader* h = header();
    const uint64_t head = h->head.load(std::memory_order_relaxed);
    Ring()[head & (entries_ - 1)] = d;
    h->head.store(head + 1, std::memory_order_release);
    Bell();
  }
  // Wakes the daemon the way the client library does (only when it sleeps).
  void Bell() {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (header()->daemon_sleeping.load() != 0) {
      const uint64_t one = 1;
      ssize_t ignored = ::write(wake_.get(), &one, sizeof(one));
      (void)ignored;
    }
  }

  // The completion of `op_id`, waiting up to `timeout_ms`.
  std::optional<absl::Status> Completion(uint64_t op_id, int timeout_ms) {
    shm::Completion& c = Completions()[op_id & (entries_ - 1)];
    if (!Eventually([&] { return c.op_id.load(std::memory_order_acquire) == op_id; }, timeout_ms,
                    /*poll_ms=*/1)) {
      return std::nullopt;
    }
    const auto code = static_cast<absl::StatusCode>(c.code);
    if (code == absl::StatusCode::kOk) return absl::OkStatus();
    return absl::Status(code, std::string(c.message, std::min<uint32_t>(c.message_len, sizeof(c.message))));
  }

  shm::ChannelHeader* header() { return static_cast<shm::ChannelHeader*>(channel_); }
  shm::OpDescriptor* Ring() {
    return reinterpret_cast<shm::OpDescriptor*>(static_cast<char*>(channel_) + ring_offset_);
  }
  shm::Completion* Completions() {
    return reinterpret_cast<shm::Completion*>(static_cast<char*>(channel_) + completion_offset_);
  }
  // Ended: closed, or already released by the daemon (zeros).
  bool closed() { return header()->state.load() != shm::kChannelOpen; }
  uint64_t session_id() const { return session_id_; }
  uint64_t features() const { return features_; }
  int data_fd() const { return conn_.get(); }
  uint32_t entries() const { return entries_; }
  int wake_fd() const { return wake_.get(); }
  uint64_t channel_bytes() const { return channel_bytes_; }
  // The channel's memfd as the daemon sent it (a client may keep it).
  int channel_fd() const { return channel_fd_.get(); }

 private:
  std::unique_ptr<v1::Node::Stub> stub_;
  uint64_t session_id_ = 0;
  uint64_t features_ = 0;
  UniqueFd conn_;
  void* channel_ = nullptr;
  uint64_t channel_bytes_ = 0;
  UniqueFd channel_fd_;
  UniqueFd wake_;
  uint32_t entries_ = 0;
  uint64_t ring_offset_ = 0, completion_offset_ = 0;
  uint64_t next_tag_ = 1;
  std::vector<std::pair<void*, size_t>> maps_;
};

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_RAW_SESSION_H_
