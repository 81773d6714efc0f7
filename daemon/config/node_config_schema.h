// The node configuration's schema: one table of sections and keys, each key
// naming its parser, its renderer and a one-line comment, so that parsing
// (node_config.cc) and rendering (node_config_yaml.cc) cannot drift apart.
// Internal to daemon/config; the table itself is defined in node_config.cc
// (the cluster section's keys in node_config_cluster.cc).
#ifndef HSDP_DAEMON_CONFIG_NODE_CONFIG_SCHEMA_H_
#define HSDP_DAEMON_CONFIG_NODE_CONFIG_SCHEMA_H_

#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "daemon/config/config_values.h"
#include "daemon/config/node_config.h"

namespace hsdp::config_internal {

using KeyParser = absl::Status (*)(const Field&, NodeConfig*);
using KeyRenderer = std::string (*)(const NodeConfig&);

struct KeySpec {
  std::string_view name;
  std::string_view comment;  // one line, for the rendered YAML
  KeyParser parse;
  KeyRenderer render;  // YAML text of the value
};

// Cross-key validation of a section, run after its keys parsed (also when
// the section is absent). `line_of(key)` is the 1-based line of `key` in the
// section, or the section's line (1 when absent) when the key is not there.
using SectionCheck = absl::Status (*)(const std::string& source,
                                      const std::function<int(std::string_view)>& line_of,
                                      const NodeConfig& config);

struct SectionSpec {
  std::string_view name;
  std::string_view comment;
  std::span<const KeySpec> keys;
  SectionCheck check = nullptr;
};

// Renderers shared by several keys: the member's value as YAML.
template <auto kMember>
std::string RenderNumber(const NodeConfig& config) {
  return absl::StrCat(config.*kMember);
}
template <auto kMember>
std::string RenderBool(const NodeConfig& config) {
  return config.*kMember ? "true" : "false";
}
template <auto kMember>
std::string RenderSize(const NodeConfig& config) {
  return FormatSize(config.*kMember);
}
template <auto kMember>
std::string RenderString(const NodeConfig& config) {
  return YamlQuote(config.*kMember);
}

// An absolute path without NUL bytes ("" allowed: unset).
absl::Status ParsePath(const Field& f, std::string* out);

// The cluster section (node_config_cluster.cc): its keys and the checks
// across them.
std::span<const KeySpec> ClusterKeys();
absl::Status CheckCluster(const std::string& source,
                          const std::function<int(std::string_view)>& line_of,
                          const NodeConfig& config);

// jobs.priority_classes (priority_classes_yaml.cc): a list of maps.
absl::Status ParsePriorityClasses(const Field& f, NodeConfig* config);
std::string RenderPriorityClasses(const NodeConfig& config);

// Every section of the node configuration, in document order.
std::span<const SectionSpec> NodeConfigSections();

}  // namespace hsdp::config_internal

#endif  // HSDP_DAEMON_CONFIG_NODE_CONFIG_SCHEMA_H_
