#include "daemon/dataplane/agreement.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "hsdp/shm/op_rules.h"

namespace hsdp {
namespace {

// Bit for bit: a NaN factor agrees with the same NaN, and -0.0 is not 0.0.
bool SameDouble(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

}  // namespace

std::string MembersDisagree(const std::map<int, Arrival>& arrivals,
                            const std::vector<int>& local_ranks, const std::vector<int>& ranks) {
  if (arrivals.empty()) return "";
  const Arrival& ref = arrivals.begin()->second;
  const int ref_rank = ranks[local_ranks[arrivals.begin()->first]];
  std::vector<std::string> problems;
  auto check = [&](const char* field, auto get, auto show) {
    for (const auto& [li, a] : arrivals) {
      if (!(get(a) == get(ref))) {
        problems.push_back(absl::StrCat(field, ": rank ", ref_rank, " has ", show(ref), ", rank ",
                                        ranks[local_ranks[li]], " has ", show(a)));
        return;
      }
    }
  };
  auto op_name = [](const Arrival& a) {
    return std::string(CollectiveName(static_cast<Collective>(a.desc.collective)));
  };
  check(
      "collective", [](const Arrival& a) { return a.desc.collective; }, op_name);
  check(
      "count", [](const Arrival& a) { return a.desc.count; },
      [](const Arrival& a) { return absl::StrCat(a.desc.count); });
  check(
      "dtype", [](const Arrival& a) { return a.desc.dtype; },
      [](const Arrival& a) {
        return std::string(DataTypeName(static_cast<DataType>(a.desc.dtype)));
      });
  // One engine runs an operation: every member's buffers are host memory, or
  // every member's are device memory.
  check(
      "memory", [](const Arrival& a) { return a.kind; },
      [](const Arrival& a) {
        return std::string(a.kind == MemoryKind::kDevice ? "device buffers" : "host buffers");
      });
  const Collective c = static_cast<Collective>(ref.desc.collective);
  if (shm::IsReducing(c)) {
    check(
        "reduce_op", [](const Arrival& a) { return a.desc.reduce_op; },
        [](const Arrival& a) {
          return std::string(ReduceOpName(static_cast<ReduceOp>(a.desc.reduce_op)));
        });
    check(
        "reduce_dtype", [](const Arrival& a) { return a.desc.reduce_dtype; },
        [](const Arrival& a) {
          return a.desc.reduce_dtype == 0
                     ? std::string("(buffer dtype)")
                     : std::string(DataTypeName(static_cast<DataType>(a.desc.reduce_dtype)));
        });
    for (auto [field, member] : {std::pair{"premul_factor", &shm::OpDescriptor::premul_factor},
                                 std::pair{"pre_divide", &shm::OpDescriptor::pre_divide},
                                 std::pair{"post_divide", &shm::OpDescriptor::post_divide}}) {
      for (const auto& [li, a] : arrivals) {
        if (!SameDouble(a.desc.*member, ref.desc.*member)) {
          problems.push_back(absl::StrCat(field, ": rank ", ref_rank, " has ", ref.desc.*member,
                                          ", rank ", ranks[local_ranks[li]], " has ",
                                          a.desc.*member));
          break;
        }
      }
    }
  }
  if (c == Collective::kBroadcast) {
    check(
        "root", [](const Arrival& a) { return a.desc.root; },
        [](const Arrival& a) { return absl::StrCat(a.desc.root); });
  }
  if (c == Collective::kAllToAll) {
    check(
        "splits", [](const Arrival& a) { return a.send_counts.empty(); },
        [](const Arrival& a) { return a.send_counts.empty() ? "equal blocks" : "splits"; });
    // What i sends to j must be what j expects from i (local pairs; remote
    // members are checked by their own daemons).
    if (problems.empty() && !ref.send_counts.empty()) {
      for (const auto& [li, a] : arrivals) {
        const int i = local_ranks[li];
        for (const auto& [lj, b] : arrivals) {
          const int j = local_ranks[lj];
          if (a.send_counts[j] != b.recv_counts[i]) {
            problems.push_back(absl::StrCat("splits: rank ", ranks[i], " sends ",
                                            a.send_counts[j], " elements to rank ", ranks[j],
                                            ", which expects ", b.recv_counts[i]));
            break;
          }
        }
        if (!problems.empty()) break;
      }
    }
  }
  if (ref.phase2) {
    check(
        "shard group size", [](const Arrival& a) { return a.shard_size; },
        [](const Arrival& a) { return absl::StrCat(a.shard_size); });
  }
  if (problems.empty()) return "";
  return absl::StrCat("members disagree: ", absl::StrJoin(problems, "; "));
}

}  // namespace hsdp
