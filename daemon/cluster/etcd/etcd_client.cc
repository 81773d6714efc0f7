// The etcd v3 client: one gRPC channel per endpoint, every call with a
// deadline, "hasleader=true" and (with a user) the auth token; failover to
// the next endpoint once per call; watches on a reader thread each.
// Read whole: the watch and the unary calls share the endpoint, token and
// error-message plumbing, and the failover and re-authentication rules are
// easiest to check side by side (StartWatch applies the same ones as Call).
#include "daemon/cluster/etcd/etcd_client.h"

#include <atomic>
#include <climits>
#include <random>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb.h"
#include "etcd/mvcc/mvccpb/kv.pb.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/logging.h"

namespace hsdp::etcd {
namespace {

namespace pb = ::etcdserverpb;

// etcd's require-leader metadata (clientv3's WithRequireLeader): a member
// without a leader fails the call (UNAVAILABLE "etcdserver: no leader") and
// cancels a watch, instead of blocking or staying silent.
constexpr char kHasLeaderKey[] = "hasleader";
constexpr char kTokenKey[] = "token";
// Larger than any response hsdpd reads (etcd's own limit on a request is
// 1.5 MiB; a range of many keys can exceed gRPC's default 4 MiB).
constexpr int kMaxReceiveBytes = 64 << 20;

// What etcd answers when the token is unknown to the member (a member that
// restarted forgot its simple tokens) or older than the auth store.
bool IsStaleToken(const grpc::Status& s) {
  return (s.error_code() == grpc::StatusCode::UNAUTHENTICATED &&
          absl::StrContains(s.error_message(), "invalid auth token")) ||
         absl::StrContains(s.error_message(), "revision of auth store is old");
}

absl::StatusCode ToAbsl(grpc::StatusCode code) { return static_cast<absl::StatusCode>(code); }

std::string Quote(const std::string& key) { return absl::StrCat("\"", absl::CHexEscape(key), "\""); }

std::string RangeText(const std::string& key, const std::string& range_end) {
  if (range_end.empty()) return Quote(key);
  return absl::StrCat("[", Quote(key), ", ", Quote(range_end), ")");
}

// HOST:PORT with a port in 1..65535; HOST may be a bracketed IPv6 address.
absl::Status ValidateEndpoint(const std::string& ep) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint \"", absl::CHexEscape(ep), "\": ", why,
                     " (expected HOST:PORT, e.g. 127.0.0.1:2379)"));
  };
  if (ep.empty()) return bad("empty");
  if (absl::StrContains(ep, "://")) return bad("a URL; give HOST:PORT without a scheme");
  for (char c : ep) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c)) || c == '/' ||
        !absl::ascii_isprint(static_cast<unsigned char>(c))) {
      return bad("contains a space, a slash or a control character");
    }
  }
  const size_t colon = ep.rfind(':');
  if (colon == std::string::npos) return bad("no port");
  const std::string host = ep.substr(0, colon);
  const std::string port = ep.substr(colon + 1);
  if (host.empty()) return bad("no host");
  if (host.front() == '[' ? host.back() != ']' || host.size() < 3
                          : absl::StrContains(host, ':') || absl::StrContains(host, ']')) {
    return bad("malformed host (an IPv6 address needs brackets: [::1]:2379)");
  }
  int value = 0;
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(port, &value) || value < 1 || value > 65535) {
    return bad("the port must be a number in 1..65535");
  }
  return absl::OkStatus();
}

KeyValue FromPb(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

void ToPb(const Compare& c, pb::Compare* out) {
  out->set_key(c.key);
  switch (c.result) {
    case Compare::Result::kEqual: out->set_result(pb::Compare::EQUAL); break;
    case Compare::Result::kGreater: out->set_result(pb::Compare::GREATER); break;
    case Compare::Result::kLess: out->set_result(pb::Compare::LESS); break;
    case Compare::Result::kNotEqual: out->set_result(pb::Compare::NOT_EQUAL); break;
  }
  switch (c.target) {
    case Compare::Target::kVersion:
      out->set_target(pb::Compare::VERSION);
      out->set_version(c.number);
      break;
    case Compare::Target::kCreate:
      out->set_target(pb::Compare::CREATE);
      out->set_create_revision(c.number);
      break;
    case Compare::Target::kMod:
      out->set_target(pb::Compare::MOD);
      out->set_mod_revision(c.number);
      break;
    case Compare::Target::kValue:
      out->set_target(pb::Compare::VALUE);
      out->set_value(c.value);
      break;
    case Compare::Target::kLease:
      out->set_target(pb::Compare::LEASE);
      out->set_lease(c.number);
      break;
  }
}

void ToPb(const Op& op, pb::RequestOp* out) {
  switch (op.kind) {
    case Op::Kind::kPut: {
      pb::PutRequest* put = out->mutable_request_put();
      put->set_key(op.key);
      put->set_value(op.value);
      put->set_lease(op.lease);
      break;
    }
    case Op::Kind::kRange: {
      pb::RangeRequest* range = out->mutable_request_range();
      range->set_key(op.key);
      range->set_range_end(op.range_end);
      break;
    }
    case Op::Kind::kDelete: {
      pb::DeleteRangeRequest* del = out->mutable_request_delete_range();
      del->set_key(op.key);
      del->set_range_end(op.range_end);
      break;
    }
  }
}

struct Endpoint {
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::KV::Stub> kv;
  std::unique_ptr<pb::Lease::Stub> lease;
  std::shared_ptr<pb::Watch::Stub> watch;  // shared with the watches it started
  std::unique_ptr<pb::Auth::Stub> auth;
};

// ---------------------------------------------------------------------------
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
    mu_.AwaitWithDeadline(absl::Condition(&ready), deadline);
    if (!pending_.empty()) {
      for (WatchEvent& e : pending_) events->push_back(std::move(e));
      pending_.clear();
      return absl::OkStatus();
    }
    return ended_ ? final_ : absl::OkStatus();
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

  absl::Mutex mu_;
  bool created_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status final_ ABSL_GUARDED_BY(mu_);
  grpc::Status grpc_status_ ABSL_GUARDED_BY(mu_);    // how the stream ended
  grpc::Status cancel_status_ ABSL_GUARDED_BY(mu_);  // etcd's cancel_reason
  std::vector<WatchEvent> pending_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------

class EtcdClientImpl final : public EtcdClient {
 public:
  explicit EtcdClientImpl(EtcdOptions options) : options_(std::move(options)) {
    name_ = absl::StrCat("etcd (", absl::StrJoin(options_.endpoints, ","), ")");
    std::shared_ptr<grpc::ChannelCredentials> creds;
    if (!options_.tls_ca.empty()) {
      grpc::SslCredentialsOptions ssl;
      ssl.pem_root_certs = options_.tls_ca;
      ssl.pem_private_key = options_.tls_key;
      ssl.pem_cert_chain = options_.tls_cert;
      creds = grpc::SslCredentials(ssl);
    } else {
      creds = grpc::InsecureChannelCredentials();
    }
    for (const std::string& address : options_.endpoints) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
      args.SetMaxReceiveMessageSize(kMaxReceiveBytes);
      // A member that restarts is found again within a second.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      // A dead connection under a long watch is noticed (etcd permits pings
      // every 5 s while a stream is open: --grpc-keepalive-min-time).
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
      // One channel (and connection) per client and endpoint, not shared
      // with other clients of the process.
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      Endpoint ep;
      ep.address = address;
      ep.channel = grpc::CreateCustomChannel(address, creds, args);
      ep.kv = pb::KV::NewStub(ep.channel);
      ep.lease = pb::Lease::NewStub(ep.channel);
      ep.watch = pb::Watch::NewStub(ep.channel);
      ep.auth = pb::Auth::NewStub(ep.channel);
      endpoints_.push_back(std::move(ep));
    }
    // Where calls go first: a random member per client, so that many nodes
    // spread over the etcd members instead of all starting on the first.
    if (!endpoints_.empty() && options_.random_first_endpoint) {
      current_.store(std::random_device{}() % endpoints_.size());
    }
  }

  const std::string& name() const override { return name_; }

  absl::Status Authenticate(absl::Duration timeout) {
    pb::AuthenticateRequest req;
    req.set_name(options_.user);
    req.set_password(options_.password);
    pb::AuthenticateResponse resp;
    absl::Status s = Call(
        absl::StrCat("authenticate as user \"", options_.user, "\""), timeout,
        [&](Endpoint& ep, grpc::ClientContext* ctx) {
          resp.Clear();
          return ep.auth->Authenticate(ctx, req, &resp);
        },
        /*with_token=*/false);
    if (!s.ok()) return s;
    absl::MutexLock lock(&mu_);
    token_ = resp.token();
    return absl::OkStatus();
  }

  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value, int64_t lease,
                              absl::Duration timeout) override {
    pb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    req.set_lease(lease);
    pb::PutResponse resp;
    absl::Status s = Call(absl::StrCat("put ", Quote(key)), timeout,
                          [&](Endpoint& ep, grpc::ClientContext* ctx) {
                            return ep.kv->Put(ctx, req, &resp);
                          });
    if (!s.ok()) return s;
    return resp.header().revision();
  }

  absl::StatusOr<RangeResult> Range(const std::string& key, const std::string& range_end,
                                    absl::Duration timeout, int64_t limit,
                                    bool count_only) override {
    pb::RangeRequest req;
    req.set_key(key);
    req.set_range_end(range_end);
    req.set_limit(limit);
    req.set_count_only(count_only);
    pb::RangeResponse resp;
    absl::Status s = Call(absl::StrCat("range ", RangeText(key, range_end)), timeout,
                          [&](Endpoint& ep, grpc::ClientContext* ctx) {
                            resp.Clear();
                            return ep.kv->Range(ctx, req, &resp);
                          });
    if (!s.ok()) return s;
    RangeResult out;
    out.kvs.reserve(resp.kvs_size());
    for (const mvccpb::KeyValue& kv : resp.kvs()) out.kvs.push_back(FromPb(kv));
    out.count = resp.count();
    out.revision = resp.header().revision();
    return out;
  }

  absl::StatusOr<int64_t> Delete(const std::string& key, const std::string& range_end,
                                 absl::Duration timeout) override {
    pb::DeleteRangeRequest req;
    req.set_key(key);
    req.set_range_end(range_end);
    pb::DeleteRangeResponse resp;
    absl::Status s = Call(absl::StrCat("delete ", RangeText(key, range_end)), timeout,
                          [&](Endpoint& ep, grpc::ClientContext* ctx) {
                            return ep.kv->DeleteRange(ctx, req, &resp);
                          });
    if (!s.ok()) return s;
    return resp.deleted();
  }

  absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                const std::vector<Op>& success, const std::vector<Op>& failure,
                                absl::Duration timeout) override {
    pb::TxnRequest req;
    for (const Compare& c : compares) ToPb(c, req.add_compare());
    for (const Op& op : success) ToPb(op, req.add_success());
    for (const Op& op : failure) ToPb(op, req.add_failure());
    pb::TxnResponse resp;
    std::string what = "txn";
    if (!compares.empty()) absl::StrAppend(&what, " on ", Quote(compares.front().key));
    absl::Status s = Call(what, timeout, [&](Endpoint& ep, grpc::ClientContext* ctx) {
      resp.Clear();
      return ep.kv->Txn(ctx, req, &resp);
    });
    if (!s.ok()) return s;
    TxnResult out;
    out.succeeded = resp.succeeded();
    out.revision = resp.header().revision();
    out.ranges.resize(resp.responses_size());
    for (int i = 0; i < resp.responses_size(); ++i) {
      const pb::ResponseOp& r = resp.responses(i);
      if (r.has_response_range()) {
        for (const mvccpb::KeyValue& kv : r.response_range().kvs()) {
          out.ranges[i].push_back(FromPb(kv));
        }
      }
    }
    return out;
  }

  absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl, absl::Duration timeout) override {
    int64_t seconds = absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1)));
    if (seconds < 1) seconds = 1;
    pb::LeaseGrantRequest req;
    req.set_ttl(seconds);
    pb::LeaseGrantResponse resp;
    absl::Status s = Call(absl::StrCat("grant a lease of ", seconds, " s"), timeout,
                          [&](Endpoint& ep, grpc::ClientContext* ctx) {
                            resp.Clear();
                            return ep.lease->LeaseGrant(ctx, req, &resp);
                          });
    if (!s.ok()) return s;
    if (!resp.error().empty()) {
      return absl::UnavailableError(
          absl::StrCat(name_, ": grant a lease of ", seconds, " s: ", resp.error()));
    }
    return resp.id();
  }

  absl::Status LeaseRevoke(int64_t lease, absl::Duration timeout) override {
    pb::LeaseRevokeRequest req;
    req.set_id(lease);
    pb::LeaseRevokeResponse resp;
    // etcd: NOT_FOUND "etcdserver: requested lease not found"; the code is kept.
    return Call(absl::StrCat("revoke lease ", absl::Hex(lease)), timeout,
                [&](Endpoint& ep, grpc::ClientContext* ctx) {
                  return ep.lease->LeaseRevoke(ctx, req, &resp);
                });
  }

  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t lease, absl::Duration timeout) override {
    pb::LeaseKeepAliveRequest req;
    req.set_id(lease);
    pb::LeaseKeepAliveResponse resp;
    const std::string what = absl::StrCat("keep lease ", absl::Hex(lease), " alive");
    // v3 has no unary keep-alive: one round on a stream of its own.
    absl::Status s = Call(what, timeout, [&](Endpoint& ep, grpc::ClientContext* ctx) {
      resp.Clear();
      auto stream = ep.lease->LeaseKeepAlive(ctx);
      if (stream->Write(req) && stream->Read(&resp)) {
        ctx->TryCancel();
        (void)stream->Finish();
        return grpc::Status::OK;
      }
      ctx->TryCancel();
      grpc::Status st = stream->Finish();
      if (st.ok()) st = grpc::Status(grpc::StatusCode::UNAVAILABLE, "the keep-alive stream ended");
      return st;
    });
    if (!s.ok()) return s;
    if (resp.ttl() <= 0) {
      return absl::NotFoundError(
          absl::StrCat(name_, ": ", what, ": the lease expired or does not exist"));
    }
    return absl::Seconds(resp.ttl());
  }

  absl::StatusOr<std::unique_ptr<Watch>> StartWatch(const std::string& key,
                                                    const std::string& range_end,
                                                    int64_t start_revision,
                                                    absl::Duration timeout) override {
    pb::WatchRequest create;
    pb::WatchCreateRequest* c = create.mutable_create_request();
    c->set_key(key);
    c->set_range_end(range_end);
    c->set_start_revision(start_revision);
    const std::string what = absl::StrCat("watch ", RangeText(key, range_end), " from revision ",
                                          start_revision);
    const absl::Time deadline = absl::Now() + timeout;
    bool reauthenticated = false;
    bool failed_over = false;
    std::string earlier;
    for (;;) {
      const size_t index = current_.load() % endpoints_.size();
      Endpoint& ep = endpoints_[index];
      std::string token = Token();
      auto watch = std::make_unique<WatchImpl>(name_, what, ep.watch, token);
      grpc::Status stream_status;
      absl::Status s = watch->Begin(create, deadline - absl::Now(), &stream_status);
      if (s.ok()) return std::unique_ptr<Watch>(std::move(watch));
      watch.reset();
      const bool time_left = absl::Now() < deadline;
      if (!reauthenticated && time_left && IsStaleToken(stream_status) && !options_.user.empty()) {
        reauthenticated = true;
        absl::Status a = Reauthenticate(token, deadline - absl::Now());
        if (!a.ok()) return a;
        continue;
      }
      if (s.code() != absl::StatusCode::kUnavailable) return s;
      // Unreachable, hung (no "created" in time) or without a leader (etcd
      // cancelled the stream): the next member.
      Advance(index, ep, stream_status);
      if (!failed_over && time_left && endpoints_.size() > 1) {
        failed_over = true;
        earlier = absl::StrCat(" (before that ", ep.address, ": ", stream_status.error_message(), ")");
        continue;
      }
      if (!earlier.empty()) return absl::Status(s.code(), absl::StrCat(s.message(), earlier));
      return s;
    }
  }

 private:
  std::string Token() {
    absl::MutexLock lock(&mu_);
    return token_;
  }

  // Authenticates again unless another call already replaced `stale`.
  absl::Status Reauthenticate(const std::string& stale, absl::Duration timeout) {
    absl::MutexLock auth_lock(&auth_mu_);
    if (Token() != stale) return absl::OkStatus();
    HSDP_LOG_EVERY_N_SEC(Info, 10) << name_ << ": the auth token was refused; authenticating again";
    return Authenticate(timeout);
  }

  // UNAVAILABLE (down, unreachable, no leader) or a deadline that passed:
  // the member may be hung (stopped, partitioned: its TCP connection still
  // looks fine). Every member serves every call, so moving on costs nothing
  // when the member was merely slow; staying would fail every later call
  // on a hung one.
  static bool MemberDown(const grpc::Status& s) {
    return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
           s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
  }

  void Advance(size_t from, const Endpoint& ep, const grpc::Status& why) {
    if (endpoints_.size() < 2) return;
    size_t expected = from;
    if (current_.compare_exchange_strong(expected, (from + 1) % endpoints_.size())) {
      HSDP_LOG_EVERY_N_SEC(Warning, 5)
          << name_ << ": " << ep.address << " failed (" << why.error_message()
          << "); moving on to " << endpoints_[(from + 1) % endpoints_.size()].address;
    }
  }

  // Runs `fn` (one RPC on the given endpoint with a prepared context) with
  // the deadline, "hasleader" and the token; authenticates again once when
  // etcd refuses the token, and moves on to the next endpoint once when the
  // member is unreachable (if time is left). A write retried on the next
  // member may have been applied by the first one although it answered
  // UNAVAILABLE (etcd's own clients have the same property): callers that
  // care use a Txn whose compare makes the retry harmless.
  template <typename Fn>
  absl::Status Call(const std::string& what, absl::Duration timeout, Fn&& fn,
                    bool with_token = true) {
    const absl::Time deadline = absl::Now() + timeout;
    bool reauthenticated = false;
    bool failed_over = false;
    std::string earlier;
    for (;;) {
      const size_t index = current_.load() % endpoints_.size();
      Endpoint& ep = endpoints_[index];
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      ctx.AddMetadata(kHasLeaderKey, "true");
      std::string token;
      if (with_token) {
        token = Token();
        if (!token.empty()) ctx.AddMetadata(kTokenKey, token);
      }
      const grpc::Status s = fn(ep, &ctx);
      if (s.ok()) return absl::OkStatus();
      const bool time_left = absl::Now() < deadline;
      if (with_token && !reauthenticated && time_left && !options_.user.empty() &&
          IsStaleToken(s)) {
        reauthenticated = true;
        absl::Status a = Reauthenticate(token, deadline - absl::Now());
        if (!a.ok()) return a;
        continue;
      }
      if (MemberDown(s)) {
        Advance(index, ep, s);
        if (!failed_over && time_left && endpoints_.size() > 1) {
          failed_over = true;
          earlier = absl::StrCat(" (before that ", ep.address, ": ", s.error_message(), ")");
          continue;
        }
      }
      std::string msg = s.error_message();
      if (msg.empty()) msg = absl::StrCat("gRPC code ", static_cast<int>(s.error_code()));
      return absl::Status(ToAbsl(s.error_code()),
                          absl::StrCat(name_, ": ", what, ": ", msg,
                                       failed_over ? absl::StrCat(" at ", ep.address) : "",
                                       earlier));
    }
  }

  const EtcdOptions options_;
  std::string name_;
  std::vector<Endpoint> endpoints_;
  std::atomic<size_t> current_{0};  // an index into endpoints_
  absl::Mutex auth_mu_;  // one re-authentication at a time
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty() && static_cast<unsigned char>(end.back()) == 0xff) end.pop_back();
  if (end.empty()) return std::string(1, '\0');
  end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
  return end;
}

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Connect(EtcdOptions options,
                                                                 absl::Duration timeout) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("etcd: no endpoints (give at least one HOST:PORT)");
  }
  for (const std::string& ep : options.endpoints) {
    absl::Status s = ValidateEndpoint(ep);
    if (!s.ok()) return s;
  }
  if (options.tls_ca.empty() && (!options.tls_cert.empty() || !options.tls_key.empty())) {
    return absl::InvalidArgumentError(
        "etcd: a client certificate or key without a CA (tls_ca) to verify the server with");
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("etcd: give both the client certificate and its key");
  }
  const bool with_user = !options.user.empty();
  auto client = std::make_unique<EtcdClientImpl>(std::move(options));
  if (with_user) {
    // A token now, so that wrong credentials fail here (etcd answers
    // INVALID_ARGUMENT "etcdserver: authentication failed, invalid user ID or
    // password"; the code is kept).
    absl::Status s = client->Authenticate(timeout);
    if (!s.ok()) return s;
  }
  return std::unique_ptr<EtcdClient>(std::move(client));
}

}  // namespace hsdp::etcd
