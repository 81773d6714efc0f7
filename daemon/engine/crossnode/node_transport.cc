#include "daemon/engine/crossnode/node_transport.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace hsdp {
namespace {

template <typename Range>
absl::Status CheckMessages(const std::vector<Range>& messages, int link_size, int self,
                           const char* what) {
  std::set<std::pair<int, uint32_t>> seen;
  for (const Range& m : messages) {
    if (m.peer < 0 || m.peer >= link_size || m.peer == self) {
      return absl::InvalidArgumentError(absl::StrCat(what, " link peer ", m.peer, " (link of ",
                                                     link_size, ", self ", self, ")"));
    }
    if (!seen.emplace(m.peer, m.part).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("two messages ", what, " link peer ", m.peer, " with part ", m.part));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> LinkSelfIndex(const std::vector<int>& nodes, int this_node) {
  if (nodes.size() < 2 || !std::is_sorted(nodes.begin(), nodes.end()) ||
      std::adjacent_find(nodes.begin(), nodes.end()) != nodes.end() ||
      !std::binary_search(nodes.begin(), nodes.end(), this_node)) {
    return absl::InvalidArgumentError(
        absl::StrCat("nodes [", absl::StrJoin(nodes, ", "), "] for node ", this_node));
  }
  return static_cast<int>(std::lower_bound(nodes.begin(), nodes.end(), this_node) -
                          nodes.begin());
}

absl::Status CheckExchange(const std::vector<SendRange>& sends, const std::vector<RecvRange>& recvs,
                           int link_size, int self) {
  if (absl::Status s = CheckMessages(sends, link_size, self, "send to"); !s.ok()) return s;
  return CheckMessages(recvs, link_size, self, "receive from");
}

}  // namespace hsdp
