#include "daemon/auth/authenticator.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace hsdp {

absl::StatusOr<PeerCred> UnixPeerAuthenticator::Authenticate(
    const grpc::ServerContextBase& ctx) const {
  std::optional<PeerCred> cred = peers_->Lookup(ctx.peer());
  if (!cred.has_value()) {
    return absl::PermissionDeniedError("cannot identify the caller (SO_PEERCRED unavailable)");
  }
  if (!peers_->Allowed(cred->uid)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "uid ", cred->uid, " is not allowed to use this hsdpd (see node.allowed_uids)"));
  }
  return *cred;
}

bool UnixPeerAuthenticator::IsAdmin(uint32_t uid) const { return uid == 0 || uid == ::getuid(); }

}  // namespace hsdp
