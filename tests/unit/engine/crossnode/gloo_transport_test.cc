// The cross-node engine over the real Gloo TCP transport on 127.0.0.1: two
// and three engines in one process (one per simulated node) rendezvous
// through a shared gloo::rendezvous::HashStore, run the collectives and
// compare with the flat CpuEngine result; a peer that never answers and a
// peer that goes away end in clear errors.
#include "daemon/engine/crossnode/gloo_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/gloo_store.h"  // PrefixedStores
#include "common/wait.h"
#include "crossnode_test_util.h"
#include "daemon/engine/cpu/cpu_engine.h"
#include "daemon/engine/crossnode/gloo_peer_name.h"
#include "daemon/engine/crossnode/hierarchical_engine.h"
#include "gloo/rendezvous/hash_store.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using testing::Case;
using testing::Completions;
using testing::Placement;
using testing::RankBuffers;

class GlooCluster {
 public:
  explicit GlooCluster(int nodes, absl::Duration timeout = absl::Seconds(30), int devices = 1) {
    auto store = std::make_shared<gloo::rendezvous::HashStore>();
    HierarchicalEngineOptions o;
    o.threads = 2;
    o.timeout = timeout;
    o.chunk_bytes = 8192;
    for (int n = 0; n < nodes; ++n) {
      probes_.push_back(std::make_shared<testing::TransportProbe>());
      GlooTransportOptions t;
      t.data_address = "127.0.0.1";
      t.devices = devices;
      t.stripe_min_bytes = 4096;
      t.store = testing::PrefixedStores(store);
      engines_.push_back(MakeHierarchicalEngine(std::make_unique<CpuEngine>(1, 1 << 20),
                                                testing::Probed(MakeGlooTransport(std::move(t)),
                                                                probes_[n]),
                                                o));
    }
  }
  std::vector<Engine*> engines() {
    std::vector<Engine*> v;
    for (auto& e : engines_) v.push_back(e.get());
    return v;
  }
  Engine* engine(int n) { return engines_[n].get(); }
  void Stop(int n) { engines_[n].reset(); }
  // Node n's Connect and Exchange calls so far.
  testing::TransportProbe& probe(int n) { return *probes_[n]; }

 private:
  std::vector<std::shared_ptr<testing::TransportProbe>> probes_;
  std::vector<std::unique_ptr<Engine>> engines_;
};

// The TCP connections this process still holds open: its sockets (in
// /proc/self/fd) that /proc/self/net/tcp{,6} lists as ESTABLISHED (01) or
// CLOSE_WAIT (08: the peer closed, this end not yet). A GlooCluster's
// connections join two of its nodes, so both ends count here; once one
// node's end closed, the other's is open only until its pair sees the close
// and closes its own.
int OpenTcpConnections() {
  std::set<std::string> inodes;
  for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(fd.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) {
      inodes.insert(target.substr(8, target.size() - 9));
    }
  }
  int open = 0;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string sl, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      fields >> sl >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode;
      if ((state == "01" || state == "08") && inodes.count(inode) != 0) ++open;
    }
  }
  return open;
}

Case Make(Collective c, DataType dt, uint64_t count, ReduceOp op = ReduceOp::kSum) {
  Case k;
  k.collective = c;
  k.spec.dtype = dt;
  k.spec.op = op;
  k.count = count;
  return k;
}

TEST(GlooTransport, CollectivesMatchFlatOnTwoAndThreeNodes) {
  for (int nodes : {2, 3}) {
    GlooCluster cl(nodes);
    for (const Placement& p : {testing::Contiguous(nodes, 2), testing::RoundRobin(nodes, 1)}) {
      std::vector<Case> cases = {
          Make(Collective::kAllReduce, DataType::kFloat32, 20000),
          Make(Collective::kAllReduce, DataType::kBFloat16, 777, ReduceOp::kAvg),
          Make(Collective::kAllReduce, DataType::kInt64, 100, ReduceOp::kMax),
          Make(Collective::kReduceScatter, DataType::kFloat32, 3000),
          Make(Collective::kReduceScatter, DataType::kFloat16, 50, ReduceOp::kAvg),
          Make(Collective::kAllGather, DataType::kFloat32, 5000),
          Make(Collective::kAllGather, DataType::kUInt8, 13),
          Make(Collective::kAllToAll, DataType::kInt32, 1000),
          Make(Collective::kBroadcast, DataType::kFloat64, 4000),
          Make(Collective::kBarrier, DataType::kFloat32, 0),
      };
      Case uneven = Make(Collective::kAllToAll, DataType::kFloat32, 1);
      uneven.uneven = true;
      cases.push_back(uneven);
      uint64_t seq = 0;
      const std::string key = absl::StrCat("g", p.size(), "x", nodes);
      for (const Case& c : cases) {
        EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, key, 1, ++seq), "")
            << nodes << " nodes: " << c.Describe();
      }
    }
  }
}

// Large messages striped over two tcp devices per node.
TEST(GlooTransport, StripedOverTwoDevices) {
  GlooCluster cl(2, absl::Seconds(30), 2);
  const Placement p = testing::RoundRobin(2, 2);
  uint64_t seq = 0;
  for (const Case& c : {Make(Collective::kAllReduce, DataType::kFloat32, 30000),
                        Make(Collective::kReduceScatter, DataType::kBFloat16, 5000),
                        Make(Collective::kAllGather, DataType::kInt32, 7000),
                        Make(Collective::kAllToAll, DataType::kFloat64, 900)}) {
    EXPECT_EQ(testing::RunAndCompare(cl.engines(), c, p, "striped", 1, ++seq), "")
        << c.Describe();
  }
}

TEST(GlooTransport, APeerThatNeverAnswersReachesTheDeadline) {
  GlooCluster cl(2, absl::Milliseconds(500));
  Placement p = testing::Contiguous(2, 1);
  Case c = Make(Collective::kAllReduce, DataType::kFloat32, 100);
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 1, 1), "");
  RankBuffers bufs(c, 2, 1);
  Completions done(1);
  cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 2), done.Callbacks(0));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  EXPECT_EQ(done.status(0).code(), absl::StatusCode::kDeadlineExceeded) << done.status(0);
  EXPECT_NE(done.status(0).message().find("node 1"), std::string::npos) << done.status(0);
}

TEST(GlooTransport, ANodeThatNeverConnectsReachesTheDeadlineNamed) {
  GlooCluster cl(3, absl::Milliseconds(500));
  Placement p = testing::Contiguous(3, 1);
  Case c = Make(Collective::kAllReduce, DataType::kFloat32, 100);
  RankBuffers bufs(c, 3, 1);
  Completions done(2);
  for (int n = 0; n < 2; ++n) {
    cl.engine(n)->Launch(testing::BuildTask(c, p, n, &bufs, "late", 1, 1), done.Callbacks(n));
  }
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  for (int n = 0; n < 2; ++n) {
    EXPECT_EQ(done.status(n).code(), absl::StatusCode::kDeadlineExceeded) << done.status(n);
    EXPECT_NE(done.status(n).message().find("node(s) [2] did not come"), std::string::npos)
        << done.status(n);
  }
}

TEST(GlooTransport, APeerThatGoesAwayFailsTheOperationNamingIt) {
  GlooCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = Make(Collective::kAllReduce, DataType::kFloat32, 100);
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 1, 1), "");
  RankBuffers bufs(c, 2, 1);
  Completions done(1);
  const int entered = cl.probe(0).exchanges.load();
  cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 2), done.Callbacks(0));
  // Node 0 waits for node 1 in the network stage.
  ASSERT_TRUE(testing::Eventually([&] { return cl.probe(0).exchanges.load() > entered; }, 10000));
  cl.Stop(1);  // its links close
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  EXPECT_EQ(done.status(0).code(), absl::StatusCode::kUnavailable) << done.status(0);
  EXPECT_NE(done.status(0).message().find("node 1"), std::string::npos) << done.status(0);
}

// The peer went away between two operations: Gloo throws while the next one
// is posted (not while it waits); the error must still name the node (it said
// "connection to a peer lost" before, found by the compose failure tests).
TEST(GlooTransport, APeerGoneBeforeTheNextOperationIsNamed) {
  GlooCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = Make(Collective::kAllReduce, DataType::kFloat32, 100);
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 1, 1), "");
  ASSERT_GT(OpenTcpConnections(), 0);  // the link's connection, both ends
  cl.Stop(1);  // its links close
  // Node 0's pair has seen the close: it closed its end too.
  ASSERT_EQ(testing::EventuallyEq([] { return OpenTcpConnections(); }, 0, 10000), 0);
  RankBuffers bufs(c, 2, 1);
  Completions done(1);
  cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 2), done.Callbacks(0));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  EXPECT_EQ(done.status(0).code(), absl::StatusCode::kUnavailable) << done.status(0);
  EXPECT_NE(done.status(0).message().find("connection to node 1 lost (posting"),
            std::string::npos)
      << done.status(0);
}

TEST(GlooTransport, AbortEndsAWaitingOperation) {
  GlooCluster cl(2);
  Placement p = testing::Contiguous(2, 1);
  Case c = Make(Collective::kAllGather, DataType::kFloat32, 100);
  ASSERT_EQ(testing::RunAndCompare(cl.engines(), c, p, "g", 1, 1), "");
  RankBuffers bufs(c, 2, 1);
  Completions done(1);
  const int entered = cl.probe(0).exchanges.load();
  const uint64_t t =
      cl.engine(0)->Launch(testing::BuildTask(c, p, 0, &bufs, "g", 1, 2), done.Callbacks(0));
  // Waiting for node 1 in the network stage.
  ASSERT_TRUE(testing::Eventually([&] { return cl.probe(0).exchanges.load() > entered; }, 10000));
  cl.engine(0)->Abort(t, absl::AbortedError("aborted by the test"));
  ASSERT_TRUE(done.Wait(absl::Seconds(10)));
  EXPECT_EQ(done.status(0).code(), absl::StatusCode::kAborted) << done.status(0);
}

// What each node handed to `release`: (prefix, keys), in call order.
struct Released {
  std::mutex mu;
  std::vector<std::pair<std::string, std::vector<std::string>>> calls;
};

void ExpectOwnKeys(const std::vector<std::string>& keys, int node) {
  ASSERT_FALSE(keys.empty());
  EXPECT_NE(std::find(keys.begin(), keys.end(), std::to_string(node)), keys.end());
  for (const std::string& k : keys) {
    EXPECT_TRUE(k == std::to_string(node) || k == absl::StrCat("rank_", node) ||
                k == absl::StrCat("instance/", node))
        << k;
  }
}

std::unique_ptr<TransportFactory> RecordingTransport(
    std::shared_ptr<gloo::rendezvous::Store> store, std::shared_ptr<Released> released,
    const std::string& instance = "") {
  GlooTransportOptions t;
  t.data_address = "127.0.0.1";
  t.instance = instance;
  t.store = testing::PrefixedStores(store);
  t.release = [released](const std::string& prefix, const std::vector<std::string>& keys) {
    std::lock_guard<std::mutex> l(released->mu);
    released->calls.emplace_back(prefix, keys);
  };
  return MakeGlooTransport(std::move(t));
}

TEST(GlooTransport, RendezvousKeysAreReleasedAfterTheFirstExchange) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::shared_ptr<Released>> released = {std::make_shared<Released>(),
                                                      std::make_shared<Released>()};
  std::vector<std::unique_ptr<TransportFactory>> factories;
  for (int n = 0; n < 2; ++n) factories.push_back(RecordingTransport(store, released[n]));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::vector<std::unique_ptr<NodeLink>> links(2);
  std::vector<absl::Status> connected(2);
  std::vector<std::thread> threads;
  for (int n = 0; n < 2; ++n) {
    threads.emplace_back([&, n] {
      absl::StatusOr<std::unique_ptr<NodeLink>> link =
          factories[n]->Connect("job/0,1#0", 3, {0, 1}, n, deadline);
      connected[n] = link.status();
      if (link.ok()) links[n] = std::move(*link);
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(connected[0].ok()) << connected[0];
  ASSERT_TRUE(connected[1].ok()) << connected[1];
  for (int n = 0; n < 2; ++n) EXPECT_TRUE(released[n]->calls.empty()) << "released before use";

  threads.clear();
  std::vector<int> out = {10, 11}, in = {-1, -1};
  std::vector<absl::Status> exchanged(2);
  for (int n = 0; n < 2; ++n) {
    threads.emplace_back([&, n] {
      exchanged[n] = links[n]->Exchange({{1 - n, &out[n], sizeof(int), 0}},
                                        {{1 - n, &in[n], sizeof(int), 0}}, 1, deadline);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(exchanged[n].ok()) << exchanged[n];
    EXPECT_EQ(in[n], out[1 - n]);
    ASSERT_EQ(released[n]->calls.size(), 1u) << "node " << n;
    EXPECT_EQ(released[n]->calls[0].first, "job/0,1#0/3");
    // The keys this node's rendezvous wrote (this Gloo writes "rank_<n>" and
    // "<n>"): its own, never a peer's.
    ExpectOwnKeys(released[n]->calls[0].second, n);
  }
  // Later exchanges release nothing more.
  threads.clear();
  for (int n = 0; n < 2; ++n) {
    threads.emplace_back([&, n] {
      exchanged[n] = links[n]->Exchange({{1 - n, &out[n], sizeof(int), 0}},
                                        {{1 - n, &in[n], sizeof(int), 0}}, 2, deadline);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int n = 0; n < 2; ++n) {
    ASSERT_TRUE(exchanged[n].ok()) << exchanged[n];
    EXPECT_EQ(released[n]->calls.size(), 1u);
  }
}

// Each link knows which daemon instance every peer is (what a restarted
// node's old and new daemons differ by); a peer that says none is unknown.
TEST(GlooTransport, LinksKnowTheInstanceOfEachPeersDaemon) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  const std::vector<std::string> instances = {"inst-a", "inst-b", ""};
  std::vector<std::shared_ptr<Released>> released;
  std::vector<std::unique_ptr<TransportFactory>> factories;
  for (int n = 0; n < 3; ++n) {
    released.push_back(std::make_shared<Released>());
    factories.push_back(RecordingTransport(store, released[n], instances[n]));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  std::vector<std::unique_ptr<NodeLink>> links(3);
  std::vector<absl::Status> connected(3);
  std::vector<std::thread> threads;
  for (int n = 0; n < 3; ++n) {
    threads.emplace_back([&, n] {
      absl::StatusOr<std::unique_ptr<NodeLink>> link =
          factories[n]->Connect("job/0,1,2#0", 1, {0, 1, 2}, n, deadline);
      connected[n] = link.status();
      if (link.ok()) links[n] = std::move(*link);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int n = 0; n < 3; ++n) ASSERT_TRUE(connected[n].ok()) << connected[n];
  EXPECT_EQ(links[0]->peer_instance(1), "inst-b");
  EXPECT_EQ(links[0]->peer_instance(2), "");
  EXPECT_EQ(links[1]->peer_instance(0), "inst-a");
  EXPECT_EQ(links[2]->peer_instance(0), "inst-a");
  EXPECT_EQ(links[2]->peer_instance(1), "inst-b");
  EXPECT_EQ(links[1]->peer_instance(7), "") << "out of range";
}

TEST(GlooTransport, AFailedConnectReleasesItsKeys) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  auto released = std::make_shared<Released>();
  std::unique_ptr<TransportFactory> factory = RecordingTransport(store, released);
  // Node 1 never comes.
  absl::StatusOr<std::unique_ptr<NodeLink>> link =
      factory->Connect("lonely", 1, {0, 1}, 0, absl::Now() + absl::Milliseconds(300));
  ASSERT_FALSE(link.ok());
  ASSERT_EQ(released->calls.size(), 1u);
  ExpectOwnKeys(released->calls[0].second, 0);
}

// Hands every value set under a key ending in "/0" (node 0's pair addresses)
// to the test.
class TappingStore : public gloo::rendezvous::Store {
 public:
  void set(const std::string& key, const std::vector<char>& data) override {
    inner_.set(key, data);
    if (key.size() >= 2 && key.compare(key.size() - 2, 2, "/0") == 0) {
      std::lock_guard<std::mutex> l(mu_);
      addresses_ = data;
      cv_.notify_all();
    }
  }
  std::vector<char> get(const std::string& key) override { return inner_.get(key); }
  void wait(const std::vector<std::string>& keys) override { inner_.wait(keys); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    inner_.wait(keys, timeout);
  }
  // The next value set (then forgotten); empty after `timeout`.
  std::vector<char> Take(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return !addresses_.empty(); });
    return std::exchange(addresses_, {});
  }

 private:
  gloo::rendezvous::HashStore inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> addresses_;
};

// The loopback ports in Gloo's serialized pair addresses (sockaddr_in of
// 127.0.0.1, wherever they sit in the record).
std::vector<uint16_t> LoopbackPorts(const std::vector<char>& bytes) {
  std::vector<uint16_t> ports;
  for (size_t o = 0; o + sizeof(sockaddr_in) <= bytes.size(); ++o) {
    sockaddr_in in;
    std::memcpy(&in, bytes.data() + o, sizeof(in));
    if (in.sin_family == AF_INET && in.sin_addr.s_addr == htonl(INADDR_LOOPBACK) &&
        in.sin_port != 0) {
      ports.push_back(ntohs(in.sin_port));
    }
  }
  return ports;
}

// Connects to `port` and resets the connection at once (SO_LINGER 0).
void ConnectAndReset(uint16_t port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  linger reset{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to));
  close(fd);
}

// A connection reset before Gloo's IO thread accepts it (a peer tearing down
// a failed rendezvous, or anyone on the data network) once ended the whole
// process: Gloo's getpeername check threw in that thread. The link fails
// instead, and the transport goes on connecting. Repeated, since whether
// the reset lands before the accept is a race.
TEST(GlooTransport, AConnectionResetBeforeGlooAcceptsItFailsOnlyThatLink) {
  ASSERT_TRUE(GlooPeerNameGuardActive());
  auto store = std::make_shared<TappingStore>();
  GlooTransportOptions t;
  t.data_address = "127.0.0.1";
  t.store = testing::PrefixedStores(store);
  std::unique_ptr<TransportFactory> factory = MakeGlooTransport(std::move(t));
  int attacked = 0;
  for (int attempt = 0; attempt < 30; ++attempt) {
    std::thread hostile([&] {
      const std::vector<char> addresses = store->Take(std::chrono::seconds(5));
      for (uint16_t port : LoopbackPorts(addresses)) {
        ConnectAndReset(port);
        ++attacked;
      }
    });
    absl::StatusOr<std::unique_ptr<NodeLink>> link =
        factory->Connect(absl::StrCat("reset", attempt), 1, {0, 1}, 0,
                         absl::Now() + absl::Milliseconds(100));
    hostile.join();
    EXPECT_FALSE(link.ok());  // node 1 never comes
  }
  EXPECT_GE(attacked, 30);
  // The transport still connects two honest nodes.
  auto honest = std::make_shared<gloo::rendezvous::HashStore>();
  std::vector<std::unique_ptr<TransportFactory>> factories;
  for (int n = 0; n < 2; ++n) factories.push_back(RecordingTransport(honest, std::make_shared<Released>()));
  std::vector<absl::Status> connected(2);
  std::vector<std::thread> threads;
  for (int n = 0; n < 2; ++n) {
    threads.emplace_back([&, n] {
      connected[n] = factories[n]
                         ->Connect("after", 1, {0, 1}, n, absl::Now() + absl::Seconds(10))
                         .status();
    });
  }
  for (std::thread& th : threads) th.join();
  for (int n = 0; n < 2; ++n) EXPECT_TRUE(connected[n].ok()) << connected[n];
}

}  // namespace
}  // namespace hsdp
