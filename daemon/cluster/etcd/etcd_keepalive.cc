#include "daemon/cluster/etcd/etcd_keepalive.h"

#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace hsdp::etcd::internal {
namespace {

class KeepAliveStreamImpl final : public KeepAliveStream {
 public:
  KeepAliveStreamImpl(pb::Lease::Stub* stub, size_t endpoint, std::string token)
      : endpoint_(endpoint), token_(std::move(token)) {
    ctx_.AddMetadata(kHasLeaderKey, "true");
    if (!token_.empty()) ctx_.AddMetadata(kTokenKey, token_);
    stream_ = stub->LeaseKeepAlive(&ctx_);
    reader_ = std::thread([this] { Read(); });
  }

  ~KeepAliveStreamImpl() override {
    ctx_.TryCancel();  // the reader's Read fails at once
    reader_.join();
  }

  grpc::Status Renew(int64_t lease, absl::Time deadline,
                     pb::LeaseKeepAliveResponse* answer) override {
    absl::MutexLock one(&renew_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return Ended();
      answers_.clear();  // none is pending between renewals; drop a stray one
    }
    pb::LeaseKeepAliveRequest req;
    req.set_id(lease);
    // A message of a few bytes: the write only waits for flow control when
    // etcd stopped reading for thousands of renewals, and the first renewal
    // without an answer already ended the stream (below).
    if (!stream_->Write(req)) {
      // The stream is broken; the reader's Finish says why.
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithDeadline(absl::Condition(&ended_), deadline);
      if (ended_) return Ended();
      EndLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the keep-alive stream broke"));
      ctx_.TryCancel();
      return Ended();
    }
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !answers_.empty() || ended_;
    };
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (!answers_.empty()) {
      *answer = std::move(answers_.front());
      answers_.pop_front();
      return grpc::Status::OK;
    }
    if (!ended_) {
      // A member that stopped answering (hung, partitioned): this stream is
      // over; an answer that comes later must not be taken for the next
      // renewal's.
      EndLocked(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                             "no answer to the keep-alive in time"));
      ctx_.TryCancel();
    }
    return Ended();
  }

  bool over() const override {
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  size_t endpoint() const override { return endpoint_; }
  const std::string& token() const override { return token_; }

 private:
  void Read() {
    pb::LeaseKeepAliveResponse resp;
    while (stream_->Read(&resp)) {
      absl::MutexLock lock(&mu_);
      // One answer per request; more than a handful pending means etcd
      // answers what nobody asked: end rather than grow.
      if (answers_.size() >= kMaxPending) {
        EndLocked(grpc::Status(grpc::StatusCode::INTERNAL, "unrequested keep-alive answers"));
        break;
      }
      answers_.push_back(std::move(resp));
    }
    ctx_.TryCancel();
    grpc::Status s = stream_->Finish();
    if (s.ok()) s = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the keep-alive stream ended");
    absl::MutexLock lock(&mu_);
    EndLocked(std::move(s));
  }

  void EndLocked(grpc::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ended_) return;
    ended_ = true;
    status_ = std::move(s);
  }
  grpc::Status Ended() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return status_; }

  static constexpr size_t kMaxPending = 8;

  const size_t endpoint_;
  const std::string token_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<pb::LeaseKeepAliveRequest,
                                           pb::LeaseKeepAliveResponse>>
      stream_;
  std::thread reader_;
  absl::Mutex renew_mu_;  // one renewal at a time
  mutable absl::Mutex mu_;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  std::deque<pb::LeaseKeepAliveResponse> answers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<KeepAliveStream> OpenKeepAlive(pb::Lease::Stub* stub, size_t endpoint,
                                               std::string token) {
  return std::make_unique<KeepAliveStreamImpl>(stub, endpoint, std::move(token));
}

}  // namespace hsdp::etcd::internal
