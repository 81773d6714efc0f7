// Where the etcd membership keeps what, under the cluster's prefix P
// (cluster.etcd.prefix); etcd_member.h says what each key holds and who
// watches it. One definition for the member, its sweeper and its join.
//
// Layout 2 (m/config says "layout=2"): members watch P w/ only (news,
// group events, the sweeper's key), which changes on losses, restarts and
// rejoins, never on a first join; node keys are under P n/, watched by the
// sweeper alone.
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
  static constexpr int kLayout = 2;

  explicit EtcdKeys(std::string prefix) : prefix_(std::move(prefix)) {}

  // P m/: read at a join, watched by nobody.
  std::string Config() const { return prefix_ + "m/config"; }
  std::string Epoch() const { return prefix_ + "m/epoch"; }
  // P n/<r>: node r's entry, under its lease (the sweeper watches P n/).
  std::string Nodes() const { return prefix_ + "n/"; }
  std::string Node(int rank) const { return Nodes() + Rank(rank); }
  // P h/ranks/<r>: who last held rank r (address and instance; no lease).
  std::string Ranks() const { return prefix_ + "h/ranks/"; }
  std::string RankOf(int rank) const { return Ranks() + Rank(rank); }
  // P h/addr/<address>: the rank an address last held (a hint, confirmed
  // against P h/ranks/<r>).
  std::string AddressOf(const std::string& address) const {
    return prefix_ + "h/addr/" + address;
  }
  // P w/: what every member watches.
  std::string Watched() const { return prefix_ + "w/"; }
  std::string News() const { return Watched() + "news/"; }
  std::string NewsOf(int rank) const { return News() + Rank(rank); }
  std::string Events() const { return Watched() + "events/"; }
  std::string EventsOf(int rank) const { return Events() + Rank(rank); }
  std::string Sweeper() const { return Watched() + "sweeper"; }

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
