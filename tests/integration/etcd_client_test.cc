// The etcd client (daemon/cluster/etcd/etcd_client.h) against real etcd
// clusters on loopback (tests/integration/etcd_test_cluster.h): keys,
// ranges, transactions, leases, watches, compaction, failover when a member
// dies, quorum loss and recovery, authentication, bad endpoints.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "daemon/cluster/etcd/etcd_client.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "etcd_test_cluster.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace hsdp::etcd {
namespace {

using ::hsdp::testing::Eventually;
using ::hsdp::testing::EtcdTestCluster;

constexpr absl::Duration kTimeout = absl::Seconds(5);

// `keepalives_on_leader`: EtcdOptions' own; false keeps keep-alive streams
// where calls go (the tests of a stream on a given member).
std::unique_ptr<EtcdClient> MustConnect(const std::vector<std::string>& endpoints,
                                        bool keepalives_on_leader = true) {
  EtcdOptions options;
  options.endpoints = endpoints;
  options.random_first_endpoint = false;  // the failover tests know where calls go first
  options.keepalives_on_leader = keepalives_on_leader;
  auto client = EtcdClient::Connect(options, kTimeout);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

// Collects watch events until `n` arrived or `timeout` passed.
absl::Status CollectEvents(Watch* watch, size_t n, absl::Duration timeout,
                           std::vector<WatchEvent>* events) {
  const absl::Time deadline = absl::Now() + timeout;
  while (events->size() < n && absl::Now() < deadline) {
    absl::Status s = watch->Next(events, deadline);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

// etcd's own count of LeaseKeepAlive streams started on member i (its
// Prometheus /metrics on the client port, plain HTTP on loopback); -1 when
// it cannot be read.
double KeepAliveStreamsStartedOn(const EtcdTestCluster& cluster, int i) {
  double total = 0;
  {
    const std::string ep = cluster.endpoint(i);
    int port = 0;
    if (!absl::SimpleAtoi(ep.substr(ep.rfind(':') + 1), &port)) return -1;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string resp;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
      const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
      if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
        char buf[65536];
        ssize_t n;
        while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) resp.append(buf, static_cast<size_t>(n));
      }
    }
    ::close(fd);
    bool found = false;
    for (absl::string_view line : absl::StrSplit(resp, '\n')) {
      if (!absl::StartsWith(line, "grpc_server_started_total{") ||
          !absl::StrContains(line, "grpc_method=\"LeaseKeepAlive\"")) {
        continue;
      }
      double v = 0;
      if (!absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return -1;
      total += v;
      found = true;
    }
    if (!found && resp.find("grpc_server_started_total") == std::string::npos) return -1;
  }
  return total;
}

// The same over members 0..members-1.
double KeepAliveStreamsStarted(const EtcdTestCluster& cluster, int members) {
  double total = 0;
  for (int i = 0; i < members; ++i) {
    const double on = KeepAliveStreamsStartedOn(cluster, i);
    if (on < 0) return -1;
    total += on;
  }
  return total;
}

// ---------------------------------------------------------------------------
// Without etcd.

TEST(EtcdPrefixEnd, Cases) {
  EXPECT_EQ(PrefixEnd("a"), "b");
  EXPECT_EQ(PrefixEnd("abc"), "abd");
  EXPECT_EQ(PrefixEnd("hsdp/"), "hsdp0");
  EXPECT_EQ(PrefixEnd(std::string("a\xff", 2)), "b");
  EXPECT_EQ(PrefixEnd(std::string("a\xfe", 2)), std::string("a\xff", 2));
  EXPECT_EQ(PrefixEnd(std::string("ab\xff\xff", 4)), "ac");
  EXPECT_EQ(PrefixEnd(""), std::string(1, '\0'));
  EXPECT_EQ(PrefixEnd(std::string("\xff\xff", 2)), std::string(1, '\0'));
  EXPECT_EQ(PrefixEnd(std::string("\x00", 1)), std::string("\x01", 1));
}

TEST(EtcdConnect, MalformedEndpointsAreInvalidArgument) {
  const std::vector<std::vector<std::string>> bad = {
      {},
      {""},
      {"127.0.0.1"},
      {"127.0.0.1:"},
      {":2379"},
      {"127.0.0.1:0"},
      {"127.0.0.1:65536"},
      {"127.0.0.1:99999999"},
      {"127.0.0.1:12a"},
      {"127.0.0.1:-1"},
      {"http://127.0.0.1:2379"},
      {"::1:2379"},
      {"host name:2379"},
      {"127.0.0.1:2379", "oops"},
  };
  for (const auto& endpoints : bad) {
    EtcdOptions options;
    options.endpoints = endpoints;
    auto client = EtcdClient::Connect(options, absl::Seconds(1));
    ASSERT_FALSE(client.ok()) << "accepted [" << absl::StrJoin(endpoints, ",") << "]";
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << client.status();
    EXPECT_TRUE(absl::StrContains(client.status().message(), "etcd")) << client.status();
  }
  for (const char* good : {"127.0.0.1:1", "localhost:65535", "[::1]:2379", "etcd-0:2379"}) {
    EtcdOptions options;
    options.endpoints = {good};
    auto client = EtcdClient::Connect(options, absl::Seconds(1));
    EXPECT_TRUE(client.ok()) << good << ": " << client.status();
  }
}

TEST(EtcdConnect, UnreachableFailsWithinTimeoutNamingEtcd) {
  const std::string ep = hsdp::testing::EtcdLoopback(hsdp::testing::FreePort());
  auto client = MustConnect({ep});
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->name(), absl::StrCat("etcd (", ep, ")"));
  const absl::Time start = absl::Now();
  auto put = client->Put("k", "v", 0, absl::Seconds(2));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), absl::StatusCode::kUnavailable) << put.status();
  EXPECT_TRUE(absl::StartsWith(put.status().message(), client->name() + ": put \"k\": "))
      << put.status();
  auto watch = client->StartWatch("k", "", 0, absl::Seconds(1));
  ASSERT_FALSE(watch.ok());
  EXPECT_EQ(watch.status().code(), absl::StatusCode::kUnavailable) << watch.status();
}

// ---------------------------------------------------------------------------
// One 3-member cluster shared by the tests that do not kill members.

class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new EtcdTestCluster(3);
    start_status_ = new absl::Status(cluster_->Start());
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
    delete start_status_;
  }
  void SetUp() override {
    ASSERT_TRUE(start_status_->ok()) << *start_status_;
    client_ = MustConnect(cluster_->endpoints());
    ASSERT_NE(client_, nullptr);
    // Each test under its own prefix.
    prefix_ = absl::StrCat(::testing::UnitTest::GetInstance()->current_test_info()->name(), "/");
  }
  std::string Key(const std::string& k) const { return prefix_ + k; }

  static EtcdTestCluster* cluster_;
  static absl::Status* start_status_;
  std::unique_ptr<EtcdClient> client_;
  std::string prefix_;
};
EtcdTestCluster* EtcdClientTest::cluster_ = nullptr;
absl::Status* EtcdClientTest::start_status_ = nullptr;

TEST_F(EtcdClientTest, PutRangeDelete) {
  EXPECT_EQ(client_->name(), absl::StrCat("etcd (", absl::StrJoin(cluster_->endpoints(), ","), ")"));
  auto r1 = client_->Put(Key("a"), "one", 0, kTimeout);
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = client_->Put(Key("a"), std::string("two\0bytes", 9), 0, kTimeout);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_GT(*r2, *r1);

  auto got = client_->Range(Key("a"), "", kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->count, 1);
  EXPECT_GE(got->revision, *r2);
  EXPECT_EQ(got->kvs[0].key, Key("a"));
  EXPECT_EQ(got->kvs[0].value, std::string("two\0bytes", 9));
  EXPECT_EQ(got->kvs[0].create_revision, *r1);
  EXPECT_EQ(got->kvs[0].mod_revision, *r2);
  EXPECT_EQ(got->kvs[0].version, 2);
  EXPECT_EQ(got->kvs[0].lease, 0);

  auto missing = client_->Range(Key("missing"), "", kTimeout);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_TRUE(missing->kvs.empty());
  EXPECT_EQ(missing->count, 0);

  auto deleted = client_->Delete(Key("a"), "", kTimeout);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 1);
  deleted = client_->Delete(Key("a"), "", kTimeout);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 0);
  got = client_->Range(Key("a"), "", kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->kvs.empty());
}

TEST_F(EtcdClientTest, PrefixRangeLimitCountOnlyAndPrefixDelete) {
  for (const std::string k : {"p/3", "p/1", "p/2", "pq", "p", "o"}) {
    ASSERT_TRUE(client_->Put(Key(k), "v" + k, 0, kTimeout).ok());
  }
  const std::string p = Key("p/");
  auto all = client_->Range(p, PrefixEnd(p), kTimeout);
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->kvs.size(), 3u);
  EXPECT_EQ(all->count, 3);
  EXPECT_EQ(all->kvs[0].key, Key("p/1"));  // sorted by key
  EXPECT_EQ(all->kvs[1].key, Key("p/2"));
  EXPECT_EQ(all->kvs[2].key, Key("p/3"));
  EXPECT_EQ(all->kvs[2].value, "vp/3");

  auto limited = client_->Range(p, PrefixEnd(p), kTimeout, /*limit=*/2);
  ASSERT_TRUE(limited.ok()) << limited.status();
  EXPECT_EQ(limited->kvs.size(), 2u);
  EXPECT_EQ(limited->count, 3);

  auto counted = client_->Range(p, PrefixEnd(p), kTimeout, 0, /*count_only=*/true);
  ASSERT_TRUE(counted.ok()) << counted.status();
  EXPECT_TRUE(counted->kvs.empty());
  EXPECT_EQ(counted->count, 3);

  // The whole test prefix: p/1..3, pq, p, o.
  auto everything = client_->Range(prefix_, PrefixEnd(prefix_), kTimeout, 0, true);
  ASSERT_TRUE(everything.ok());
  EXPECT_EQ(everything->count, 6);

  auto deleted = client_->Delete(p, PrefixEnd(p), kTimeout);
  ASSERT_TRUE(deleted.ok()) << deleted.status();
  EXPECT_EQ(*deleted, 3);
  everything = client_->Range(prefix_, PrefixEnd(prefix_), kTimeout, 0, true);
  ASSERT_TRUE(everything.ok());
  EXPECT_EQ(everything->count, 3);
}

TEST_F(EtcdClientTest, TxnCompareAndPut) {
  const std::string k = Key("leader");
  // Create only when absent (create_revision == 0).
  const Compare absent{k, Compare::Target::kCreate, Compare::Result::kEqual, 0, ""};
  auto first = client_->Txn({absent}, {Op::Put(k, "node-1")}, {Op::Get(k)}, kTimeout);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->succeeded);
  ASSERT_EQ(first->ranges.size(), 1u);  // one entry per op
  EXPECT_TRUE(first->ranges[0].empty());  // a put reads nothing

  auto second = client_->Txn({absent}, {Op::Put(k, "node-2")}, {Op::Get(k), Op::Get(Key("none"))},
                             kTimeout);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->succeeded);
  ASSERT_EQ(second->ranges.size(), 2u);
  ASSERT_EQ(second->ranges[0].size(), 1u);
  EXPECT_EQ(second->ranges[0][0].value, "node-1");
  EXPECT_EQ(second->ranges[0][0].mod_revision, first->revision);
  EXPECT_TRUE(second->ranges[1].empty());
  EXPECT_EQ(second->revision, first->revision);  // nothing written

  // Value and mod-revision compares; a put, a range and a delete in one txn.
  const int64_t mod = second->ranges[0][0].mod_revision;
  ASSERT_TRUE(client_->Put(Key("other"), "x", 0, kTimeout).ok());
  auto third = client_->Txn(
      {Compare{k, Compare::Target::kValue, Compare::Result::kEqual, 0, "node-1"},
       Compare{k, Compare::Target::kMod, Compare::Result::kEqual, mod, ""},
       Compare{k, Compare::Target::kVersion, Compare::Result::kLess, 2, ""}},
      {Op::Put(k, "node-1b"), Op::Get(prefix_, PrefixEnd(prefix_)), Op::Delete(Key("other"))},
      {}, kTimeout);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(third->succeeded);
  EXPECT_GT(third->revision, mod);
  ASSERT_EQ(third->ranges.size(), 3u);
  ASSERT_EQ(third->ranges[1].size(), 2u);  // leader (already "node-1b") and other
  EXPECT_EQ(third->ranges[1][0].key, k);
  EXPECT_EQ(third->ranges[1][0].value, "node-1b");
  EXPECT_EQ(third->ranges[1][1].key, Key("other"));
  auto other = client_->Range(Key("other"), "", kTimeout);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(other->kvs.empty());

  // A stale compare fails; the failure branch ran.
  auto stale = client_->Txn({Compare{k, Compare::Target::kMod, Compare::Result::kEqual, mod, ""}},
                            {Op::Put(k, "lost")}, {Op::Get(k)}, kTimeout);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_FALSE(stale->succeeded);
  ASSERT_EQ(stale->ranges.size(), 1u);
  ASSERT_EQ(stale->ranges[0].size(), 1u);
  EXPECT_EQ(stale->ranges[0][0].value, "node-1b");
  EXPECT_NE(stale->ranges[0][0].value, "lost");
  // NOT_EQUAL and GREATER.
  auto ne = client_->Txn({Compare{k, Compare::Target::kValue, Compare::Result::kNotEqual, 0, "x"},
                          Compare{k, Compare::Target::kVersion, Compare::Result::kGreater, 1, ""},
                          Compare{k, Compare::Target::kLease, Compare::Result::kEqual, 0, ""}},
                         {}, {}, kTimeout);
  ASSERT_TRUE(ne.ok()) << ne.status();
  EXPECT_TRUE(ne->succeeded);
  EXPECT_TRUE(ne->ranges.empty());
}

TEST_F(EtcdClientTest, LeaseKeepAliveAndExpiry) {
  auto lease = client_->LeaseGrant(absl::Milliseconds(1500), kTimeout);  // rounded up: 2 s
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_NE(*lease, 0);
  const std::string k = Key("ephemeral");
  ASSERT_TRUE(client_->Put(k, "alive", *lease, kTimeout).ok());
  auto got = client_->Range(k, "", kTimeout);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].lease, *lease);

  // Kept alive for twice its TTL: the key stays.
  const absl::Time until = absl::Now() + absl::Seconds(4);
  while (absl::Now() < until) {
    auto ttl = client_->LeaseKeepAlive(*lease, kTimeout);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, absl::Seconds(2));
    absl::SleepFor(absl::Milliseconds(400));
  }
  got = client_->Range(k, "", kTimeout);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->kvs.size(), 1u) << "the key expired although its lease was kept alive";

  // Not kept alive: gone after its TTL (etcd checks expiry every 500 ms).
  const absl::Time stopped = absl::Now();
  EXPECT_TRUE(Eventually([&] {
    auto r = client_->Range(k, "", kTimeout);
    return r.ok() && r->kvs.empty();
  }, 10000, 50));
  EXPECT_GE(absl::Now() - stopped, absl::Seconds(1));
  auto ttl = client_->LeaseKeepAlive(*lease, kTimeout);
  ASSERT_FALSE(ttl.ok());
  EXPECT_EQ(ttl.status().code(), absl::StatusCode::kNotFound) << ttl.status();
  EXPECT_TRUE(absl::StartsWith(ttl.status().message(), client_->name())) << ttl.status();
}

TEST_F(EtcdClientTest, RenewalsShareOneKeepAliveStream) {
  // A first lease's renewals find the raft leader (the stream moves there
  // once, KeepAliveStreamsGoToTheRaftLeader); every stream below opens there.
  auto first = client_->LeaseGrant(absl::Seconds(30), kTimeout);
  ASSERT_TRUE(first.ok()) << first.status();
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(client_->LeaseKeepAlive(*first, kTimeout).ok());
  ASSERT_TRUE(client_->LeaseRevoke(*first, kTimeout).ok());
  auto lease = client_->LeaseGrant(absl::Seconds(30), kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  const double started_before = KeepAliveStreamsStarted(*cluster_, 3);
  ASSERT_GE(started_before, 0) << "etcd's /metrics has no grpc_server_started_total";
  const uint64_t opened_before = client_->keepalive_streams_opened();
  for (int i = 0; i < 20; ++i) {
    auto ttl = client_->LeaseKeepAlive(*lease, kTimeout);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, absl::Seconds(30));
  }
  EXPECT_EQ(client_->keepalive_streams_opened(), opened_before + 1);
  // etcd counts one stream for the twenty renewals (it counts a stream when
  // it starts: the first renewal's answer came after that).
  EXPECT_EQ(KeepAliveStreamsStarted(*cluster_, 3), started_before + 1);

  // Two leases, two streams; a revoked lease's renewal is NOT_FOUND and
  // opens a stream of its own to learn it (the revoke closed the old one).
  auto other = client_->LeaseGrant(absl::Seconds(30), kTimeout);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE(client_->LeaseKeepAlive(*other, kTimeout).ok());
  ASSERT_TRUE(client_->LeaseKeepAlive(*lease, kTimeout).ok());
  EXPECT_EQ(client_->keepalive_streams_opened(), opened_before + 2);
  ASSERT_TRUE(client_->LeaseRevoke(*lease, kTimeout).ok());
  auto gone = client_->LeaseKeepAlive(*lease, kTimeout);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  EXPECT_EQ(client_->keepalive_streams_opened(), opened_before + 3);
  ASSERT_TRUE(client_->LeaseKeepAlive(*other, kTimeout).ok());
  EXPECT_EQ(client_->keepalive_streams_opened(), opened_before + 3);
  ASSERT_TRUE(client_->LeaseRevoke(*other, kTimeout).ok());
}

TEST_F(EtcdClientTest, LeaseMinimumTtlIsOneSecond) {
  // A zero TTL is rounded up to one second; etcd may raise it to its minimum.
  auto lease = client_->LeaseGrant(absl::ZeroDuration(), kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto ttl = client_->LeaseKeepAlive(*lease, kTimeout);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_GE(*ttl, absl::Seconds(1));
  EXPECT_LE(*ttl, absl::Seconds(2));
  ASSERT_TRUE(client_->LeaseRevoke(*lease, kTimeout).ok());
}

TEST_F(EtcdClientTest, RevokeDeletesKeysAndUnknownLeaseIsNotFound) {
  auto lease = client_->LeaseGrant(absl::Seconds(60), kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put(Key("a"), "1", *lease, kTimeout).ok());
  ASSERT_TRUE(client_->Put(Key("b"), "2", *lease, kTimeout).ok());
  ASSERT_TRUE(client_->Put(Key("c"), "3", 0, kTimeout).ok());
  auto ttl = client_->LeaseKeepAlive(*lease, kTimeout);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_EQ(*ttl, absl::Seconds(60));

  ASSERT_TRUE(client_->LeaseRevoke(*lease, kTimeout).ok());
  auto left = client_->Range(prefix_, PrefixEnd(prefix_), kTimeout);
  ASSERT_TRUE(left.ok());
  ASSERT_EQ(left->kvs.size(), 1u);
  EXPECT_EQ(left->kvs[0].key, Key("c"));

  absl::Status again = client_->LeaseRevoke(*lease, kTimeout);
  EXPECT_EQ(again.code(), absl::StatusCode::kNotFound) << again;
  EXPECT_TRUE(absl::StrContains(again.message(), "requested lease not found")) << again;
  EXPECT_TRUE(absl::StartsWith(again.message(), client_->name())) << again;
  auto keep = client_->LeaseKeepAlive(*lease, kTimeout);
  EXPECT_EQ(keep.status().code(), absl::StatusCode::kNotFound) << keep.status();
  EXPECT_EQ(client_->LeaseRevoke(0x7eadbeef12345, kTimeout).code(), absl::StatusCode::kNotFound);
  // A put with an unknown lease fails (etcd: NOT_FOUND too).
  auto put = client_->Put(Key("d"), "4", *lease, kTimeout);
  EXPECT_EQ(put.status().code(), absl::StatusCode::kNotFound) << put.status();
}

TEST_F(EtcdClientTest, WatchSeesPutsAndDeletesInOrderFromARevision) {
  const std::string p = Key("w/");
  auto r0 = client_->Put(p + "a", "1", 0, kTimeout);  // before the watch starts
  ASSERT_TRUE(r0.ok());
  ASSERT_TRUE(client_->Put(Key("outside"), "x", 0, kTimeout).ok());
  ASSERT_TRUE(client_->Put(p + "b", "2", 0, kTimeout).ok());
  auto watch = client_->StartWatch(p, PrefixEnd(p), *r0, kTimeout);
  ASSERT_TRUE(watch.ok()) << watch.status();
  auto live = client_->StartWatch(p, PrefixEnd(p), 0, kTimeout);  // from now
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_TRUE(client_->Put(p + "a", "3", 0, kTimeout).ok());
  ASSERT_TRUE(client_->Delete(p + "b", "", kTimeout).ok());
  ASSERT_TRUE(client_->Delete(p, PrefixEnd(p), kTimeout).ok());  // deletes a

  std::vector<WatchEvent> events;
  ASSERT_TRUE(CollectEvents(watch->get(), 5, kTimeout, &events).ok());
  ASSERT_EQ(events.size(), 5u);
  auto check = [&](size_t i, WatchEvent::Type type, const std::string& key,
                   const std::string& value) {
    EXPECT_EQ(events[i].type, type) << i;
    EXPECT_EQ(events[i].kv.key, key) << i;
    EXPECT_EQ(events[i].kv.value, value) << i;
    if (i > 0) {
      EXPECT_GT(events[i].kv.mod_revision, events[i - 1].kv.mod_revision) << i;
    }
  };
  check(0, WatchEvent::Type::kPut, p + "a", "1");
  EXPECT_EQ(events[0].kv.mod_revision, *r0);
  check(1, WatchEvent::Type::kPut, p + "b", "2");
  check(2, WatchEvent::Type::kPut, p + "a", "3");
  check(3, WatchEvent::Type::kDelete, p + "b", "");
  check(4, WatchEvent::Type::kDelete, p + "a", "");

  std::vector<WatchEvent> live_events;
  ASSERT_TRUE(CollectEvents(live->get(), 3, kTimeout, &live_events).ok());
  ASSERT_EQ(live_events.size(), 3u);
  EXPECT_EQ(live_events[0].kv.value, "3");
  EXPECT_EQ(live_events[0].kv.mod_revision, events[2].kv.mod_revision);
  EXPECT_EQ(live_events[2].type, WatchEvent::Type::kDelete);

  // Nothing more: Next returns OK with no events at its deadline.
  std::vector<WatchEvent> none;
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*watch)->Next(&none, absl::Now() + absl::Milliseconds(300)).ok());
  EXPECT_TRUE(none.empty());
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
}

TEST_F(EtcdClientTest, CancelUnblocksNextPromptly) {
  auto watch = client_->StartWatch(Key("quiet"), "", 0, kTimeout);
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::atomic<bool> returned{false};
  absl::Status result;
  absl::Time returned_at;
  std::thread t([&] {
    std::vector<WatchEvent> events;
    result = (*watch)->Next(&events, absl::Now() + absl::Seconds(30));
    returned_at = absl::Now();
    returned = true;
  });
  // Next blocked (nothing comes on this key): Cancel must end a waiting Next.
  EXPECT_TRUE(Eventually([&] { return (*watch)->blocked_readers() == 1; }, 10000, 1));
  EXPECT_FALSE(returned.load());
  const absl::Time cancelled = absl::Now();
  (*watch)->Cancel();
  t.join();
  EXPECT_LT(returned_at - cancelled, absl::Seconds(1));
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled) << result;
  std::vector<WatchEvent> events;
  EXPECT_EQ((*watch)->Next(&events, absl::Now() + absl::Seconds(5)).code(),
            absl::StatusCode::kCancelled);
  (*watch)->Cancel();  // idempotent
  const absl::Time destroy = absl::Now();
  watch->reset();
  EXPECT_LT(absl::Now() - destroy, absl::Seconds(1));

  // Destroying a watch that was never cancelled, with a Next in progress
  // elsewhere not allowed by the contract, is still prompt.
  auto other = client_->StartWatch(Key("quiet"), "", 0, kTimeout);
  ASSERT_TRUE(other.ok()) << other.status();
  const absl::Time d2 = absl::Now();
  other->reset();
  EXPECT_LT(absl::Now() - d2, absl::Seconds(1));
}

TEST_F(EtcdClientTest, WatchFromCompactedRevisionIsOutOfRange) {
  auto r1 = client_->Put(Key("c"), "1", 0, kTimeout);
  ASSERT_TRUE(r1.ok());
  ASSERT_TRUE(client_->Put(Key("c"), "2", 0, kTimeout).ok());
  auto r3 = client_->Put(Key("c"), "3", 0, kTimeout);
  ASSERT_TRUE(r3.ok());
  {
    // KV.Compact through the raw stub (the client does not offer it).
    auto channel =
        grpc::CreateChannel(cluster_->endpoint(0), grpc::InsecureChannelCredentials());
    auto kv = etcdserverpb::KV::NewStub(channel);
    etcdserverpb::CompactionRequest req;
    req.set_revision(*r3);
    req.set_physical(true);
    etcdserverpb::CompactionResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kTimeout));
    grpc::Status s = kv->Compact(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  auto watch = client_->StartWatch(Key("c"), "", *r1, kTimeout);
  absl::Status s = watch.status();
  if (watch.ok()) {
    std::vector<WatchEvent> events;
    s = CollectEvents(watch->get(), 1000, kTimeout, &events);
    EXPECT_TRUE(events.empty());
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "compact")) << s;
  if (watch.ok()) {  // and stays failed
    std::vector<WatchEvent> events;
    EXPECT_EQ((*watch)->Next(&events, absl::Now()).code(), absl::StatusCode::kOutOfRange);
  }
  // From the compaction revision on, it works.
  auto ok_watch = client_->StartWatch(Key("c"), "", *r3, kTimeout);
  ASSERT_TRUE(ok_watch.ok()) << ok_watch.status();
  std::vector<WatchEvent> events;
  ASSERT_TRUE(CollectEvents(ok_watch->get(), 1, kTimeout, &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kv.value, "3");
}

// ---------------------------------------------------------------------------
// Clusters of their own: members are killed.

// The index of the member that members agree leads (Maintenance.Status
// through the raw stub), -1 when they do not agree within `timeout`.
int LeaderIndex(EtcdTestCluster& cluster, absl::Duration timeout = absl::Seconds(10)) {
  // One poll: the index of the leader every live member names, or -1.
  auto agreed_leader = [&cluster]() -> int {
    std::vector<uint64_t> ids(cluster.size(), 0);
    uint64_t leader = 0;
    for (int i = 0; i < cluster.size(); ++i) {
      if (!cluster.alive(i)) continue;
      auto stub = etcdserverpb::Maintenance::NewStub(
          grpc::CreateChannel(cluster.endpoint(i), grpc::InsecureChannelCredentials()));
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
      etcdserverpb::StatusResponse resp;
      if (!stub->Status(&ctx, etcdserverpb::StatusRequest(), &resp).ok() || resp.leader() == 0) {
        return -1;
      }
      if (leader != 0 && resp.leader() != leader) return -1;
      ids[i] = resp.header().member_id();
      leader = resp.leader();
    }
    for (int i = 0; leader != 0 && i < cluster.size(); ++i) {
      if (ids[i] == leader) return i;
    }
    return -1;  // no member answered, or the leader is not among them
  };
  return hsdp::testing::EventuallyValue(agreed_leader, [](int i) { return i >= 0; },
                                        static_cast<int>(absl::ToInt64Milliseconds(timeout)),
                                        /*poll_ms=*/50);
}

TEST_F(EtcdClientTest, KeepAliveStreamsGoToTheRaftLeader) {
  // A follower forwards every renewal to the leader in an HTTP request of its
  // own; the client keeps its keep-alive streams on the leader instead.
  const int leader = LeaderIndex(*cluster_);
  ASSERT_GE(leader, 0) << cluster_->Logs();
  const int follower = (leader + 1) % 3;
  // Calls go first to a follower.
  auto client = MustConnect({cluster_->endpoint(follower), cluster_->endpoint((leader + 2) % 3),
                             cluster_->endpoint(leader)});
  ASSERT_NE(client, nullptr);
  auto lease = client->LeaseGrant(absl::Seconds(30), kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  const double leader_before = KeepAliveStreamsStartedOn(*cluster_, leader);
  const double follower_before = KeepAliveStreamsStartedOn(*cluster_, follower);
  ASSERT_GE(leader_before, 0) << "etcd's /metrics has no grpc_server_started_total";
  ASSERT_GE(follower_before, 0);
  // The first renewal goes where calls go (the follower) and learns who
  // leads; the next opens a stream on the leader, and every later one uses it.
  for (int i = 0; i < 10; ++i) {
    auto ttl = client->LeaseKeepAlive(*lease, kTimeout);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, absl::Seconds(30));
  }
  EXPECT_EQ(client->keepalive_streams_opened(), 2u);
  EXPECT_EQ(KeepAliveStreamsStartedOn(*cluster_, follower), follower_before + 1);
  EXPECT_EQ(KeepAliveStreamsStartedOn(*cluster_, leader), leader_before + 1);
  // A second lease's stream opens on the leader at once.
  auto other = client->LeaseGrant(absl::Seconds(30), kTimeout);
  ASSERT_TRUE(other.ok()) << other.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client->LeaseKeepAlive(*other, kTimeout).ok());
  EXPECT_EQ(client->keepalive_streams_opened(), 3u);
  EXPECT_EQ(KeepAliveStreamsStartedOn(*cluster_, leader), leader_before + 2);
  EXPECT_EQ(KeepAliveStreamsStartedOn(*cluster_, follower), follower_before + 1);
  ASSERT_TRUE(client->LeaseRevoke(*lease, kTimeout).ok());
  ASSERT_TRUE(client->LeaseRevoke(*other, kTimeout).ok());
}

// The member holding the one keep-alive stream opened so far, by etcd's own
// count (-1: none or several). The raft leader when the client opened it,
// which need not be LeaderIndex's answer any more: CI once saw an election
// (term 2) between LeaderIndex and the stream.
int KeepAliveStreamHolder(const EtcdTestCluster& cluster) {
  int holder = -1;
  for (int i = 0; i < cluster.size(); ++i) {
    if (KeepAliveStreamsStartedOn(cluster, i) >= 1) {
      if (holder != -1) return -1;
      holder = i;
    }
  }
  return holder;
}

// A client of the 3-member `cluster` whose calls go first to `leader`.
std::unique_ptr<EtcdClient> ConnectLeaderFirst(const EtcdTestCluster& cluster, int leader) {
  return MustConnect({cluster.endpoint(leader), cluster.endpoint((leader + 1) % 3),
                      cluster.endpoint((leader + 2) % 3)});
}

TEST(EtcdFailoverTest, KeepAlivesFollowTheLeaderWhenItDies) {
  EtcdTestCluster cluster(3);
  absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  const int leader = LeaderIndex(cluster);
  ASSERT_GE(leader, 0) << cluster.Logs();
  auto client = ConnectLeaderFirst(cluster, leader);
  ASSERT_NE(client, nullptr);
  auto lease = client->LeaseGrant(absl::Seconds(30), kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client->LeaseKeepAlive(*lease, kTimeout).ok());
  EXPECT_EQ(client->keepalive_streams_opened(), 1u);  // on the leader from the start
  const int holder = KeepAliveStreamHolder(cluster);  // that leader
  ASSERT_GE(holder, 0) << cluster.Logs();
  cluster.Kill(holder);
  const int next = LeaderIndex(cluster, absl::Seconds(15));
  ASSERT_GE(next, 0) << cluster.Logs();
  ASSERT_NE(next, holder);
  const double next_before = KeepAliveStreamsStartedOn(cluster, next);
  ASSERT_GE(next_before, 0);
  // Renewals fail over (a follower forwards them), then the stream moves to
  // the new leader and stays there.
  absl::StatusOr<absl::Duration> ttl;
  ASSERT_TRUE(hsdp::testing::Eventually([&] {
    ttl = client->LeaseKeepAlive(*lease, absl::Seconds(2));
    return ttl.ok();
  }, 15000, 50)) << ttl.status();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client->LeaseKeepAlive(*lease, kTimeout).ok());
  const double on_next = KeepAliveStreamsStartedOn(cluster, next);
  EXPECT_GE(on_next, next_before + 1);
  const uint64_t opened = client->keepalive_streams_opened();
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client->LeaseKeepAlive(*lease, kTimeout).ok());
  EXPECT_EQ(client->keepalive_streams_opened(), opened);
  EXPECT_EQ(KeepAliveStreamsStartedOn(cluster, next), on_next);
}

TEST(EtcdFailoverTest, HungLeadersKeepAliveStreamMovesOn) {
  EtcdTestCluster cluster(3);
  absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  const int leader = LeaderIndex(cluster);
  ASSERT_GE(leader, 0) << cluster.Logs();
  auto client = ConnectLeaderFirst(cluster, leader);
  ASSERT_NE(client, nullptr);
  auto lease = client->LeaseGrant(absl::Seconds(60), kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client->LeaseKeepAlive(*lease, kTimeout).ok());
  ASSERT_EQ(client->keepalive_streams_opened(), 1u);  // on the leader
  // The member the stream is on hangs (SIGSTOP): its stream stays open and
  // nothing answers.
  const int holder = KeepAliveStreamHolder(cluster);
  ASSERT_GE(holder, 0) << cluster.Logs();
  cluster.Pause(holder);
  const absl::Duration timeout = absl::Seconds(1);
  const absl::Time start = absl::Now();
  auto hung = client->LeaseKeepAlive(*lease, timeout);
  EXPECT_LT(absl::Now() - start, timeout + absl::Milliseconds(800));
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), absl::StatusCode::kDeadlineExceeded) << hung.status();
  // Later renewals run on another member once the others elect a leader,
  // and stay on one stream there.
  absl::StatusOr<absl::Duration> renewed;
  ASSERT_TRUE(Eventually([&] {
    renewed = client->LeaseKeepAlive(*lease, absl::Seconds(2));
    return renewed.ok();
  }, 15000, 50)) << renewed.status();
  EXPECT_EQ(*renewed, absl::Seconds(60));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(client->LeaseKeepAlive(*lease, kTimeout).ok());
  const uint64_t opened = client->keepalive_streams_opened();
  EXPECT_GE(opened, 2u);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client->LeaseKeepAlive(*lease, kTimeout).ok());
  EXPECT_EQ(client->keepalive_streams_opened(), opened);
  cluster.Resume(holder);
  ASSERT_TRUE(cluster.WaitHealthy(absl::Seconds(30)).ok());
}

TEST(EtcdFailoverTest, KilledMemberFailsOverAndQuorumLossFailsWithinTimeout) {
  EtcdTestCluster cluster(3);
  absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  const int leader = LeaderIndex(cluster);
  ASSERT_GE(leader, 0) << cluster.Logs();
  const int follower = (leader + 1) % 3;  // killed first
  const int other = (leader + 2) % 3;
  // The client's first endpoint is the follower that dies.
  auto client = MustConnect({cluster.endpoint(follower), cluster.endpoint(other),
                             cluster.endpoint(leader)});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Put("k", "before", 0, kTimeout).ok());
  // A lease kept alive on a stream to that member.
  auto lease = client->LeaseGrant(absl::Seconds(60), kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client->LeaseKeepAlive(*lease, kTimeout).ok());
  ASSERT_EQ(client->keepalive_streams_opened(), 1u);

  // A watch through that member alone ends (UNAVAILABLE) when it dies.
  auto single = MustConnect({cluster.endpoint(follower)});
  ASSERT_NE(single, nullptr);
  auto watch = single->StartWatch("k", "", 0, kTimeout);
  ASSERT_TRUE(watch.ok()) << watch.status();

  // The client's current member dies: the same call moves on to the next one.
  cluster.Kill(follower);
  std::vector<WatchEvent> events;
  absl::Status ended = CollectEvents(watch->get(), 1, absl::Seconds(20), &events);
  EXPECT_EQ(ended.code(), absl::StatusCode::kUnavailable) << ended;
  EXPECT_TRUE(absl::StartsWith(ended.message(), single->name())) << ended;

  // The keep-alive stream died with the member: the next renewal opens one
  // on another member.
  auto renewed = client->LeaseKeepAlive(*lease, kTimeout);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(*renewed, absl::Seconds(60));
  // A new stream, perhaps after one more on the dead member (where calls
  // still went first) that failed over at once.
  EXPECT_GE(client->keepalive_streams_opened(), 2u);
  EXPECT_LE(client->keepalive_streams_opened(), 3u);
  auto put = client->Put("k", "after-kill", 0, kTimeout);
  ASSERT_TRUE(put.ok()) << put.status();
  auto got = client->Range("k", "", kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "after-kill");
  auto watch2 = client->StartWatch("k", "", *put, kTimeout);
  ASSERT_TRUE(watch2.ok()) << watch2.status();
  events.clear();
  ASSERT_TRUE(CollectEvents(watch2->get(), 1, kTimeout, &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kv.value, "after-kill");
  watch2->reset();

  // The follower is back; then the leader dies: a new one is elected and
  // the client works again within a few election timeouts (a call in flight
  // when the leader died may time out: etcd drops proposals forwarded to it).
  ASSERT_TRUE(cluster.Restart(follower));
  ASSERT_TRUE(cluster.WaitHealthy(absl::Seconds(30)).ok()) << cluster.Logs();
  cluster.Kill(leader);
  const absl::Time killed = absl::Now();
  absl::StatusOr<int64_t> after_leader;
  ASSERT_TRUE(Eventually([&] {
    after_leader = client->Put("k", "after-leader", 0, absl::Seconds(2));
    return after_leader.ok();
  }, 15000, 50)) << after_leader.status();
  std::cerr << "leader killed: puts work again after " << absl::Now() - killed << "\n";
  got = client->Range("k", "", kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  const int64_t version_before_loss = got->kvs[0].version;
  cluster.Kill(follower);

  // Two of three dead (the old leader and the follower): no quorum. A put
  // fails within its timeout, naming etcd.
  const absl::Duration timeout = absl::Seconds(3);
  const absl::Time start = absl::Now();
  auto lost = client->Put("k", "no-quorum", 0, timeout);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(lost.ok());
  EXPECT_LT(took, timeout + absl::Seconds(1));
  EXPECT_TRUE(lost.status().code() == absl::StatusCode::kUnavailable ||
              lost.status().code() == absl::StatusCode::kDeadlineExceeded)
      << lost.status();
  EXPECT_TRUE(absl::StartsWith(lost.status().message(), client->name() + ": put \"k\": "))
      << lost.status();
  std::cerr << "quorum lost: put took " << took << ": " << lost.status() << "\n";
  // Reads too (linearizable; with "hasleader" the survivor refuses at once
  // once it knows it has no leader).
  EXPECT_TRUE(Eventually([&] {
    auto r = client->Range("k", "", absl::Seconds(2));
    if (!r.ok()) std::cerr << "quorum lost: range: " << r.status() << "\n";
    return !r.ok() && absl::StrContains(r.status().message(), "no leader");
  }, 10000, 50));
  auto lost_watch = client->StartWatch("k", "", 0, absl::Seconds(2));
  EXPECT_FALSE(lost_watch.ok());
  std::cerr << "quorum lost: watch: " << lost_watch.status() << "\n";

  // Back: both restart on their ports and data; the client works again and
  // kept its data.
  ASSERT_TRUE(cluster.Restart(leader));
  ASSERT_TRUE(cluster.Restart(follower));
  absl::Status healthy = cluster.WaitHealthy(absl::Seconds(30));
  ASSERT_TRUE(healthy.ok()) << healthy << cluster.Logs();
  absl::StatusOr<int64_t> again;
  ASSERT_TRUE(Eventually([&] {
    again = client->Put("k", "recovered", 0, kTimeout);
    return again.ok();
  }, 10000, 50)) << again.status();
  got = client->Range("k", "", kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "recovered");
  // "recovered", and perhaps "no-quorum": a write that failed with
  // DEADLINE_EXCEEDED may still be applied once the quorum is back (when the
  // survivor led, the entry stayed in its log and is committed later).
  // Nothing else was written.
  EXPECT_GE(got->kvs[0].version, version_before_loss + 1);
  EXPECT_LE(got->kvs[0].version, version_before_loss + 2);
}

TEST(EtcdFailoverTest, HungMemberTimesOutAndLaterCallsMoveOn) {
  EtcdTestCluster cluster(3);
  absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  // Keep-alive streams where calls go, so that this one is on member 0
  // whether or not it leads (HungLeadersKeepAliveStreamMovesOn: the leader's).
  auto client = MustConnect(cluster.endpoints(), /*keepalives_on_leader=*/false);
  auto single = MustConnect({cluster.endpoint(0)});
  ASSERT_TRUE(client && single);
  ASSERT_TRUE(client->Put("k", "v", 0, kTimeout).ok());  // connected to member 0
  auto watch = single->StartWatch("k", "", 0, kTimeout);
  ASSERT_TRUE(watch.ok()) << watch.status();
  auto lease = client->LeaseGrant(absl::Seconds(60), kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client->LeaseKeepAlive(*lease, kTimeout).ok());  // its stream: on member 0

  // Member 0 hangs (SIGSTOP): its connections stay open, nothing answers.
  cluster.Pause(0);
  const absl::Duration timeout = absl::Seconds(1);
  absl::Time start = absl::Now();
  auto hung = client->Put("k", "hung", 0, timeout);
  EXPECT_LT(absl::Now() - start, timeout + absl::Milliseconds(800));
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), absl::StatusCode::kDeadlineExceeded) << hung.status();
  EXPECT_TRUE(absl::StartsWith(hung.status().message(), client->name())) << hung.status();
  // The next calls go to another member (after a new election if member 0
  // led).
  absl::StatusOr<int64_t> put;
  ASSERT_TRUE(Eventually([&] {
    put = client->Put("k", "moved-on", 0, absl::Seconds(2));
    return put.ok();
  }, 10000, 50)) << put.status();
  // The keep-alive stream on the hung member: the renewal fails on time
  // (DEADLINE_EXCEEDED, no answer) and a later one runs on a new stream on a
  // member that answers.
  start = absl::Now();
  auto hung_renewal = client->LeaseKeepAlive(*lease, timeout);
  EXPECT_LT(absl::Now() - start, timeout + absl::Milliseconds(800));
  ASSERT_FALSE(hung_renewal.ok());
  EXPECT_EQ(hung_renewal.status().code(), absl::StatusCode::kDeadlineExceeded)
      << hung_renewal.status();
  absl::StatusOr<absl::Duration> renewed;
  ASSERT_TRUE(Eventually([&] {
    renewed = client->LeaseKeepAlive(*lease, absl::Seconds(2));
    return renewed.ok();
  }, 10000, 50)) << renewed.status();
  EXPECT_GE(client->keepalive_streams_opened(), 2u);

  // A watch on the hung member alone: not created within its timeout, and
  // StartWatch returns on time.
  start = absl::Now();
  auto no_watch = single->StartWatch("k", "", 0, timeout);
  EXPECT_LT(absl::Now() - start, timeout + absl::Milliseconds(800));
  ASSERT_FALSE(no_watch.ok());
  EXPECT_EQ(no_watch.status().code(), absl::StatusCode::kUnavailable) << no_watch.status();
  // Destroying a watch whose member hangs does not hang.
  start = absl::Now();
  watch->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  cluster.Resume(0);
  ASSERT_TRUE(cluster.WaitHealthy(absl::Seconds(30)).ok());
  // Member 0 serves the cluster's data again. The value is "moved-on", or
  // "hung": a put that timed out on the hung member may still be applied
  // once it resumes (it was queued there), after "moved-on".
  std::string seen;
  EXPECT_TRUE(Eventually([&] {
    auto mine = single->Range("k", "", kTimeout);
    auto theirs = client->Range("k", "", kTimeout);
    if (!mine.ok() || !theirs.ok() || mine->kvs.size() != 1 || theirs->kvs.size() != 1) {
      return false;
    }
    seen = mine->kvs[0].value;
    return mine->kvs[0].mod_revision == theirs->kvs[0].mod_revision &&
           mine->kvs[0].mod_revision >= *put;
  }, 10000, 50));
  EXPECT_TRUE(seen == "moved-on" || seen == "hung") << seen;
}

TEST(EtcdAuthTest, WrongPasswordFailsClearlyAndTokenIsRenewedAfterRestart) {
  EtcdTestCluster cluster(3);
  absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  absl::Status auth = cluster.EnableAuth("s3cret");
  ASSERT_TRUE(auth.ok()) << auth;

  EtcdOptions options;
  options.endpoints = cluster.endpoints();
  options.user = "root";
  options.password = "wrong";
  auto bad = EtcdClient::Connect(options, kTimeout);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << bad.status();
  EXPECT_TRUE(absl::StartsWith(bad.status().message(), "etcd (")) << bad.status();
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "authentication failed")) << bad.status();
  std::cerr << "wrong password: " << bad.status() << "\n";

  // Without a user: refused.
  auto anonymous = MustConnect(cluster.endpoints());
  ASSERT_NE(anonymous, nullptr);
  auto refused = anonymous->Put("k", "v", 0, kTimeout);
  ASSERT_FALSE(refused.ok());
  std::cerr << "no user: " << refused.status() << "\n";

  options.password = "s3cret";
  auto client = EtcdClient::Connect(options, kTimeout);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Put("k", "v1", 0, kTimeout).ok());
  auto watch = (*client)->StartWatch("k", "", 0, kTimeout);
  ASSERT_TRUE(watch.ok()) << watch.status();
  watch->reset();

  // Every member restarts: the simple tokens they held are gone, so the
  // client's token is refused ("invalid auth token") and it authenticates
  // again by itself.
  for (int i = 0; i < cluster.size(); ++i) cluster.Kill(i);
  for (int i = 0; i < cluster.size(); ++i) ASSERT_TRUE(cluster.Restart(i));
  absl::Status healthy = cluster.WaitHealthy(absl::Seconds(30));
  ASSERT_TRUE(healthy.ok()) << healthy;
  absl::StatusOr<int64_t> put;
  ASSERT_TRUE(Eventually([&] {
    put = (*client)->Put("k", "v2", 0, kTimeout);
    return put.ok();
  }, 10000, 50)) << put.status();
  auto got = (*client)->Range("k", "", kTimeout);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "v2");
  watch = (*client)->StartWatch("k", "", *put, kTimeout);
  ASSERT_TRUE(watch.ok()) << watch.status();
  watch->reset();

  // Turning auth off and on drops every token (etcd forgets its simple
  // tokens when auth is disabled): the next call is refused with "invalid
  // auth token", and the client authenticates again and retries it.
  ASSERT_TRUE(cluster.Etcdctl("auth disable").ok());
  ASSERT_TRUE(cluster.Etcdctl("auth enable").ok());
  auto after = (*client)->Put("k", "v3", 0, kTimeout);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_TRUE(cluster.Etcdctl("auth disable").ok());
  ASSERT_TRUE(cluster.Etcdctl("auth enable").ok());
  watch = (*client)->StartWatch("k", "", *after, kTimeout);
  ASSERT_TRUE(watch.ok()) << watch.status();
  std::vector<WatchEvent> events;
  ASSERT_TRUE(CollectEvents(watch->get(), 1, kTimeout, &events).ok());
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kv.value, "v3");
  ASSERT_TRUE(cluster.Etcdctl("auth disable").ok());
  ASSERT_TRUE(cluster.Etcdctl("auth enable").ok());
  auto lease = (*client)->LeaseGrant(absl::Seconds(5), kTimeout);
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE((*client)->LeaseKeepAlive(*lease, kTimeout).ok());
}

}  // namespace
}  // namespace hsdp::etcd
