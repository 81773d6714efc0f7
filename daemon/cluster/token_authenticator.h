// Authentication of node-to-node (TCP) calls to the Cluster service. Every
// call carries the cluster's shared secret (cluster.token_file) in metadata
// kClusterTokenMetadata; TokenAuthenticator compares it in constant time.
// With cluster.tls, TlsPeerAuthenticator requires a verified client
// certificate (and the token when one is set). InsecureClusterAuthenticator
// (cluster.insecure) accepts every caller.
#ifndef HSDP_DAEMON_CLUSTER_TOKEN_AUTHENTICATOR_H_
#define HSDP_DAEMON_CLUSTER_TOKEN_AUTHENTICATOR_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "daemon/auth/authenticator.h"
#include "daemon/util/constant_time.h"  // ConstantTimeEquals, used by callers too

namespace hsdp {

inline constexpr char kClusterTokenMetadata[] = "x-hsdp-cluster-token";

// Reads the token from `path`: the file's content without surrounding
// whitespace. INVALID_ARGUMENT when it is empty or over 4 KiB, NOT_FOUND /
// PERMISSION_DENIED when unreadable. Logs a warning when the file is
// readable by group or others.
absl::StatusOr<std::string> ReadClusterToken(const std::string& path);

class TokenAuthenticator : public Authenticator {
 public:
  explicit TokenAuthenticator(std::string token) : token_(std::move(token)) {}
  // UNAUTHENTICATED when the call carries no token, PERMISSION_DENIED when
  // it carries a wrong one. The PeerCred is empty (uid 0 is not implied:
  // IsAdmin is false for everyone).
  absl::StatusOr<PeerCred> Authenticate(const grpc::ServerContextBase& ctx) const override;
  bool IsAdmin(uint32_t) const override { return false; }

 private:
  const std::string token_;
};

// Mutual TLS: the transport already verified the caller's certificate
// against cluster.tls.ca; this checks that the call did come over such a
// connection (UNAUTHENTICATED otherwise) and then, when `token` is set, the
// token as TokenAuthenticator does.
class TlsPeerAuthenticator : public Authenticator {
 public:
  explicit TlsPeerAuthenticator(std::string token) : token_(std::move(token)) {}
  absl::StatusOr<PeerCred> Authenticate(const grpc::ServerContextBase& ctx) const override;
  bool IsAdmin(uint32_t) const override { return false; }

 private:
  const std::string token_;
};

// A PEM file (at most 1 MiB): NOT_FOUND / PERMISSION_DENIED /
// INVALID_ARGUMENT naming `key` (the config key, e.g. "cluster.tls.ca") and
// the path.
absl::StatusOr<std::string> ReadPemFile(const std::string& key, const std::string& path);

// PEM files of cluster.tls, read once at start.
struct ClusterTlsFiles {
  std::string ca, cert, key;
};
// Reads the three files; NOT_FOUND / PERMISSION_DENIED / INVALID_ARGUMENT
// (empty, or not PEM) naming the key and path.
absl::StatusOr<ClusterTlsFiles> ReadClusterTls(const std::string& ca, const std::string& cert,
                                               const std::string& key);

class InsecureClusterAuthenticator : public Authenticator {
 public:
  absl::StatusOr<PeerCred> Authenticate(const grpc::ServerContextBase&) const override {
    return PeerCred{};
  }
  bool IsAdmin(uint32_t) const override { return false; }
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_CLUSTER_TOKEN_AUTHENTICATOR_H_
