// The coordinator's epoch steps: joins batched into one step, answers built
// from the published snapshot, and the delta contract — a member holding the
// list of any published epoch gets, from a heartbeat naming it, every entry
// that changed after it (checked over a random history on a FakeClock).
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "daemon/cluster/coordinator.h"
#include "daemon/cluster/member_view.h"
#include "daemon/util/clock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

constexpr uint32_t kNodes = 64;
constexpr int64_t kMs = 1'000'000;

v1::JoinRequest Req(const std::string& address, const std::string& instance,
                    bool list_optional = false) {
  v1::JoinRequest r;
  r.set_address(address);
  r.set_data_address("127.0.0.1");
  r.set_name(address);
  r.set_instance(instance);
  r.set_requested_rank(-1);
  r.set_nodes(kNodes);
  r.set_list_optional(list_optional);
  return r;
}

// Deltas in pages of at most 4 entries (whole epochs), so the histories
// below page.
constexpr size_t kPage = 4;

Coordinator::Options Opts(const Clock* clock) {
  return {.self_address = "c:0", .nodes = kNodes, .heartbeat_ms = 100, .missed_heartbeats = 3,
          .clock = clock, .max_nodes_per_heartbeat = kPage};
}

absl::StatusOr<v1::HeartbeatResponse> Beat(Coordinator& c, int rank, const std::string& instance,
                                           uint64_t nodes_epoch, bool news_only = false) {
  v1::HeartbeatRequest h;
  h.set_node_rank(rank);
  h.set_instance(instance);
  h.set_nodes_epoch(nodes_epoch);
  h.set_news_only(news_only);
  return c.Heartbeat(h);
}

// The ranks `view` (rank 0's) reports lost while it follows the heartbeat
// deltas from epoch `from` to `to`, every change or news only.
std::set<int> LostFollowing(Coordinator& c, MemberView& view, uint64_t from, uint64_t to,
                            bool news_only) {
  std::set<int> lost;
  for (uint64_t at = from; at < to;) {
    auto d = Beat(c, 0, "i0", at, news_only);
    if (!d.ok() || d->epoch() <= at) {
      ADD_FAILURE() << "no progress from epoch " << at << ": " << d.status();
      break;
    }
    for (const PeerEvent& e : view.Apply(d->epoch(), d->nodes(), true, 0, absl::Now())) {
      if (e.kind == PeerEvent::Kind::kLost) lost.insert(e.node);
    }
    at = d->epoch();
  }
  return lost;
}

// A list without ages: rank -> (address, state, instance).
using List = std::map<int, std::tuple<std::string, std::string, std::string>>;

void MergeInto(const google::protobuf::RepeatedPtrField<v1::ClusterNode>& nodes, List* list) {
  for (const v1::ClusterNode& n : nodes) {
    (*list)[n.node_rank()] = {n.address(), n.state(), n.instance()};
  }
}

TEST(CoordinatorEpochTest, ManyJoinsInOneStepMoveTheEpochOnce) {
  FakeClock clock;
  Coordinator c(Opts(&clock));
  auto zero = c.Join(Req("c:0", "i0"));
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_EQ(zero->epoch(), 1u);
  std::vector<int> ranks;
  for (int i = 1; i <= 50; ++i) {
    auto r = c.Join(Req(absl::StrCat("n:", i), absl::StrCat("i", i)));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->epoch(), 1u);
    EXPECT_EQ(r->node_rank(), i);  // its rank at once
    ranks.push_back(r->node_rank());
    // Live at once: its heartbeats are taken before the step.
    ASSERT_TRUE(Beat(c, i, absl::StrCat("i", i), r->epoch()).ok());
  }
  EXPECT_EQ(c.epoch(), 1u);
  c.Step();
  EXPECT_EQ(c.epoch(), 2u);
  c.Step();  // nothing pending: no step
  EXPECT_EQ(c.epoch(), 2u);
  auto h = Beat(c, 0, "i0", 1);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->nodes_delta());
  ASSERT_EQ(h->nodes_size(), 50);  // one epoch: whole, though above the page size
  for (int i = 0; i < 50; ++i) EXPECT_EQ(h->nodes(i).node_rank(), ranks[i]);
  EXPECT_EQ(h->epoch(), 2u);
}

// A member whose backlog spans several epochs gets it in pages of whole
// epochs, each answer naming the epoch it brings the member to.
TEST(CoordinatorEpochTest, ABacklogComesInPagesOfWholeEpochs) {
  FakeClock clock;
  Coordinator c(Opts(&clock));
  ASSERT_TRUE(c.Join(Req("c:0", "i0")).ok());
  for (int step = 0; step < 5; ++step) {  // 5 epochs of 3 joins each
    for (int k = 0; k < 3; ++k) {
      ASSERT_TRUE(c.Join(Req(absl::StrCat("n:", step * 3 + k + 1), "x")).ok());
    }
    c.Step();
  }
  ASSERT_EQ(c.epoch(), 6u);
  uint64_t at = 1;
  std::vector<int> sizes;
  while (at < c.epoch()) {
    auto h = Beat(c, 0, "i0", at);
    ASSERT_TRUE(h.ok());
    ASSERT_GT(h->epoch(), at);
    sizes.push_back(h->nodes_size());
    at = h->epoch();
  }
  EXPECT_EQ(sizes, (std::vector<int>{3, 3, 3, 3, 3}));  // 6 would exceed 4
}

TEST(CoordinatorEpochTest, JoinCarriesTheWholeListUnlessTheCallerMakesItOptional) {
  FakeClock clock;
  Coordinator c(Opts(&clock));
  ASSERT_TRUE(c.Join(Req("c:0", "i0")).ok());
  for (int i = 1; i <= 5; ++i) ASSERT_TRUE(c.Join(Req(absl::StrCat("n:", i), "x")).ok());
  c.Step();
  // An old-style join (no list_optional): the published list and its own entry.
  auto old_style = c.Join(Req("n:6", "x"));
  ASSERT_TRUE(old_style.ok());
  ASSERT_EQ(old_style->nodes_size(), 7);
  for (int i = 0; i < 7; ++i) EXPECT_EQ(old_style->nodes(i).node_rank(), i);
  EXPECT_EQ(old_style->nodes(6).state(), "alive");
  // list_optional: its own entry only.
  auto light = c.Join(Req("n:7", "x", /*list_optional=*/true));
  ASSERT_TRUE(light.ok());
  ASSERT_EQ(light->nodes_size(), 1);
  EXPECT_EQ(light->nodes(0).node_rank(), 7);
  EXPECT_EQ(light->epoch(), old_style->epoch());
  // A heartbeat naming no epoch (an old member) gets the whole published list.
  c.Step();
  auto h = Beat(c, 0, "i0", 0);
  ASSERT_TRUE(h.ok());
  EXPECT_FALSE(h->nodes_delta());
  EXPECT_EQ(h->nodes_size(), 8);
}

// news_only: first joins are left out; losses, restarts and rejoins (with
// the instance they replaced) come; List has every node.
TEST(CoordinatorEpochTest, NewsOnlyDeltasLeaveOutFirstJoinsAndListHasEveryNode) {
  FakeClock clock;
  Coordinator c(Opts(&clock));
  auto zero = c.Join(Req("c:0", "i0", /*list_optional=*/true));
  ASSERT_TRUE(zero.ok());
  const uint64_t base = zero->epoch();
  for (int i = 1; i <= 6; ++i) {
    ASSERT_TRUE(c.Join(Req(absl::StrCat("n:", i), absl::StrCat("a", i))).ok());
  }
  c.Step();
  // A join storm: nothing is news, in one step's answer or in pages.
  auto h = Beat(c, 0, "i0", base, /*news_only=*/true);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->nodes_delta());
  EXPECT_EQ(h->nodes_size(), 0);
  EXPECT_EQ(h->epoch(), c.epoch());
  // Without news_only the same heartbeat carries the six joins.
  EXPECT_EQ(Beat(c, 0, "i0", base)->nodes_size(), 6);
  const uint64_t e1 = c.epoch();
  // Node 2 restarts (same address, new instance); node 3 falls silent and
  // is lost; node 7 joins for the first time.
  ASSERT_TRUE(c.Join(Req("n:2", "b2")).ok());
  ASSERT_TRUE(c.Join(Req("n:7", "a7")).ok());
  c.Step();
  clock.Advance(250 * kMs);
  for (int r : {0, 1, 2, 4, 5, 6, 7}) {
    const std::string inst = r == 0 ? "i0" : r == 2 ? "b2" : absl::StrCat("a", r);
    ASSERT_TRUE(Beat(c, r, inst, 0).ok());
  }
  clock.Advance(100 * kMs);
  c.CheckLiveness();
  h = Beat(c, 0, "i0", e1, /*news_only=*/true);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->nodes_size(), 2);
  EXPECT_EQ(h->nodes(0).node_rank(), 2);
  EXPECT_EQ(h->nodes(0).instance(), "b2");
  EXPECT_EQ(h->nodes(0).previous_instance(), "a2");
  EXPECT_EQ(h->nodes(1).node_rank(), 3);
  EXPECT_EQ(h->nodes(1).state(), "lost");
  // Node 3 comes back (same instance): the rejoin is news, naming the
  // instance it replaced (itself).
  ASSERT_TRUE(c.Join(Req("n:3", "a3")).ok());
  c.Step();
  const uint64_t e2 = h->epoch();
  h = Beat(c, 0, "i0", e2, /*news_only=*/true);
  ASSERT_TRUE(h.ok());
  ASSERT_EQ(h->nodes_size(), 1);
  EXPECT_EQ(h->nodes(0).node_rank(), 3);
  EXPECT_EQ(h->nodes(0).state(), "alive");
  EXPECT_EQ(h->nodes(0).previous_instance(), "a3");
  // List: every node, at the published epoch.
  const v1::ListResponse list = c.List();
  EXPECT_EQ(list.epoch(), c.epoch());
  ASSERT_EQ(list.nodes_size(), 8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(list.nodes(i).node_rank(), i);
    EXPECT_EQ(list.nodes(i).state(), "alive");
  }
}

// A random history of joins, restarts (new instances), silences that become
// losses, and steps. After every step, for every epoch E published before:
// the list of E merged with the delta a heartbeat naming E gets equals the
// whole list now, and the delta holds only entries that changed after E. A
// joining node's list merged with the deltas after its answer's epoch equals
// the whole list too.
TEST(CoordinatorEpochTest, EveryMemberEpochGetsEveryLaterChange) {
  FakeClock clock;
  Coordinator c(Opts(&clock));
  std::mt19937 rng(41);
  ASSERT_TRUE(c.Join(Req("c:0", "i0")).ok());
  std::map<uint64_t, List> history;  // the whole list at each published epoch
  auto whole = [&] {
    auto h = Beat(c, 0, "i0", 0);
    EXPECT_TRUE(h.ok()) << h.status();
    List l;
    if (h.ok()) MergeInto(h->nodes(), &l);
    return l;
  };
  history[c.epoch()] = whole();
  struct Joiner {
    uint64_t epoch;
    List list;
  };
  std::vector<Joiner> joiners;
  std::map<int, std::string> talking;  // rank -> instance of nodes that heartbeat
  talking[0] = "i0";
  int addresses = 0, instances = 0;
  for (int round = 0; round < 300; ++round) {
    const int action = static_cast<int>(rng() % 10);
    if (action < 4) {
      // A join: a new address, or an old one as a new instance.
      const int a = (action == 0 && addresses > 0) ? static_cast<int>(rng() % addresses) + 1
                                                    : ++addresses;
      if (a >= static_cast<int>(kNodes)) continue;
      const std::string inst = absl::StrCat("j", ++instances);
      auto r = c.Join(Req(absl::StrCat("n:", a), inst));
      if (!r.ok()) continue;  // full
      List l;
      MergeInto(r->nodes(), &l);
      joiners.push_back({r->epoch(), l});
      talking[r->node_rank()] = inst;
    } else if (action < 6 && talking.size() > 1) {
      // A node falls silent (never rank 0, the observer).
      auto it = std::next(talking.begin(), 1 + rng() % (talking.size() - 1));
      talking.erase(it);
    } else if (action < 8) {
      clock.Advance(static_cast<int64_t>(rng() % 200) * kMs);
      c.CheckLiveness();  // losses step at once
    } else {
      c.Step();
    }
    for (const auto& [rank, inst] : talking) (void)Beat(c, rank, inst, 0);
    const uint64_t now = c.epoch();
    if (history.count(now) != 0) continue;
    const List current = whole();
    history[now] = current;
    for (const auto& [e, list] : history) {
      // The member asks from each answer's epoch until it is current.
      List merged = list;
      google::protobuf::RepeatedPtrField<v1::ClusterNode> sent;
      for (uint64_t at = e;;) {
        auto d = Beat(c, 0, "i0", at);
        ASSERT_TRUE(d.ok());
        ASSERT_TRUE(d->nodes_delta());
        MergeInto(d->nodes(), &merged);
        sent.MergeFrom(d->nodes());
        if (d->epoch() == now) break;
        ASSERT_GT(d->epoch(), at) << "no progress from " << at;
        at = d->epoch();
      }
      ASSERT_EQ(merged, current) << "member at epoch " << e << ", now " << now;
      // A sparse view from E (no list; news only) reports every loss a whole
      // view from E reports, and a loss only of a rank that changed.
      MemberView whole_view(kNodes), sparse_view(kNodes, "silent", MemberView::Kind::kSparse);
      google::protobuf::RepeatedPtrField<v1::ClusterNode> e_list;
      for (const auto& [rank, entry] : list) {
        v1::ClusterNode* n = e_list.Add();
        n->set_node_rank(rank);
        n->set_address(std::get<0>(entry));
        n->set_state(std::get<1>(entry));
        n->set_instance(std::get<2>(entry));
      }
      whole_view.Apply(e, e_list, /*delta=*/false, 0, absl::Now());
      sparse_view.Apply(e, {}, /*delta=*/false, 0, absl::Now());
      const std::set<int> whole_lost = LostFollowing(c, whole_view, e, now, false);
      const std::set<int> sparse_lost = LostFollowing(c, sparse_view, e, now, true);
      for (int rank : whole_lost) {
        EXPECT_TRUE(sparse_lost.contains(rank))
            << "rank " << rank << " lost after epoch " << e << " unheard by a sparse view";
      }
      for (int rank : sparse_lost) {
        auto was = list.find(rank);
        EXPECT_TRUE(was == list.end() || was->second != current.at(rank))
            << "a sparse view reports unchanged rank " << rank << " lost";
      }
      for (const v1::ClusterNode& n : sent) {
        // Only what changed: the entry differs from E's, or E had none.
        auto was = list.find(n.node_rank());
        if (e != now && was != list.end()) {
          // (Every join here is a new instance, so a change never restores
          // an earlier entry.)
          const bool same = was->second == std::make_tuple(n.address(), n.state(), n.instance());
          EXPECT_FALSE(same) << "rank " << n.node_rank() << " sent unchanged after " << e;
        }
      }
    }
    for (const Joiner& j : joiners) {
      List merged = j.list;
      for (uint64_t at = j.epoch;;) {
        auto d = Beat(c, 0, "i0", at);
        ASSERT_TRUE(d.ok());
        MergeInto(d->nodes(), &merged);
        if (d->epoch() == now) break;
        ASSERT_GT(d->epoch(), at);
        at = d->epoch();
      }
      ASSERT_EQ(merged, current) << "joiner at epoch " << j.epoch << ", now " << now;
    }
  }
  EXPECT_GT(history.size(), 20u);
  EXPECT_GT(joiners.size(), 20u);
}

}  // namespace
}  // namespace hsdp
