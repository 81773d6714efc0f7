// The etcd v3 client: one gRPC channel per endpoint, every call with a
// deadline, "hasleader=true" and (with a user) the auth token; failover to
// the next endpoint once per call, re-authentication once on a stale token
// (Call for unary calls, StartWatch for watches: the same rules side by
// side); keep-alive streams on the raft leader (KeepAliveEndpoint). The
// watch stream is etcd_watch.cc; the conversions to and from etcd's protos
// are etcd_client_internal.cc.
#include "daemon/cluster/etcd/etcd_client.h"

#include <atomic>
#include <climits>
#include <map>
#include <memory>
#include <optional>
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
#include "daemon/cluster/etcd/etcd_client_internal.h"
#include "daemon/cluster/etcd/etcd_keepalive.h"
#include "daemon/cluster/etcd/etcd_watch.h"
#include "grpcpp/grpcpp.h"
#include "hsdp/common/logging.h"

namespace hsdp::etcd {
namespace {

namespace pb = ::etcdserverpb;
using internal::Endpoint;
using internal::FromPb;
using internal::IsStaleToken;
using internal::KeepAliveStream;
using internal::kHasLeaderKey;
using internal::kMaxReceiveBytes;
using internal::kTokenKey;
using internal::OpenWatch;
using internal::Quote;
using internal::RangeText;
using internal::ToAbsl;
using internal::ToPb;
using internal::ValidateEndpoint;

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
      ep.maintenance = pb::Maintenance::NewStub(ep.channel);
      endpoints_.push_back(std::move(ep));
    }
    // Where calls go first: a random member per client, so that many nodes
    // spread over the etcd members instead of all starting on the first.
    if (!endpoints_.empty() && options_.random_first_endpoint) {
      current_.store(std::random_device{}() % endpoints_.size());
    }
    absl::MutexLock lock(&leader_mu_);
    member_ids_.assign(endpoints_.size(), 0);
    failed_at_.assign(endpoints_.size(), absl::InfinitePast());
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
    ForgetKeepAlive(lease);
    // etcd: NOT_FOUND "etcdserver: requested lease not found"; the code is kept.
    return Call(absl::StrCat("revoke lease ", absl::Hex(lease)), timeout,
                [&](Endpoint& ep, grpc::ClientContext* ctx) {
                  return ep.lease->LeaseRevoke(ctx, req, &resp);
                });
  }

  absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t lease, absl::Duration timeout) override {
    const std::string what = absl::StrCat("keep lease ", absl::Hex(lease), " alive");
    const absl::Time deadline = absl::Now() + timeout;
    std::shared_ptr<KeepAliveStream> stream = KeepAliveOf(lease);
    Attempts attempts;
    for (;;) {
      if (stream == nullptr || stream->over()) {
        // A new stream on the raft leader when it is known, else on the member
        // calls go to now; with the token now.
        const size_t index = KeepAliveEndpoint(stream.get());
        stream = internal::OpenKeepAlive(endpoints_[index].lease.get(), index, Token());
        keepalive_streams_opened_.fetch_add(1, std::memory_order_relaxed);
        std::shared_ptr<KeepAliveStream> replaced;  // closed outside the lock
        absl::MutexLock lock(&keepalive_mu_);
        replaced = std::exchange(keepalives_[lease], stream);
      }
      pb::LeaseKeepAliveResponse resp;
      const grpc::Status s = stream->Renew(lease, deadline, &resp);
      if (s.ok()) {
        if (resp.ttl() <= 0) {
          ForgetKeepAlive(lease);
          return absl::NotFoundError(
              absl::StrCat(name_, ": ", what, ": the lease expired or does not exist"));
        }
        // A stream that is not on the leader (or a leader that may have
        // changed: a new raft term) closes after this renewal; the next one
        // opens on the leader.
        if (MoveToLeader(stream->endpoint(), resp.header().raft_term(), deadline)) {
          ForgetKeepAlive(lease);
        }
        return absl::Seconds(resp.ttl());
      }
      std::optional<absl::Status> done =
          attempts.After(this, s, stream->endpoint(), stream->token(), /*with_token=*/true,
                         deadline, what);
      if (done.has_value()) return *std::move(done);
    }
  }

  uint64_t keepalive_streams_opened() const override {
    return keepalive_streams_opened_.load(std::memory_order_relaxed);
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
      grpc::Status stream_status;
      absl::StatusOr<std::unique_ptr<Watch>> watch =
          OpenWatch(name_, what, ep.watch, token, create, deadline - absl::Now(), &stream_status);
      if (watch.ok()) return watch;
      const absl::Status s = watch.status();
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
    Attempts attempts;
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
      std::optional<absl::Status> done =
          attempts.After(this, s, index, token, with_token, deadline, what);
      if (done.has_value()) return *std::move(done);
    }
  }

  // One call's retry rules (Call, LeaseKeepAlive): after a failed attempt on
  // endpoint `index` made with `token`, authenticate again once when etcd
  // refused the token, move on to the next endpoint once when the member is
  // down (if time is left). nullopt: try again; else the call's error.
  struct Attempts {
    bool reauthenticated = false;
    bool failed_over = false;
    std::string earlier;

    std::optional<absl::Status> After(EtcdClientImpl* c, const grpc::Status& s, size_t index,
                                      const std::string& token, bool with_token,
                                      absl::Time deadline, const std::string& what) {
      const Endpoint& ep = c->endpoints_[index];
      const bool time_left = absl::Now() < deadline;
      if (with_token && !reauthenticated && time_left && !c->options_.user.empty() &&
          IsStaleToken(s)) {
        reauthenticated = true;
        absl::Status a = c->Reauthenticate(token, deadline - absl::Now());
        if (!a.ok()) return a;
        return std::nullopt;
      }
      if (MemberDown(s)) {
        c->Advance(index, ep, s);
        if (!failed_over && time_left && c->endpoints_.size() > 1) {
          failed_over = true;
          earlier = absl::StrCat(" (before that ", ep.address, ": ", s.error_message(), ")");
          return std::nullopt;
        }
      }
      std::string msg = s.error_message();
      if (msg.empty()) msg = absl::StrCat("gRPC code ", static_cast<int>(s.error_code()));
      return absl::Status(ToAbsl(s.error_code()),
                          absl::StrCat(c->name_, ": ", what, ": ", msg,
                                       failed_over ? absl::StrCat(" at ", ep.address) : "",
                                       earlier));
    }
  };

  // Keep-alive streams go to the raft leader. etcd serves a renewal on the
  // leader in memory; a follower forwards each one to the leader in an HTTP
  // request of its own: with streams spread over three members, etcd spent
  // about 1.4 times the CPU per renewal (docs/benchmarks.md §14f). Where a
  // new stream opens: the leader's endpoint when known, unless `failed` (the
  // stream that just failed) was on it; else the member calls go to now (the
  // failover's choice). An endpoint whose stream failed is not moved to for
  // kAvoidFailed, even when it leads: a leader the others reach but this node
  // does not (a one-sided partition) would otherwise cost every renewal a
  // failed attempt.
  size_t KeepAliveEndpoint(const KeepAliveStream* failed) ABSL_LOCKS_EXCLUDED(leader_mu_) {
    if (!options_.keepalives_on_leader) return current_.load() % endpoints_.size();
    absl::MutexLock lock(&leader_mu_);
    if (failed != nullptr) {
      failed_at_[failed->endpoint()] = absl::Now();
      if (leader_index_ == static_cast<int>(failed->endpoint())) {
        leader_index_ = -1;  // the leader's stream failed: find the leader again
      }
    }
    if (leader_index_ >= 0) return static_cast<size_t>(leader_index_);
    return current_.load() % endpoints_.size();
  }

  // After a renewal answered on endpoint `index` in raft term `term`: true
  // when the stream should move to the leader's endpoint. Finds the leader
  // (one search at a time, bounded by kLeaderSearch and `deadline`) when it
  // is unknown or the term moved on since it was found.
  bool MoveToLeader(size_t index, uint64_t term, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(leader_mu_) {
    if (endpoints_.size() < 2 || !options_.keepalives_on_leader) return false;
    {
      absl::MutexLock lock(&leader_mu_);
      if (leader_index_ >= 0 && term <= leader_term_) {
        return static_cast<size_t>(leader_index_) != index;
      }
      if (leader_search_) return false;  // another renewal is finding it
      leader_search_ = true;
    }
    const int found = FindLeader(index, std::min(deadline, absl::Now() + kLeaderSearch));
    absl::MutexLock lock(&leader_mu_);
    leader_search_ = false;
    return found >= 0 && static_cast<size_t>(found) != index;
  }

  // Asks the members, starting with `first`, who leads (Maintenance.Status:
  // each answer names the leader's member id and its own) until the
  // endpoint whose member id is the leader's is known. Returns its index
  // (and records it with the term), or -1 (no leader, or its endpoint is
  // not among ours: streams stay where they are).
  int FindLeader(size_t first, absl::Time deadline) ABSL_LOCKS_EXCLUDED(leader_mu_) {
    uint64_t leader = 0, term = 0;
    for (size_t k = 0; k < endpoints_.size() && absl::Now() < deadline; ++k) {
      const size_t i = (first + k) % endpoints_.size();
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(deadline));
      ctx.AddMetadata(kHasLeaderKey, "true");
      const std::string token = Token();
      if (!token.empty()) ctx.AddMetadata(kTokenKey, token);
      pb::StatusResponse resp;
      if (!endpoints_[i].maintenance->Status(&ctx, pb::StatusRequest(), &resp).ok()) continue;
      absl::MutexLock lock(&leader_mu_);
      member_ids_[i] = resp.header().member_id();
      if (resp.leader() != 0 && resp.header().raft_term() >= term) {
        leader = resp.leader();
        term = resp.header().raft_term();
      }
      for (size_t j = 0; leader != 0 && j < endpoints_.size(); ++j) {
        if (member_ids_[j] != leader) continue;
        if (absl::Now() - failed_at_[j] < kAvoidFailed) return -1;  // stay where it works
        if (leader_index_ != static_cast<int>(j)) {
          HSDP_LOG_EVERY_N_SEC(Info, 10) << name_ << ": keep-alives go to " << endpoints_[j].address
                                         << ", the raft leader (term " << term << ")";
        }
        leader_index_ = static_cast<int>(j);
        leader_term_ = term;
        return leader_index_;
      }
    }
    return -1;
  }

  // The lease's open keep-alive stream, null when none.
  std::shared_ptr<KeepAliveStream> KeepAliveOf(int64_t lease) {
    absl::MutexLock lock(&keepalive_mu_);
    auto it = keepalives_.find(lease);
    return it == keepalives_.end() ? nullptr : it->second;
  }
  void ForgetKeepAlive(int64_t lease) {
    std::shared_ptr<KeepAliveStream> gone;  // closed outside the lock
    absl::MutexLock lock(&keepalive_mu_);
    auto it = keepalives_.find(lease);
    if (it == keepalives_.end()) return;
    gone = std::move(it->second);
    keepalives_.erase(it);
  }

  const EtcdOptions options_;
  std::string name_;
  std::vector<Endpoint> endpoints_;
  std::atomic<size_t> current_{0};  // an index into endpoints_
  absl::Mutex auth_mu_;  // one re-authentication at a time
  absl::Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  // One stream per lease kept alive (a lease revoked or gone drops its own).
  absl::Mutex keepalive_mu_;
  std::map<int64_t, std::shared_ptr<KeepAliveStream>> keepalives_ ABSL_GUARDED_BY(keepalive_mu_);
  std::atomic<uint64_t> keepalive_streams_opened_{0};
  // The leader's endpoint for keep-alives (-1: unknown), the raft term it
  // was found in, each endpoint's member id as its Status named it (0:
  // unknown), when each endpoint's keep-alive stream last failed, and
  // whether a search runs.
  static constexpr absl::Duration kLeaderSearch = absl::Seconds(1);
  static constexpr absl::Duration kAvoidFailed = absl::Seconds(30);
  absl::Mutex leader_mu_;
  int leader_index_ ABSL_GUARDED_BY(leader_mu_) = -1;
  uint64_t leader_term_ ABSL_GUARDED_BY(leader_mu_) = 0;
  bool leader_search_ ABSL_GUARDED_BY(leader_mu_) = false;
  std::vector<uint64_t> member_ids_ ABSL_GUARDED_BY(leader_mu_);
  std::vector<absl::Time> failed_at_ ABSL_GUARDED_BY(leader_mu_);
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
