// The metrics and trace sections of the node config: accepted and refused
// values (with key, value and line in the message) and the YAML round trip.
#include "daemon/config/node_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(ObservabilityConfigTest, DefaultsAreOff) {
  const NodeConfig c;
  EXPECT_EQ(c.metrics_listen, "");
  EXPECT_EQ(c.metrics_password_file, "");
  EXPECT_EQ(c.metrics_username, "hsdpd");
  EXPECT_EQ(c.metrics_max_jobs_per_uid, 32u);
  EXPECT_EQ(c.trace_buffer_events, 65536u);
}

TEST(ObservabilityConfigTest, AcceptsAuthAndShare) {
  auto c = ParseNodeConfig(
      "metrics:\n  listen: \"127.0.0.1:9464\"\n  password_file: /etc/hsdpd/metrics.password\n"
      "  username: prom-scraper\n  max_jobs_per_uid: 256\n",
      "node.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->metrics_password_file, "/etc/hsdpd/metrics.password");
  EXPECT_EQ(c->metrics_username, "prom-scraper");
  EXPECT_EQ(c->metrics_max_jobs_per_uid, 256u);
  auto back = ParseNodeConfig(NodeConfigToYaml(*c), "rendered");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *c);
}

TEST(ObservabilityConfigTest, RefusesBadAuthAndShare) {
  const std::pair<const char*, const char*> cases[] = {
      {"  password_file: metrics.password\n", "metrics.password_file: path \"metrics.password\" is not absolute"},
      {"  password_file: [a]\n", "metrics.password_file:"},
      {"  username: \"\"\n", "metrics.username: user name \"\" is not"},
      {"  username: \"a:b\"\n", "without ':'"},
      {"  username: \"a b\"\n", "without ':' or spaces"},
      {"  max_jobs_per_uid: 0\n", "metrics.max_jobs_per_uid: value \"0\" is out of range [1, 256]"},
      {"  max_jobs_per_uid: 257\n", "metrics.max_jobs_per_uid:"},
  };
  for (const auto& [line, why] : cases) {
    auto c = ParseNodeConfig(std::string("metrics:\n  listen: \"127.0.0.1:0\"\n") + line,
                             "node.yaml");
    ASSERT_FALSE(c.ok()) << line;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(), AllOf(HasSubstr("node.yaml:3: "), HasSubstr(why))) << line;
  }
  // A password without an endpoint protects nothing: a mistake.
  auto orphan = ParseNodeConfig("metrics:\n  password_file: /etc/p\n", "node.yaml");
  ASSERT_FALSE(orphan.ok());
  EXPECT_THAT(orphan.status().message(),
              HasSubstr("node.yaml:2: metrics.password_file: set without metrics.listen"));
}

TEST(ObservabilityConfigTest, AcceptsHostAndPort) {
  for (const char* v : {"127.0.0.1:9464", "127.0.0.1:0", "0.0.0.0:65535", "[::1]:9464", ""}) {
    auto c = ParseNodeConfig(std::string("metrics:\n  listen: \"") + v + "\"\n", "node.yaml");
    ASSERT_TRUE(c.ok()) << v << ": " << c.status();
    EXPECT_EQ(c->metrics_listen, v);
  }
}

TEST(ObservabilityConfigTest, RefusesAddressesWithoutHostOrWithBadPort) {
  const std::pair<const char*, const char*> cases[] = {
      {":9464", "names no host"},
      {"9464", "is not HOST:PORT"},
      {"127.0.0.1", "is not HOST:PORT"},
      {"127.0.0.1:", "is not a number"},
      {"127.0.0.1:65536", "is not a number"},
      {"127.0.0.1:http", "is not a number"},
      {"localhost:9464", "is not an IPv4 address"},
      {"::1:9464", "is not an IPv4 address"},
      {"[::1]x:9464", "is not an IPv4 address"},
  };
  for (const auto& [value, why] : cases) {
    auto c = ParseNodeConfig(
        std::string("log:\n  level: info\nmetrics:\n  listen: \"") + value + "\"\n", "node.yaml");
    ASSERT_FALSE(c.ok()) << value;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(c.status().message(),
                AllOf(HasSubstr("node.yaml:4: metrics.listen:"), HasSubstr(value), HasSubstr(why)))
        << value;
  }
  auto list = ParseNodeConfig("metrics:\n  listen: [1, 2]\n", "node.yaml");
  EXPECT_FALSE(list.ok());
}

TEST(ObservabilityConfigTest, TraceBufferEventsRange) {
  for (const char* v : {"0", "1024", "4194304"}) {
    auto c = ParseNodeConfig(std::string("trace:\n  buffer_events: ") + v + "\n", "n.yaml");
    ASSERT_TRUE(c.ok()) << v << ": " << c.status();
    EXPECT_EQ(c->trace_buffer_events, std::stoul(v));
  }
  for (const char* v : {"1", "1023", "4194305", "-1", "lots"}) {
    auto c = ParseNodeConfig(std::string("trace:\n  buffer_events: ") + v + "\n", "n.yaml");
    ASSERT_FALSE(c.ok()) << v;
    EXPECT_THAT(c.status().message(), HasSubstr("n.yaml:2: trace.buffer_events:")) << v;
  }
}

TEST(ObservabilityConfigTest, RendersAndParsesBack) {
  NodeConfig c;
  c.metrics_listen = "[::1]:9464";
  c.trace_buffer_events = 0;
  const std::string yaml = NodeConfigToYaml(c);
  EXPECT_THAT(yaml, HasSubstr("metrics:"));
  EXPECT_THAT(yaml, HasSubstr("listen: \"[::1]:9464\""));
  auto back = ParseNodeConfig(yaml, "rendered");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c);
  auto defaults = ParseNodeConfig(DefaultNodeConfigYaml(), "default");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(*defaults, NodeConfig{});
}

}  // namespace
}  // namespace hsdp
