// A client of etcd's v3 gRPC API (KV, Lease, Watch, Auth), with stubs
// generated from the proto files etcd publishes (Debian's
// golang-etcd-server-dev; tools/scripts/etcd_env.sh). Only what hsdpd's
// cluster store needs: puts, ranges, deletes, transactions, leases and
// watches.
//
// Endpoints: several etcd members; a call that finds its member unreachable
// moves on to the next one and is retried there once (within its timeout).
// Auth: with a user, the client authenticates at Connect and again when etcd
// says the token expired. TLS: with a CA, every channel verifies the server
// (and presents cert/key when given). Every call sends "hasleader=true", so a
// member cut off from quorum fails the call instead of answering stale data
// or leaving a watch silent.
//
// Errors are absl::Status with the gRPC code kept and a message that names
// etcd and its endpoints: "etcd (127.0.0.1:2379,127.0.0.1:2381): ...".
//
// Thread-safe; every call blocks up to its timeout.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_CLIENT_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace hsdp::etcd {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // HOST:PORT each; at least one
  std::string user;                    // "" = no authentication
  std::string password;
  std::string tls_ca;    // PEM contents; "" = plaintext
  std::string tls_cert;  // PEM contents (client certificate), optional with a CA
  std::string tls_key;
  // Calls go first to a member picked at random (many nodes spread over the
  // members); false: to the first endpoint (tests that need to know which).
  bool random_first_endpoint = true;
  // Keep-alive streams on the raft leader's endpoint (a follower forwards
  // every renewal to the leader); false: where calls go (the baseline of
  // hsdp-membership-sim --etcd-keepalive=any).
  bool keepalives_on_leader = true;
};

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t count = 0;     // keys in the range (also with count_only or a limit)
  int64_t revision = 0;  // the store's revision when the range was read
};

// One comparison of a transaction (etcd's Compare).
struct Compare {
  enum class Target { kVersion, kCreate, kMod, kValue, kLease };
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  std::string key;
  Target target = Target::kVersion;
  Result result = Result::kEqual;
  int64_t number = 0;  // for kVersion, kCreate, kMod, kLease
  std::string value;   // for kValue

  // "`key` is as it was at `mod_revision`": last modified then, or absent
  // when `mod_revision` is 0 (the guard of a read-modify-write).
  static Compare Unchanged(std::string key, int64_t mod_revision) {
    if (mod_revision == 0) return Compare{std::move(key), Target::kCreate, Result::kEqual, 0, ""};
    return Compare{std::move(key), Target::kMod, Result::kEqual, mod_revision, ""};
  }
  // "`key` exists".
  static Compare Exists(std::string key) {
    return Compare{std::move(key), Target::kCreate, Result::kGreater, 0, ""};
  }
};

// One operation of a transaction.
struct Op {
  enum class Kind { kPut, kRange, kDelete };
  Kind kind = Kind::kRange;
  std::string key;
  std::string range_end;  // "" = the key alone; PrefixEnd(p) = every key under p
  std::string value;      // kPut
  int64_t lease = 0;      // kPut; 0 = no lease
  static Op Put(std::string key, std::string value, int64_t lease = 0) {
    return Op{Kind::kPut, std::move(key), "", std::move(value), lease};
  }
  static Op Get(std::string key, std::string range_end = "") {
    return Op{Kind::kRange, std::move(key), std::move(range_end), "", 0};
  }
  static Op Delete(std::string key, std::string range_end = "") {
    return Op{Kind::kDelete, std::move(key), std::move(range_end), "", 0};
  }
};

struct TxnResult {
  bool succeeded = false;
  int64_t revision = 0;
  // One entry per operation of the branch that ran: the keys a kRange read
  // (empty for kPut and kDelete).
  std::vector<std::vector<KeyValue>> ranges;
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: key and mod_revision (the deletion's revision)
};

// The range end that selects every key starting with `prefix` (etcd's
// "prefix + 1"); "\0" for an empty prefix (every key).
std::string PrefixEnd(const std::string& prefix);

// A watch on a key range from one revision: events in revision order.
// Thread-safe: Next from one thread, Cancel from any.
class Watch {
 public:
  virtual ~Watch() = default;
  // Appends the next batch of events (waits until `deadline`). OK with none
  // appended at the deadline; an error when the watch ended: UNAVAILABLE
  // (etcd unreachable or without a leader), OUT_OF_RANGE (the start revision
  // was compacted), CANCELLED (Cancel), RESOURCE_EXHAUSTED (65536 events
  // arrived that Next did not take). Once it failed, every later call
  // fails the same way: open a new watch from the last revision seen + 1.
  virtual absl::Status Next(std::vector<WatchEvent>* events, absl::Time deadline) = 0;
  // Ends a Next in progress and the stream. Idempotent.
  virtual void Cancel() = 0;
  // Next calls waiting for events right now (a test waits for one before it
  // cancels, to know it cancels a Next that blocked).
  virtual int blocked_readers() const = 0;
};

class EtcdClient {
 public:
  // Opens channels to the endpoints and, with a user, authenticates
  // (UNAUTHENTICATED or INVALID_ARGUMENT naming etcd for wrong credentials).
  // INVALID_ARGUMENT for no endpoints or a malformed one. Does not fail when
  // etcd is unreachable unless authentication needs it.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(EtcdOptions options,
                                                             absl::Duration timeout);
  virtual ~EtcdClient() = default;

  // Human-readable "etcd (ep1,ep2,...)", the prefix of every error message.
  virtual const std::string& name() const = 0;

  // Returns the revision of the put.
  virtual absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                                      int64_t lease, absl::Duration timeout) = 0;
  // `limit` 0 = no limit; `count_only` returns no kvs, only the count.
  virtual absl::StatusOr<RangeResult> Range(const std::string& key, const std::string& range_end,
                                            absl::Duration timeout, int64_t limit = 0,
                                            bool count_only = false) = 0;
  // Returns how many keys were deleted.
  virtual absl::StatusOr<int64_t> Delete(const std::string& key, const std::string& range_end,
                                         absl::Duration timeout) = 0;
  virtual absl::StatusOr<TxnResult> Txn(const std::vector<Compare>& compares,
                                        const std::vector<Op>& success,
                                        const std::vector<Op>& failure,
                                        absl::Duration timeout) = 0;

  // A lease of `ttl` (whole seconds, rounded up; etcd may raise it to its
  // minimum). Returns its id.
  virtual absl::StatusOr<int64_t> LeaseGrant(absl::Duration ttl, absl::Duration timeout) = 0;
  // Deletes the lease and every key attached to it. NOT_FOUND when unknown.
  virtual absl::Status LeaseRevoke(int64_t lease, absl::Duration timeout) = 0;
  // Renews the lease once; returns the TTL it has now. NOT_FOUND when it
  // expired (or never existed). Renewals of a lease share one keep-alive
  // stream, kept open between calls, on the raft leader's endpoint once the
  // client knows it (after a renewal elsewhere or in a new raft term, the
  // next renewal opens one there; after a failure, one on the member the
  // failover picks); LeaseRevoke and NOT_FOUND close it.
  virtual absl::StatusOr<absl::Duration> LeaseKeepAlive(int64_t lease, absl::Duration timeout) = 0;
  // Keep-alive streams this client opened (one per lease, more after
  // failures).
  virtual uint64_t keepalive_streams_opened() const = 0;

  // Starts a watch on [key, range_end) from `start_revision` (0 = from now).
  // Fails (UNAVAILABLE) when etcd cannot be reached within `timeout`.
  virtual absl::StatusOr<std::unique_ptr<Watch>> StartWatch(const std::string& key,
                                                            const std::string& range_end,
                                                            int64_t start_revision,
                                                            absl::Duration timeout) = 0;
};

}  // namespace hsdp::etcd

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_CLIENT_H_
