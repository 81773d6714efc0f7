#include "daemon/cluster/token_authenticator.h"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace hsdp {
namespace {

TEST(TokenAuthenticatorTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("secret", "secret"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secreT"));
  EXPECT_FALSE(ConstantTimeEquals("secret", "secret2"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), "a"));
}

TEST(TokenAuthenticatorTest, ReadClusterToken) {
  char dir[] = "/tmp/hsdp-token.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/token";
  std::ofstream(path) << "  s3cret\n";
  ::chmod(path.c_str(), 0600);
  auto token = ReadClusterToken(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "s3cret");
  std::ofstream(path) << "\n \n";
  EXPECT_EQ(ReadClusterToken(path).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadClusterToken(std::string(dir) + "/none").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(ReadClusterToken(std::string(dir) + "/none").status().message(),
              ::testing::HasSubstr("cluster.token_file"));
  std::system((std::string("rm -rf ") + dir).c_str());
}

}  // namespace
}  // namespace hsdp
