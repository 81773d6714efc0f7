// Fuzz target: the node configuration parser (hsdpd --node-config,
// --check-config) on arbitrary text.
//
// Oracles beyond "no crash, no sanitizer report, no exception escaping":
// - a refused document is INVALID_ARGUMENT naming the source
//   ("<source>:<line>: <key>: ...");
// - an accepted one renders (NodeConfigToYaml) to YAML that parses back to an
//   equal config, and its summary line renders.
#include <string>
#include <string_view>

#include "daemon/config/node_config.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hsdp;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<NodeConfig> c = ParseNodeConfig(text, "fuzz.yaml");
  if (!c.ok()) {
    HSDP_FUZZ_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument,
                    c.status().ToString());
    HSDP_FUZZ_CHECK(c.status().message().substr(0, 9) == "fuzz.yaml", c.status().ToString());
    return 0;
  }
  const std::string yaml = NodeConfigToYaml(*c);
  absl::StatusOr<NodeConfig> again = ParseNodeConfig(yaml, "rendered.yaml");
  HSDP_FUZZ_CHECK(again.ok(), again.status().ToString() + "\n--- rendered:\n" + yaml);
  HSDP_FUZZ_CHECK(*again == *c, "the rendered config parses to a different one:\n" + yaml);
  (void)NodeConfigSummary(*c);
  return 0;
}
