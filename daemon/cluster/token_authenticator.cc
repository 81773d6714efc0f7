#include "daemon/cluster/token_authenticator.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "hsdp/common/logging.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {

absl::StatusOr<std::string> ReadClusterToken(const std::string& path) {
  constexpr size_t kMaxTokenBytes = 4096;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string what = absl::StrCat("cannot open cluster.token_file \"", path, "\": ",
                                          std::strerror(err));
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(what);
    return absl::NotFoundError(what);
  }
  struct stat st;
  if (::fstat(fd, &st) == 0 && (st.st_mode & 077) != 0) {
    HSDP_LOG(Warning) << "cluster.token_file " << path
                      << " is readable by group or others; chmod 0600 it";
  }
  std::string text;
  char buffer[1024];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > kMaxTokenBytes) break;
  }
  ::close(fd);
  if (text.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster.token_file \"", path, "\" is larger than ", kMaxTokenBytes, " bytes"));
  }
  std::string token(absl::StripAsciiWhitespace(text));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.token_file \"", path, "\" is empty"));
  }
  return token;
}

absl::StatusOr<PeerCred> TlsPeerAuthenticator::Authenticate(
    const grpc::ServerContextBase& ctx) const {
  const std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
  if (auth == nullptr || !auth->IsPeerAuthenticated()) {
    return absl::UnauthenticatedError(
        "this hsdpd cluster requires mutual TLS: the caller presented no verified certificate");
  }
  if (token_.empty()) return PeerCred{};
  return TokenAuthenticator(token_).Authenticate(ctx);
}

absl::StatusOr<std::string> ReadPemFile(const std::string& key, const std::string& path) {
  constexpr size_t kMaxPemBytes = 1 << 20;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string what =
        absl::StrCat("cannot open ", key, " \"", path, "\": ", std::strerror(err));
    if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(what);
    return absl::NotFoundError(what);
  }
  std::string text;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
    if (text.size() > kMaxPemBytes) break;
  }
  ::close(fd);
  if (text.size() > kMaxPemBytes || text.find("-----BEGIN ") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(key, " \"", path, "\" is not a PEM file"));
  }
  return text;
}

absl::StatusOr<ClusterTlsFiles> ReadClusterTls(const std::string& ca, const std::string& cert,
                                               const std::string& key) {
  ClusterTlsFiles files;
  ASSIGN_OR_RETURN(files.ca, ReadPemFile("cluster.tls.ca", ca));
  ASSIGN_OR_RETURN(files.cert, ReadPemFile("cluster.tls.cert", cert));
  ASSIGN_OR_RETURN(files.key, ReadPemFile("cluster.tls.key", key));
  return files;
}

absl::StatusOr<PeerCred> TokenAuthenticator::Authenticate(
    const grpc::ServerContextBase& ctx) const {
  const auto& metadata = ctx.client_metadata();
  const auto it = metadata.find(kClusterTokenMetadata);
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "this hsdpd cluster requires a token: the call carried no ", kClusterTokenMetadata,
        " (set cluster.token_file to the cluster's shared secret)"));
  }
  if (!ConstantTimeEquals(std::string_view(it->second.data(), it->second.size()), token_)) {
    return absl::PermissionDeniedError(
        "wrong cluster token: cluster.token_file differs from the coordinator's");
  }
  return PeerCred{};
}

}  // namespace hsdp
