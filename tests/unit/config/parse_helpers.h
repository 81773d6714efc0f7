// Parsing node.yaml text in the config tests: expecting success, or
// expecting INVALID_ARGUMENT and reading its message.
#ifndef HSDP_TESTS_UNIT_CONFIG_PARSE_HELPERS_H_
#define HSDP_TESTS_UNIT_CONFIG_PARSE_HELPERS_H_

#include <string>

#include "absl/status/statusor.h"
#include "daemon/config/node_config.h"
#include "gtest/gtest.h"

namespace hsdp::testing {

// Parses `yaml`, expecting success.
inline NodeConfig ParseOk(const std::string& yaml) {
  absl::StatusOr<NodeConfig> config = ParseNodeConfig(yaml, "test.yaml");
  EXPECT_TRUE(config.ok()) << config.status() << "\n--- input ---\n" << yaml;
  return config.ok() ? *config : NodeConfig{};
}

// Parses `yaml`, expecting INVALID_ARGUMENT; returns the message.
inline std::string ParseError(const std::string& yaml) {
  absl::StatusOr<NodeConfig> config = ParseNodeConfig(yaml, "test.yaml");
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
      << config.status() << "\n--- input ---\n" << yaml;
  return std::string(config.status().message());
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_UNIT_CONFIG_PARSE_HELPERS_H_
