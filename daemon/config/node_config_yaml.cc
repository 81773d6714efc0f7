// Node configuration rendering: any NodeConfig as commented YAML that parses
// back to it (one line per key of the schema, with its comment), the default
// document, and the one-line summary for logs.
#include <algorithm>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "daemon/config/config_values.h"
#include "daemon/config/node_config.h"
#include "daemon/config/node_config_schema.h"

namespace hsdp {
namespace {

using config_internal::FormatSize;
using config_internal::KeySpec;
using config_internal::NodeConfigSections;
using config_internal::SectionSpec;

// Renders every key of `config` with its comment, after `header`.
std::string RenderYaml(const NodeConfig& config, std::string_view header) {
  static constexpr size_t kCommentColumn = 36;
  std::string out(header);
  for (const SectionSpec& section : NodeConfigSections()) {
    absl::StrAppend(&out, "\n", std::string(section.name), ":  # ",
                    std::string(section.comment), "\n");
    for (const KeySpec& key : section.keys) {
      std::string line = absl::StrCat("  ", std::string(key.name), ": ", key.render(config));
      line.resize(std::max(line.size() + 2, kCommentColumn), ' ');
      absl::StrAppend(&out, line, "# ", std::string(key.comment), "\n");
    }
  }
  return out;
}

}  // namespace

std::string DefaultNodeConfigYaml() {
  return RenderYaml(
      NodeConfig{},
      "# hsdpd node configuration: the defaults (hsdpd --node-config FILE).\n"
      "# Every key is optional; a missing key keeps the value shown here. Unknown\n"
      "# keys are errors. Sizes take units: KiB, MiB, GiB, TiB (powers of 1024) or\n"
      "# KB, MB, GB, TB (powers of 1000). See docs/configuration.md.\n");
}

std::string NodeConfigToYaml(const NodeConfig& config) {
  return RenderYaml(config,
                    "# hsdpd node configuration (see docs/configuration.md for every key).\n");
}

std::string NodeConfigSummary(const NodeConfig& config) {
  return absl::StrCat(
      "engine=", config.engine_kind,
      config.engine_device == "fake" ? " device=fake(TEST ONLY)" : "",
      " threads=", config.engine_threads == 0 ? "auto" : absl::StrCat(config.engine_threads),
      " ring_entries=", config.ring_entries, " spin_us=", config.spin_us,
      " collective_timeout_ms=", config.collective_timeout_ms,
      " max_sessions=", config.max_sessions,
      " max_session_bytes=", FormatSize(config.max_session_bytes),
      " max_node_bytes=", config.max_node_bytes == 0 ? "auto" : FormatSize(config.max_node_bytes),
      " log_level=", config.log_level);
}

}  // namespace hsdp
