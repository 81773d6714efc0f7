// The argument rules every node transport applies (node_transport.h), and
// the fake transport applying them: a fake that accepted what the Gloo link
// refuses would hide the bug from every engine test that runs on it.
#include "daemon/engine/crossnode/node_transport.h"

#include <future>
#include <string>
#include <vector>

#include "daemon/engine/crossnode/fake_transport.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

TEST(NodeTransportRulesTest, LinkSelfIndexNeedsTwoAscendingDistinctNodesWithThisOne) {
  EXPECT_EQ(*LinkSelfIndex({1, 4, 9}, 4), 1);
  EXPECT_EQ(*LinkSelfIndex({0, 1}, 0), 0);
  for (const auto& [nodes, self] : std::vector<std::pair<std::vector<int>, int>>{
           {{3}, 3}, {{}, 0}, {{4, 1}, 1}, {{1, 1, 2}, 1}, {{1, 2}, 3}}) {
    absl::StatusOr<int> s = LinkSelfIndex(nodes, self);
    ASSERT_FALSE(s.ok()) << nodes.size() << " " << self;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("for node " + std::to_string(self)), std::string::npos)
        << s.status();
  }
}

TEST(NodeTransportRulesTest, CheckExchangeRefusesBadPeersAndRepeatedParts) {
  char buf[8] = {};
  EXPECT_TRUE(CheckExchange({{0, buf, 8, 0}, {2, buf, 8, 0}, {2, buf, 8, 1}},
                            {{0, buf, 8, 0}, {2, buf, 8, 0}}, 3, 1)
                  .ok());
  struct Case {
    std::vector<SendRange> sends;
    std::vector<RecvRange> recvs;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {{{1, buf, 8, 0}}, {}, "send to link peer 1"},      // self
           {{{3, buf, 8, 0}}, {}, "send to link peer 3"},      // past the end
           {{{-1, buf, 8, 0}}, {}, "send to link peer -1"},    // negative
           {{}, {{5, buf, 8, 0}}, "receive from link peer 5"},
           {{{0, buf, 8, 7}, {0, buf, 4, 7}}, {}, "two messages send to link peer 0 with part 7"},
           {{}, {{2, buf, 8, 1}, {2, buf, 8, 1}}, "two messages receive from link peer 2"},
       }) {
    absl::Status s = CheckExchange(c.sends, c.recvs, 3, 1);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
  }
}

TEST(NodeTransportRulesTest, TheFakeLinkRefusesARepeatedPartAndBreaks) {
  FakeNetwork net;
  auto t0 = net.MakeTransport(0);
  auto t1 = net.MakeTransport(1);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  auto other = std::async(std::launch::async,
                          [&] { return t1->Connect("g", 1, {0, 1}, 1, deadline); });
  auto link0 = t0->Connect("g", 1, {0, 1}, 0, deadline);
  auto link1 = other.get();
  ASSERT_TRUE(link0.ok()) << link0.status();
  ASSERT_TRUE(link1.ok()) << link1.status();
  EXPECT_EQ((*link0)->self(), 0);
  EXPECT_EQ((*link1)->self(), 1);
  char a[4] = {}, b[4] = {};
  absl::Status s = (*link0)->Exchange({{1, a, 4, 2}, {1, b, 4, 2}}, {}, 7, deadline);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("with part 2"), std::string::npos) << s;
  // After any error the link is broken: the next call fails the same way.
  EXPECT_EQ((*link0)->Exchange({}, {}, 8, deadline), s);
  // A node list the rules refuse never reaches the fake's rendezvous.
  auto bad = t0->Connect("h", 1, {1, 0}, 0, deadline);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace hsdp
