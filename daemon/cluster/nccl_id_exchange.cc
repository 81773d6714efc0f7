#include "daemon/cluster/nccl_id_exchange.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/cluster/cluster_store.h"
#include "daemon/cluster/kv_cluster_directory.h"
#include "hsdp/common/logging.h"

namespace hsdp {
namespace {

absl::Duration Left(absl::Time deadline) {
  return std::max(absl::ZeroDuration(), deadline - absl::Now());
}

}  // namespace

std::string NcclIdKey(const std::string& key) {
  const size_t epoch = key.rfind('#');  // "<group key>#<epoch>": keep the epoch readable
  const std::string tail = epoch == std::string::npos ? "" : key.substr(epoch);
  return ShortenedKey(absl::StrCat("hsdp/nccl/", key.substr(0, key.size() - tail.size())), tail);
}

decltype(nccl::NcclEngineOptions::exchange_id) MakeNcclIdExchange(ClusterStore* coordinator) {
  return [coordinator](const std::string& key, bool creator, const nccl::UniqueId& mine, int nodes,
                       absl::Time deadline) -> absl::StatusOr<nccl::UniqueId> {
    const std::string k = NcclIdKey(key);
    absl::StatusOr<std::string> value;
    if (creator) {
      value = coordinator->SetIfAbsent(
          k, std::string(reinterpret_cast<const char*>(mine.bytes.data()), mine.bytes.size()),
          Left(deadline));
    } else {
      absl::StatusOr<std::vector<std::string>> values =
          coordinator->WaitValues({k}, Left(deadline));
      if (values.ok()) {
        value = values->empty() ? std::string() : (*values)[0];
      } else {
        value = values.status();
      }
    }
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat("the NCCL unique id of ", key, " through ",
                                       coordinator->name(), ": ", value.status().message()));
    }
    nccl::UniqueId id;
    if (value->size() != id.bytes.size()) {
      return absl::InternalError(absl::StrCat(
          coordinator->name(), " holds a NCCL unique id of ",
          value->size(), " bytes for ", key, " (", id.bytes.size(), " expected)"));
    }
    std::memcpy(id.bytes.data(), value->data(), id.bytes.size());
    // The last daemon to read it removes it (best effort: a failure only
    // leaves a key behind).
    absl::StatusOr<int64_t> read = coordinator->Add(k + "/read", 1, Left(deadline));
    if (read.ok() && *read >= nodes) {
      if (absl::Status s = coordinator->Delete({k, k + "/read"}, absl::Seconds(2)); !s.ok()) {
        HSDP_LOG(Warning) << "cluster: could not delete " << k << ": " << s.message();
      }
    }
    return id;
  };
}

}  // namespace hsdp
