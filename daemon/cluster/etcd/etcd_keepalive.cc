#include "daemon/cluster/etcd/etcd_keepalive.h"

#include <deque>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace hsdp::etcd::internal {
namespace {

// The stream is a gRPC callback reactor: its reads and writes complete on
// gRPC's own threads, so an open stream holds no thread of ours (a node with
// many leases, or a simulator of thousands of nodes, would otherwise hold a
// reader thread per lease). A read is always pending; answers queue until
// Renew takes them. The reactions take mu_ briefly and never block; gRPC is
// never called with mu_ held (it may run a reaction inline).
//
// Renew starts writes from outside the reactions, so the stream holds a
// hold (gRPC's AddHold): the call cannot finish under a write being
// started. The hold goes once the stream is closing (no write will start)
// and no write is in flight.
class KeepAliveStreamImpl final
    : public KeepAliveStream,
      public grpc::ClientBidiReactor<pb::LeaseKeepAliveRequest, pb::LeaseKeepAliveResponse> {
 public:
  KeepAliveStreamImpl(pb::Lease::Stub* stub, size_t endpoint, std::string token)
      : endpoint_(endpoint), token_(std::move(token)) {
    ctx_.AddMetadata(kHasLeaderKey, "true");
    if (!token_.empty()) ctx_.AddMetadata(kTokenKey, token_);
    stub->async()->LeaseKeepAlive(&ctx_, this);
    AddHold();
    StartRead(&incoming_);
    StartCall();
  }

  ~KeepAliveStreamImpl() override {
    Close(grpc::Status(grpc::StatusCode::CANCELLED, "the keep-alive stream was closed"));
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));  // gRPC is finished with this object
  }

  grpc::Status Renew(int64_t lease, absl::Time deadline,
                     pb::LeaseKeepAliveResponse* answer) override {
    absl::MutexLock one(&renew_mu_);
    bool write = false;
    {
      absl::MutexLock lock(&mu_);
      if (closing_) return AwaitEnd(deadline);
      // A write still in flight (its answer came before its completion)
      // owns outgoing_ until it completes.
      auto writable = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return !writing_ || closing_;
      };
      mu_.AwaitWithDeadline(absl::Condition(&writable), deadline);
      if (closing_) return AwaitEnd(deadline);
      if (!writing_ && absl::Now() < deadline) {
        answers_.clear();  // none is pending between renewals; drop a stray one
        outgoing_.set_id(lease);
        writing_ = write = true;
      }
    }
    if (write) {
      // A message of a few bytes: the write only waits for flow control
      // when etcd stopped reading for thousands of renewals, and the first
      // renewal without an answer already ended the stream (below).
      StartWrite(&outgoing_);
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
      if (ended_) return status_;
    }
    // A member that stopped answering (hung, partitioned): this stream is
    // over; an answer that comes later must not be taken for the next
    // renewal's.
    return Close(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                              "no answer to the keep-alive in time"));
  }

  bool over() const override {
    absl::MutexLock lock(&mu_);
    return closing_;
  }
  size_t endpoint() const override { return endpoint_; }
  const std::string& token() const override { return token_; }

  // gRPC's reactions.
  void OnReadDone(bool ok) override {
    if (!ok) {  // the stream ended: OnDone says why
      Closing();
      return;
    }
    bool more = false;
    {
      absl::MutexLock lock(&mu_);
      // One answer per request; more than a handful pending means etcd
      // answers what nobody asked: end rather than grow.
      if (answers_.size() < kMaxPending) {
        answers_.push_back(std::move(incoming_));
        incoming_.Clear();
        more = !closing_;
      }
    }
    if (more) {
      StartRead(&incoming_);
    } else {
      Close(grpc::Status(grpc::StatusCode::INTERNAL, "unrequested keep-alive answers"));
    }
  }
  void OnWriteDone(bool ok) override {
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) closing_ = true;  // the stream broke; OnDone says why
      release = TakeHoldLocked();
    }
    if (release) RemoveHold();
  }
  void OnDone(const grpc::Status& s) override {
    absl::MutexLock lock(&mu_);
    // The first reason stands (a deadline of ours, unrequested answers);
    // else gRPC's, and a stream etcd closed cleanly is over all the same.
    EndLocked(s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "the keep-alive stream ended")
                     : s);
    closing_ = true;
    done_ = true;
  }

 private:
  // No write starts from now on; the hold goes when none is in flight.
  void Closing() ABSL_LOCKS_EXCLUDED(mu_) {
    bool release = false;
    {
      absl::MutexLock lock(&mu_);
      closing_ = true;
      release = TakeHoldLocked();
    }
    if (release) RemoveHold();
  }
  // Ends the stream for `why` (unless it already ended) and cancels it;
  // returns the status it ended with.
  grpc::Status Close(grpc::Status why) ABSL_LOCKS_EXCLUDED(mu_) {
    grpc::Status ended;
    {
      absl::MutexLock lock(&mu_);
      EndLocked(std::move(why));
      ended = status_;
    }
    ctx_.TryCancel();
    Closing();
    return ended;
  }
  // The stream is closing and its status is on its way (OnDone): waits for
  // it until `deadline`.
  grpc::Status AwaitEnd(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    mu_.AwaitWithDeadline(absl::Condition(&ended_), deadline);
    if (ended_) return status_;
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the keep-alive stream ended");
  }
  bool TakeHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!hold_ || !closing_ || writing_) return false;
    hold_ = false;
    return true;
  }
  void EndLocked(grpc::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ended_) return;
    ended_ = true;
    status_ = std::move(s);
  }

  static constexpr size_t kMaxPending = 8;

  const size_t endpoint_;
  const std::string token_;
  grpc::ClientContext ctx_;
  absl::Mutex renew_mu_;  // one renewal at a time
  mutable absl::Mutex mu_;
  bool closing_ ABSL_GUARDED_BY(mu_) = false;  // no write starts any more
  bool ended_ ABSL_GUARDED_BY(mu_) = false;    // status_ is why
  bool writing_ ABSL_GUARDED_BY(mu_) = false;  // outgoing_ is gRPC's until OnWriteDone
  bool hold_ ABSL_GUARDED_BY(mu_) = true;      // AddHold's, until closing with no write
  bool done_ ABSL_GUARDED_BY(mu_) = false;     // OnDone ran: gRPC holds no reference
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  pb::LeaseKeepAliveRequest outgoing_;   // written by Renew only while no write is in flight
  pb::LeaseKeepAliveResponse incoming_;  // the pending read's: gRPC's until OnReadDone
  std::deque<pb::LeaseKeepAliveResponse> answers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<KeepAliveStream> OpenKeepAlive(pb::Lease::Stub* stub, size_t endpoint,
                                               std::string token) {
  return std::make_unique<KeepAliveStreamImpl>(stub, endpoint, std::move(token));
}

}  // namespace hsdp::etcd::internal
