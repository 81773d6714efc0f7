// GlooStore against a real Cluster service on a loopback port: one thread
// sets, another gets/waits, as two Gloo ranks would.
#include "daemon/cluster/gloo_store.h"

#include <thread>

#include "daemon/cluster/cluster_client.h"
#include "daemon/cluster/cluster_service.h"
#include "daemon/cluster/token_authenticator.h"
#include "common/wait.h"
#include "gloo/common/error.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

TEST(GlooStoreTest, SetGetWaitAcrossThreads) {
  TokenAuthenticator auth("tok");
  Coordinator coordinator({.self_address = "", .nodes = 1});
  KvStore kv;
  ClusterServiceImpl service(&auth, &coordinator, &kv, "");
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  ASSERT_GT(port, 0);
  const std::string address = "127.0.0.1:" + std::to_string(port);

  ClusterClient client_a(address, "tok");
  ClusterClient client_b(address, "tok");
  GlooStore a(&client_a, "ctx0/", std::chrono::milliseconds(5000));
  GlooStore b(&client_b, "ctx0/", std::chrono::milliseconds(5000));

  std::vector<char> got;
  std::thread reader([&] {
    b.wait({"rank0"});
    got = b.get("rank1");  // get waits for the key
  });
  // The reader waits in the store for rank0, then (get) for rank1.
  ASSERT_TRUE(testing::Eventually([&] { return kv.waiter_count() == 1; }, 5000, 1));
  a.set("rank0", {'h', 'i'});
  ASSERT_TRUE(testing::Eventually([&] { return kv.waiter_count() == 1; }, 5000, 1));
  a.set("rank1", {'\0', 'x', '\xff'});
  reader.join();
  EXPECT_EQ(got, (std::vector<char>{'\0', 'x', '\xff'}));
  EXPECT_EQ(a.get("rank0"), (std::vector<char>{'h', 'i'}));

  // A missing key times out with Gloo's exception, not a hang.
  GlooStore quick(&client_a, "ctx0/", std::chrono::milliseconds(100));
  EXPECT_THROW(quick.wait({"absent"}), gloo::IoException);
  // A wrong token is refused.
  ClusterClient wrong(address, "nope");
  GlooStore bad(&wrong, "ctx0/", std::chrono::milliseconds(1000));
  try {
    bad.set("k", {'1'});
    ADD_FAILURE() << "a wrong token was accepted";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("wrong cluster token"), std::string::npos) << e.what();
  }

  kv.Shutdown();
  server->Shutdown(std::chrono::system_clock::now());
}

}  // namespace
}  // namespace hsdp
