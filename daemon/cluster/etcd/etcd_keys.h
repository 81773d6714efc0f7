// Where the etcd membership keeps what, under the cluster's prefix P
// (cluster.etcd.prefix); etcd_member.h says what each key holds. One
// definition for the member, its watch and its join.
#ifndef HSDP_DAEMON_CLUSTER_ETCD_ETCD_KEYS_H_
#define HSDP_DAEMON_CLUSTER_ETCD_ETCD_KEYS_H_

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace hsdp::etcd {

class EtcdKeys {
 public:
  static constexpr int kRankDigits = 5;  // ranks < 100,000, in key order

  explicit EtcdKeys(std::string prefix) : prefix_(std::move(prefix)) {}

  // P m/<suffix>: what members watch or read.
  std::string Member(const std::string& suffix) const { return prefix_ + "m/" + suffix; }
  std::string Config() const { return Member("config"); }
  std::string Epoch() const { return Member("epoch"); }
  std::string Nodes() const { return Member("nodes/"); }
  std::string Node(int rank) const { return Nodes() + Rank(rank); }
  std::string Events() const { return Member("events/"); }
  std::string EventsOf(int rank) const { return Events() + Rank(rank); }
  // P h/ranks/<r>: the address that last held rank r.
  std::string Ranks() const { return prefix_ + "h/ranks/"; }
  std::string RankOf(int rank) const { return Ranks() + Rank(rank); }

  // The rank a key under `dir` (one of the above) names; -1 when it names
  // none.
  static int RankIn(const std::string& key, const std::string& dir) {
    int rank = -1;
    if (!absl::StartsWith(key, dir) || !absl::SimpleAtoi(key.substr(dir.size()), &rank)) return -1;
    return rank;
  }

  const std::string& prefix() const { return prefix_; }

 private:
  static std::string Rank(int rank) { return absl::StrFormat("%0*d", kRankDigits, rank); }
  const std::string prefix_;
};

}  // namespace hsdp::etcd

#endif  // HSDP_DAEMON_CLUSTER_ETCD_ETCD_KEYS_H_
