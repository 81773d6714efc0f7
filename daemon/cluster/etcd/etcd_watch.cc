#include "daemon/cluster/etcd/etcd_watch.h"

#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "hsdp/common/logging.h"

namespace hsdp::etcd::internal {
namespace {

// Watch: a reader thread drains the stream into `pending_`; Next waits on the
// mutex with its deadline; Cancel ends the stream with TryCancel.

class WatchImpl final : public Watch {
 public:
  WatchImpl(std::string name, std::string what, std::shared_ptr<pb::Watch::Stub> stub,
            std::string token)
      : name_(std::move(name)), what_(std::move(what)), stub_(std::move(stub)),
        token_(std::move(token)) {
    ctx_.AddMetadata(kHasLeaderKey, "true");
    if (!token_.empty()) ctx_.AddMetadata(kTokenKey, token_);
  }

  ~WatchImpl() override {
    Cancel();
    if (reader_.joinable()) reader_.join();
  }

  // Opens the stream and waits up to `timeout` for etcd's "created". OK once
  // created; otherwise the error that ended it (the watch is then over).
  // `*stream_status` is the gRPC status that ended the stream, when it did.
  absl::Status Begin(const pb::WatchRequest& create, absl::Duration timeout,
                     grpc::Status* stream_status) {
    reader_ = std::thread([this, create] { Run(create); });
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return created_ || ended_; };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    // Created: the watch is on, even if it already ended (a compacted start
    // revision is reported right after "created"): Next reports that.
    if (created_) return absl::OkStatus();
    if (ended_) {
      *stream_status = cancel_status_.ok() ? grpc_status_ : cancel_status_;
      return final_;
    }
    // Not created in time: end the attempt; the reader ends promptly.
    *stream_status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                  "no answer to the watch's create request in time");
    EndLocked(absl::UnavailableError(
        absl::StrCat(name_, ": ", what_, ": ", stream_status->error_message(), " (",
                     absl::FormatDuration(timeout), ")")));
    return final_;
  }

  absl::Status Next(std::vector<WatchEvent>* events, absl::Time deadline) override {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !pending_.empty() || ended_;
    };
    if (!ready()) {
      ++blocked_readers_;
      mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
      --blocked_readers_;
    }
    if (!pending_.empty()) {
      for (WatchEvent& e : pending_) events->push_back(std::move(e));
      pending_.clear();
      return absl::OkStatus();
    }
    return ended_ ? final_ : absl::OkStatus();
  }

  int blocked_readers() const override {
    absl::MutexLock lock(&mu_);
    return blocked_readers_;
  }

  void Cancel() override {
    {
      absl::MutexLock lock(&mu_);
      if (!ended_) EndLocked(absl::CancelledError(absl::StrCat(name_, ": ", what_, ": cancelled")));
    }
    // The reader sees its Read fail at once.
    ctx_.TryCancel();
  }

 private:
  void EndLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (ended_) return;
    ended_ = true;
    final_ = std::move(status);
  }

  void End(absl::Status status) {
    {
      absl::MutexLock lock(&mu_);
      EndLocked(std::move(status));
    }
    ctx_.TryCancel();
  }

  void Run(const pb::WatchRequest& create) {
    auto stream = stub_->Watch(&ctx_);
    if (stream->Write(create)) {
      pb::WatchResponse resp;
      while (stream->Read(&resp)) {
        if (!Handle(resp)) break;
      }
    }
    // Ended by us (Cancel, an error found in a response) or by the stream.
    ctx_.TryCancel();
    const grpc::Status s = stream->Finish();
    absl::MutexLock lock(&mu_);
    grpc_status_ = s;
    if (ended_) return;
    // The stream ended by itself: etcd unreachable, restarted, or without a
    // leader ("etcdserver: no leader" with hasleader).
    std::string why;
    if (s.ok()) {
      why = "the watch stream ended";
    } else if (s.error_code() == grpc::StatusCode::CANCELLED) {
      // etcd cancels the streams of a member that lost its leader.
      why = absl::StrCat("etcd cancelled the watch stream (", s.error_message(),
                         "; a member that lost its leader does so)");
    } else {
      why = absl::StrCat(s.error_message(), " (gRPC code ", static_cast<int>(s.error_code()), ")");
    }
    EndLocked(absl::UnavailableError(absl::StrCat(name_, ": ", what_, ": ", why)));
  }

  // False when the watch is over.
  bool Handle(const pb::WatchResponse& resp) {
    if (resp.compact_revision() != 0) {
      End(absl::OutOfRangeError(absl::StrCat(
          name_, ": ", what_, ": the start revision was compacted (compact revision ",
          resp.compact_revision(), "); watch again from that revision or later")));
      return false;
    }
    if (resp.canceled()) {
      // E.g. at create: "rpc error: code = Unauthenticated desc = etcdserver:
      // invalid auth token", "... permission denied".
      const std::string& reason = resp.cancel_reason();
      absl::StatusCode code = absl::StatusCode::kUnavailable;
      grpc::StatusCode grpc_code = grpc::StatusCode::UNAVAILABLE;
      if (absl::StrContains(reason, "permission denied")) {
        code = absl::StatusCode::kPermissionDenied;
        grpc_code = grpc::StatusCode::PERMISSION_DENIED;
      } else if (absl::StrContains(reason, "Unauthenticated") ||
                 absl::StrContains(reason, "invalid auth token")) {
        code = absl::StatusCode::kUnauthenticated;
        grpc_code = grpc::StatusCode::UNAUTHENTICATED;
      }
      {
        absl::MutexLock lock(&mu_);
        cancel_status_ = grpc::Status(grpc_code, reason);
      }
      End(absl::Status(code, absl::StrCat(name_, ": ", what_, ": cancelled by etcd: ",
                                          reason.empty() ? "(no reason given)" : reason)));
      return false;
    }
    absl::MutexLock lock(&mu_);
    if (ended_) return false;
    if (resp.created()) created_ = true;
    if (pending_.size() + resp.events_size() > kMaxPendingEvents) {
      // Nobody is taking them (or etcd floods us): bounded memory, and the
      // owner sees why and watches again from its last revision.
      EndLocked(absl::ResourceExhaustedError(
          absl::StrCat(name_, ": ", what_, ": more than ", kMaxPendingEvents,
                       " events not taken by Next; watch again from the last revision seen")));
      return false;
    }
    for (const mvccpb::Event& e : resp.events()) {
      WatchEvent out;
      out.type = e.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                    : WatchEvent::Type::kPut;
      out.kv = FromPb(e.kv());
      pending_.push_back(std::move(out));
    }
    return true;
  }

  static constexpr size_t kMaxPendingEvents = 1 << 16;

  const std::string name_;
  const std::string what_;
  const std::shared_ptr<pb::Watch::Stub> stub_;
  const std::string token_;
  grpc::ClientContext ctx_;
  std::thread reader_;

  mutable absl::Mutex mu_;
  bool created_ ABSL_GUARDED_BY(mu_) = false;
  int blocked_readers_ ABSL_GUARDED_BY(mu_) = 0;  // Next calls in AwaitWithDeadline
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_ ABSL_GUARDED_BY(mu_);
  grpc::Status grpc_status_ ABSL_GUARDED_BY(mu_);    // how the stream ended
  grpc::Status cancel_status_ ABSL_GUARDED_BY(mu_);  // etcd's cancel_reason
  std::vector<WatchEvent> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<Watch>> OpenWatch(std::string name, std::string what,
                                                 std::shared_ptr<pb::Watch::Stub> stub,
                                                 std::string token,
                                                 const pb::WatchRequest& create,
                                                 absl::Duration timeout,
                                                 grpc::Status* stream_status) {
  auto watch = std::make_unique<WatchImpl>(std::move(name), std::move(what), std::move(stub),
                                           std::move(token));
  absl::Status s = watch->Begin(create, timeout, stream_status);
  if (!s.ok()) return s;
  return std::unique_ptr<Watch>(std::move(watch));
}

}  // namespace hsdp::etcd::internal
