// The cluster: section of the node configuration: every key, its errors
// (with key path and line), the cross-key rules and round trips.
#include <string>
#include <vector>

#include "daemon/config/node_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "parse_helpers.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using ::hsdp::testing::ParseError;
using ::hsdp::testing::ParseOk;

constexpr char kMember[] =
    "cluster:\n"
    "  coordinator: \"node0.example:7070\"\n"
    "  listen: \"198.18.0.2:7070\"\n"
    "  nodes: 3\n"
    "  token_file: /etc/hsdpd/token\n";

TEST(ClusterConfigTest, DefaultsAreSingleNode) {
  const NodeConfig c;
  EXPECT_EQ(c.cluster_coordinator, "");
  EXPECT_EQ(c.cluster_nodes, 1u);
  EXPECT_EQ(c.cluster_node_rank, -1);
  EXPECT_FALSE(c.cluster_insecure);
  EXPECT_THAT(DefaultNodeConfigYaml(),
              AllOf(HasSubstr("cluster:"), HasSubstr("coordinator: \"\""),
                    HasSubstr("heartbeat_ms: 1000"), HasSubstr("missed_heartbeats: 5"),
                    HasSubstr("join_timeout_ms: 60000"), HasSubstr("node_rank: -1")));
  EXPECT_EQ(ParseOk(DefaultNodeConfigYaml()), NodeConfig{});
}

TEST(ClusterConfigTest, FullSectionParsesAndRoundTrips) {
  const NodeConfig c = ParseOk(
      "cluster:\n"
      "  coordinator: \"[fd00::1]:7070\"\n"
      "  listen: \"[fd00::2]:7071\"\n"
      "  nodes: 4\n"
      "  node_rank: 3\n"
      "  data_address: 198.18.1.2\n"
      "  token_file: /etc/hsdpd/token\n"
      "  tls: {ca: \"\", cert: \"\", key: \"\"}\n"
      "  insecure: false\n"
      "  join_timeout_ms: 1000\n"
      "  heartbeat_ms: 50\n"
      "  missed_heartbeats: 3\n");
  EXPECT_EQ(c.cluster_coordinator, "[fd00::1]:7070");
  EXPECT_EQ(c.cluster_listen, "[fd00::2]:7071");
  EXPECT_EQ(c.cluster_nodes, 4u);
  EXPECT_EQ(c.cluster_node_rank, 3);
  EXPECT_EQ(c.cluster_data_address, "198.18.1.2");
  EXPECT_EQ(c.cluster_token_file, "/etc/hsdpd/token");
  EXPECT_EQ(c.cluster_join_timeout_ms, 1000u);
  EXPECT_EQ(c.cluster_heartbeat_ms, 50u);
  EXPECT_EQ(c.cluster_missed_heartbeats, 3u);
  EXPECT_EQ(ParseOk(NodeConfigToYaml(c)), c) << NodeConfigToYaml(c);
}

TEST(ClusterConfigTest, TlsWithoutTokenIsEnoughAuthentication) {
  const NodeConfig c = ParseOk(
      "cluster:\n  coordinator: \"h:1\"\n  listen: \"g:1\"\n"
      "  tls: {ca: /etc/hsdpd/ca.pem, cert: /etc/hsdpd/node.pem, key: /etc/hsdpd/node.key}\n");
  EXPECT_EQ(c.cluster_tls_ca, "/etc/hsdpd/ca.pem");
  EXPECT_EQ(c.cluster_tls_cert, "/etc/hsdpd/node.pem");
  EXPECT_EQ(c.cluster_tls_key, "/etc/hsdpd/node.key");
  EXPECT_EQ(ParseOk(NodeConfigToYaml(c)), c) << NodeConfigToYaml(c);
}

TEST(ClusterConfigTest, InsecureAndAutoRank) {
  const NodeConfig c = ParseOk(
      "cluster:\n  coordinator: \"127.0.0.1:7070\"\n  listen: \"127.0.0.1:7070\"\n"
      "  insecure: true\n  node_rank: auto\n  nodes: 2\n");
  EXPECT_TRUE(c.cluster_insecure);
  EXPECT_EQ(c.cluster_node_rank, -1);
  EXPECT_EQ(ParseOk(NodeConfigToYaml(c)), c);
  EXPECT_EQ(ParseOk(kMember).cluster_listen, "198.18.0.2:7070");
}

TEST(ClusterConfigTest, EtcdStoreParsesAndRoundTrips) {
  const NodeConfig c = ParseOk(
      "cluster:\n"
      "  store: etcd\n"
      "  etcd:\n"
      "    endpoints: [\"etcd-0:2379\", \"198.18.0.9:2379\", \"[fd00::9]:2379\"]\n"
      "    prefix: /hsdp/prod\n"
      "    user: hsdp\n"
      "    password_file: /etc/hsdpd/etcd-password\n"
      "    tls: {ca: /etc/hsdpd/etcd-ca.pem, cert: /etc/hsdpd/c.pem, key: /etc/hsdpd/c.key}\n"
      "  listen: \"198.18.0.2:7070\"\n"
      "  nodes: 64\n"
      "  node_rank: 0\n");
  EXPECT_EQ(c.cluster_store, "etcd");
  EXPECT_TRUE(c.multi_node());
  EXPECT_EQ(c.cluster_etcd_endpoints,
            (std::vector<std::string>{"etcd-0:2379", "198.18.0.9:2379", "[fd00::9]:2379"}));
  EXPECT_EQ(c.cluster_etcd_prefix, "/hsdp/prod/");  // the '/' is appended
  EXPECT_EQ(c.cluster_etcd_user, "hsdp");
  EXPECT_EQ(c.cluster_etcd_password_file, "/etc/hsdpd/etcd-password");
  EXPECT_EQ(c.cluster_etcd_tls_ca, "/etc/hsdpd/etcd-ca.pem");
  EXPECT_EQ(c.cluster_etcd_tls_cert, "/etc/hsdpd/c.pem");
  EXPECT_EQ(c.cluster_etcd_tls_key, "/etc/hsdpd/c.key");
  EXPECT_EQ(c.cluster_node_rank, 0);  // no coordinator: any node may ask for rank 0
  EXPECT_EQ(ParseOk(NodeConfigToYaml(c)), c) << NodeConfigToYaml(c);
  const NodeConfig insecure = ParseOk(
      "cluster:\n  store: etcd\n  etcd: {endpoints: [\"e:2379\"]}\n  listen: \"n:1\"\n"
      "  insecure: true\n");
  EXPECT_EQ(insecure.cluster_etcd_prefix, "/hsdp/");
  EXPECT_EQ(ParseOk(NodeConfigToYaml(insecure)), insecure);
  EXPECT_FALSE(NodeConfig{}.multi_node());
}

struct Bad {
  const char* name;
  const char* yaml;
  const char* expect;  // substring of the message, with the key path and line
};

void PrintTo(const Bad& b, std::ostream* os) { *os << b.name; }

class ClusterConfigErrorTest : public ::testing::TestWithParam<Bad> {};

TEST_P(ClusterConfigErrorTest, NamesKeyAndLine) {
  EXPECT_THAT(ParseError(GetParam().yaml), HasSubstr(GetParam().expect));
}

INSTANTIATE_TEST_SUITE_P(
    All, ClusterConfigErrorTest,
    ::testing::Values(
        Bad{"coordinator_no_port", "cluster:\n  coordinator: \"node0\"\n", "test.yaml:2: cluster.coordinator: address "
                                                   "\"node0\" is not HOST:PORT"},
        Bad{"coordinator_port_range", "cluster:\n  coordinator: \"node0:99999\"\n",
            "test.yaml:2: cluster.coordinator: address \"node0:99999\": port \"99999\" is not in"},
        Bad{"listen_space", "cluster:\n  listen: \"a b:1\"\n", "test.yaml:2: cluster.listen: address \"a b:1\""},
        Bad{"listen_unbracketed_ipv6", "cluster:\n  listen: \"::1:80\"\n", "cluster.listen: address \"::1:80\" is not"},
        Bad{"port_zero", "cluster:\n  coordinator: \"h:0\"\n", "port \"0\" is not in 1..65535"},
        Bad{"nodes_zero", "cluster:\n  nodes: 0\n", "test.yaml:2: cluster.nodes: value \"0\""},
        Bad{"node_rank_negative", "cluster:\n  node_rank: -2\n", "test.yaml:2: cluster.node_rank:"},
        Bad{"heartbeat_too_small", "cluster:\n  heartbeat_ms: 5\n", "test.yaml:2: cluster.heartbeat_ms:"},
        Bad{"missed_zero", "cluster:\n  missed_heartbeats: 0\n", "test.yaml:2: cluster.missed_heartbeats:"},
        Bad{"join_timeout_zero", "cluster:\n  join_timeout_ms: 0\n", "test.yaml:2: cluster.join_timeout_ms:"},
        Bad{"insecure_not_bool", "cluster:\n  insecure: yes please\n", "test.yaml:2: cluster.insecure: expected true"},
        Bad{"token_file_relative", "cluster:\n  token_file: token.txt\n",
            "test.yaml:2: cluster.token_file: token file \"token.txt\" is not an absolute path"},
        Bad{"data_address_with_port", "cluster:\n  data_address: \"h:80\"\n", "test.yaml:2: cluster.data_address:"},
        Bad{"tls_incomplete", "cluster:\n  tls:\n    ca: /etc/ca.pem\n",
            "test.yaml:3: cluster.tls: mutual TLS needs all of ca, cert and key"},
        Bad{"tls_relative", "cluster:\n  tls:\n    ca: /etc/ca.pem\n    cert: c.pem\n",
            "test.yaml:4: cluster.tls.cert: path \"c.pem\" is not absolute"},
        Bad{"tls_and_insecure",
            "cluster:\n  coordinator: \"h:1\"\n  listen: \"g:1\"\n  insecure: true\n"
            "  tls: {ca: /a, cert: /b, key: /c}\n",
            "test.yaml:4: cluster.insecure: cluster.insecure: true contradicts cluster.tls"},
        Bad{"tls_unknown_key", "cluster:\n  tls: {crt: \"\"}\n", "cluster.tls.crt: unknown key \"crt\""},
        Bad{"tls_not_map", "cluster:\n  tls: yes\n", "cluster.tls: expected a map"},
        Bad{"typo_suggestion", "cluster:\n  coordinater: \"h:1\"\n", "did you mean \"coordinator\"?"},
        // Cross-key rules.
        Bad{"no_auth", "cluster:\n  coordinator: \"h:1\"\n  listen: \"h:1\"\n",
            "test.yaml:2: cluster.coordinator: the peer channel has no authentication"},
        Bad{"no_listen", "cluster:\n  coordinator: \"h:1\"\n  token_file: /t\n",
            "test.yaml:2: cluster.coordinator: cluster.listen"},
        Bad{"listen_without_coordinator", "log:\n  level: info\ncluster:\n  listen: \"h:1\"\n",
            "test.yaml:4: cluster.listen: set without cluster.coordinator"},
        Bad{"nodes_without_coordinator", "cluster:\n  nodes: 2\n", "test.yaml:2: cluster.nodes: more than one node needs"},
        Bad{"node_rank_out_of_range", "cluster:\n  coordinator: \"h:1\"\n  listen: \"g:1\"\n  insecure: true\n"
            "  nodes: 2\n  node_rank: 2\n",
            "test.yaml:6: cluster.node_rank: node rank 2 is out of range for cluster.nodes 2"},
        Bad{"insecure_and_token", "cluster:\n  coordinator: \"h:1\"\n  listen: \"g:1\"\n  insecure: true\n"
            "  token_file: /t\n",
            "test.yaml:4: cluster.insecure: cluster.insecure: true contradicts"},
        Bad{"coordinator_rank_nonzero", "cluster:\n  coordinator: \"h:1\"\n  listen: \"h:1\"\n  insecure: true\n"
            "  nodes: 2\n  node_rank: 1\n",
            "test.yaml:6: cluster.node_rank: the coordinator is always node rank 0"},
        Bad{"member_rank_zero",
            "cluster:\n  coordinator: \"h:1\"\n  listen: \"g:1\"\n  insecure: true\n"
            "  nodes: 2\n  node_rank: 0\n",
            "test.yaml:6: cluster.node_rank: node rank 0 is the coordinator's"},
        // cluster.store: etcd.
        Bad{"store_unknown", "cluster:\n  store: zookeeper\n",
            "test.yaml:2: cluster.store: expected embedded or etcd, got \"zookeeper\""},
        Bad{"etcd_without_endpoints", "cluster:\n  store: etcd\n  listen: \"n:1\"\n  insecure: true\n",
            "cluster.store: etcd needs cluster.etcd.endpoints"},
        Bad{"etcd_without_store", "cluster:\n  etcd: {endpoints: [\"e:1\"]}\n",
            "cluster.etcd: set without cluster.store: etcd"},
        Bad{"etcd_endpoint_no_port", "cluster:\n  etcd:\n    endpoints: [\"e:1\", \"f\"]\n",
            "test.yaml:3: cluster.etcd.endpoints[1]: address \"f\" is not HOST:PORT"},
        Bad{"etcd_endpoints_not_list", "cluster:\n  etcd: {endpoints: \"e:1\"}\n",
            "cluster.etcd.endpoints: expected a list of up to 16"},
        Bad{"etcd_unknown_key", "cluster:\n  etcd: {endpoint: []}\n",
            "cluster.etcd.endpoint: unknown key \"endpoint\""},
        Bad{"etcd_prefix_space", "cluster:\n  etcd: {prefix: \"/a b/\"}\n",
            "cluster.etcd.prefix: prefix \"/a b/\" is not 1..128 printable"},
        Bad{"etcd_user_without_password", "cluster:\n  etcd: {user: hsdp}\n",
            "cluster.etcd: user and password_file go together"},
        Bad{"etcd_password_relative", "cluster:\n  etcd: {user: u, password_file: pw.txt}\n",
            "cluster.etcd.password_file: path \"pw.txt\" is not absolute"},
        Bad{"etcd_cert_without_ca", "cluster:\n  etcd: {tls: {cert: /c, key: /k}}\n",
            "cluster.etcd.tls: a client certificate needs ca"},
        Bad{"etcd_no_auth",
            "cluster:\n  store: etcd\n  etcd: {endpoints: [\"e:1\"]}\n  listen: \"n:1\"\n",
            "cluster.etcd: the connection to etcd has no authentication"},
        Bad{"etcd_with_coordinator",
            "cluster:\n  store: etcd\n  etcd: {endpoints: [\"e:1\"]}\n  listen: \"n:1\"\n"
            "  insecure: true\n  coordinator: \"c:1\"\n",
            "cluster.coordinator: there is no coordinator with cluster.store: etcd"},
        Bad{"etcd_with_token",
            "cluster:\n  store: etcd\n  etcd: {endpoints: [\"e:1\"], user: u, password_file: /p}\n"
            "  listen: \"n:1\"\n  token_file: /t\n",
            "cluster.token_file: secures the embedded store's peer channel"},
        Bad{"etcd_without_listen",
            "cluster:\n  store: etcd\n  etcd: {endpoints: [\"e:1\"]}\n  insecure: true\n",
            "cluster.store: cluster.listen"},
        Bad{"etcd_insecure_and_user",
            "cluster:\n  store: etcd\n  etcd: {endpoints: [\"e:1\"], user: u, password_file: /p}\n"
            "  listen: \"n:1\"\n  insecure: true\n",
            "cluster.insecure: cluster.insecure: true contradicts cluster.etcd"},
        Bad{"wildcard_data_address", "cluster:\n  coordinator: \"h:1\"\n  listen: \"0.0.0.0:1\"\n  insecure: true\n",
            "cluster.data_address: the data address would be \"0.0.0.0\""}));

}  // namespace
}  // namespace hsdp
