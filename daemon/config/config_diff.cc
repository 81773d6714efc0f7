#include "daemon/config/config_diff.h"

#include <map>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace hsdp {
namespace {

// "section.key" -> value, from NodeConfigToYaml's rendering: a section is an
// unindented "name:" line, a key an indented "key: value  # comment" line.
std::vector<std::pair<std::string, std::string>> Flatten(const NodeConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(NodeConfigToYaml(c));
  std::string line, section;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    if (line[0] != ' ') {
      section = line.substr(0, colon);
      continue;
    }
    std::string key(absl::StripLeadingAsciiWhitespace(line.substr(0, colon)));
    std::string value = line.substr(colon + 1);
    // The comment starts at a '#' after two spaces (values are quoted when
    // they could hold one).
    if (const size_t hash = value.find("  #"); hash != std::string::npos) value.resize(hash);
    out.emplace_back(absl::StrCat(section, ".", key),
                     std::string(absl::StripAsciiWhitespace(value)));
  }
  return out;
}

}  // namespace

std::vector<std::string> ChangedKeys(const NodeConfig& before, const NodeConfig& after) {
  const auto a = Flatten(before);
  std::map<std::string, std::string> b;
  for (auto& [k, v] : Flatten(after)) b[k] = v;
  std::vector<std::string> changed;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || it->second != v) changed.push_back(k);
  }
  return changed;
}

}  // namespace hsdp
