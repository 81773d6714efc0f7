// MetricsServer (daemon/observability/metrics_server.h): the constant-time
// comparison, who is let in, the refusal of an address that cannot be
// bound, and over real HTTP on loopback: 401 without the password, the
// collectables with it, no authentication without a password.
#include "daemon/observability/metrics_server.h"
#include "daemon/util/constant_time.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace hsdp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kPassword[] = "0123456789abcdef0123456789abcdef";

// The HTTP response to GET /metrics at "127.0.0.1:PORT".
std::string Get(const std::string& address, const std::string& authorization = "") {
  int port = 0;
  EXPECT_TRUE(absl::SimpleAtoi(address.substr(address.rfind(':') + 1), &port));
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  std::string request = "GET /metrics HTTP/1.0\r\nConnection: close\r\n";
  if (!authorization.empty()) request += "Authorization: Basic " + authorization + "\r\n";
  request += "\r\n";
  EXPECT_EQ(::send(fd, request.data(), request.size(), 0),
            static_cast<ssize_t>(request.size()));
  std::string response;
  char buf[4096];
  // Until the body's Content-Length is in (the server may keep the
  // connection open), or the server closes it.
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) {
    response.append(buf, n);
    const size_t end = response.find("\r\n\r\n");
    const size_t at = response.find("Content-Length: ");
    size_t length = 0;
    if (end != std::string::npos && at != std::string::npos && at < end &&
        absl::SimpleAtoi(response.substr(at + 16, response.find("\r\n", at) - at - 16),
                         &length) &&
        response.size() >= end + 4 + length) {
      break;
    }
  }
  ::close(fd);
  return response;
}

std::shared_ptr<prometheus::Registry> OneCounter() {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("test_total").Help("a test counter").Register(*registry).Add(
      {});
  return registry;
}

TEST(SameSecretTest, EqualOnlyWhenEqual) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals(kPassword, kPassword));
  EXPECT_FALSE(ConstantTimeEquals(kPassword, "0123456789abcdef0123456789abcdeF"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));  // a prefix
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "a"));
  // Shorter, padded with what the comparison pads with.
  EXPECT_FALSE(ConstantTimeEquals(std::string("abc\0", 4), "abc"));
}

TEST(MetricsServerTest, LetsInOnlyTheRightUserAndPassword) {
  MetricsServer server("hsdpd", kPassword);
  EXPECT_TRUE(server.Authorized("hsdpd", kPassword));
  EXPECT_FALSE(server.Authorized("hsdpd", ""));
  EXPECT_FALSE(server.Authorized("root", kPassword));
  EXPECT_FALSE(server.Authorized("", ""));
}

TEST(MetricsServerTest, RefusesAnAddressThatCannotBeBound) {
  MetricsServer first("hsdpd", "");
  absl::StatusOr<std::string> bound = first.Serve("127.0.0.1:0", {OneCounter()});
  ASSERT_TRUE(bound.ok()) << bound.status();
  MetricsServer second("hsdpd", "");
  absl::StatusOr<std::string> again = second.Serve(*bound, {OneCounter()});
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(again.status().message()),
              StartsWith("metrics.listen: cannot serve /metrics on \"" + *bound + "\": "));
}

TEST(MetricsServerTest, AsksForThePasswordWhenOneIsSet) {
  // The server holds its collectables weakly: the caller keeps them.
  const auto registry = OneCounter();
  MetricsServer server("hsdpd", kPassword);
  absl::StatusOr<std::string> bound = server.Serve("127.0.0.1:0", {registry});
  ASSERT_TRUE(bound.ok()) << bound.status();
  EXPECT_THAT(*bound, StartsWith("127.0.0.1:"));
  EXPECT_THAT(*bound, Not(HasSubstr(":0")));
  const std::string refused = Get(*bound);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 401"));
  EXPECT_THAT(refused, Not(HasSubstr("test_total")));
  EXPECT_THAT(Get(*bound, absl::Base64Escape("hsdpd:wrong-password-0123456789")),
              StartsWith("HTTP/1.1 401"));
  const std::string ok = Get(*bound, absl::Base64Escape(std::string("hsdpd:") + kPassword));
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(ok, HasSubstr("test_total 0"));
  server.Stop();
  server.Stop();  // idempotent
}

TEST(MetricsServerTest, ServesAnyoneWithoutAPassword) {
  const auto registry = OneCounter();
  MetricsServer server("hsdpd", "");
  absl::StatusOr<std::string> bound = server.Serve("127.0.0.1:0", {registry});
  ASSERT_TRUE(bound.ok()) << bound.status();
  const std::string ok = Get(*bound);
  EXPECT_THAT(ok, StartsWith("HTTP/1.1 200"));
  EXPECT_THAT(ok, HasSubstr("test_total 0"));
}

}  // namespace
}  // namespace hsdp
