// Parsing a node configuration document against the schema table
// (node_config.cc): YAML → sections → keys, with the error messages that name
// the source, line and key path and suggest the key the user probably meant;
// reading config files safely.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/config/config_values.h"
#include "daemon/config/node_config.h"
#include "daemon/config/node_config_schema.h"
#include "hsdp/common/status_macros.h"
#include "hsdp/common/unique_fd.h"
#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace hsdp {
namespace config_internal {
namespace {

constexpr size_t kMaxConfigFileBytes = 1 << 20;

// yaml-cpp 0.7 (Debian 12) never finishes some malformed documents: a root
// that is a flow collection or a quoted scalar followed by a ',' ("{a}, b",
// "\"x\", b") makes its parser produce nodes without end until memory runs
// out (found by tests/fuzz/node_config_fuzz: 40 bytes took 20 GB). So the
// text is first parsed with a handler that only counts the events, up to far
// more than any document of that size has, before it is loaded.
struct TooManyEvents {
  YAML::Mark mark;
};

class EventBudget : public YAML::EventHandler {
 public:
  explicit EventBudget(size_t text_bytes) : left_(16 * text_bytes + 64) {}
  void OnDocumentStart(const YAML::Mark& m) override { Spend(m); }
  void OnDocumentEnd() override { Spend(last_); }
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { Spend(m); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { Spend(m); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Spend(m);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Spend(m);
  }
  void OnSequenceEnd() override { Spend(last_); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Spend(m);
  }
  void OnMapEnd() override { Spend(last_); }

 private:
  void Spend(const YAML::Mark& m) {
    last_ = m;
    if (left_-- == 0) throw TooManyEvents{m};
  }
  size_t left_;
  YAML::Mark last_ = YAML::Mark::null_mark();
};

// INVALID_ARGUMENT when yaml-cpp would not finish `text` (see EventBudget);
// syntax errors are left to the real load, which reports them.
absl::Status CheckParserTerminates(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  EventBudget budget(text.size());
  try {
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(budget)) {
    }
  } catch (const TooManyEvents& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ":", e.mark.is_null() ? 1 : e.mark.line + 1,
        ": YAML syntax error: the document does not end (a ',' after a flow collection or a "
        "quoted scalar at the top level?)"));
  } catch (const YAML::Exception&) {
  }
  return absl::OkStatus();
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      diagonal = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitute});
    }
  }
  return row[b.size()];
}

// True when `candidate` is close enough to the misspelt `typed` to suggest.
bool LooksLikeTypo(std::string_view typed, std::string_view candidate) {
  if (absl::EqualsIgnoreCase(std::string(typed), std::string(candidate))) return true;
  const size_t distance = EditDistance(typed, candidate);
  return distance <= 2 && 2 * distance < typed.size();
}

// ---------------------------------------------------------------------------
// Parsers for individual keys.

}  // namespace

namespace {

// "kind, threads, inline_max_bytes".
std::string KeyNames(std::span<const KeySpec> keys) {
  std::string out;
  for (const KeySpec& key : keys) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", std::string(key.name));
  }
  return out;
}

std::string SectionNames() {
  std::string out;
  for (const SectionSpec& s : NodeConfigSections()) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", std::string(s.name));
  }
  return out;
}

std::string DidYouMean(std::string_view name) {
  return absl::StrCat("; did you mean \"", std::string(name), "\"?");
}

// A hint for the unknown key `typed`: "; did you mean "threads"?" when it is
// close to a section name (if `include_sections`) or to one of `keys`;
// otherwise, when it is a key of some section, where it belongs; else "".
std::string Suggestion(std::string_view typed, std::span<const KeySpec> keys,
                       bool include_sections) {
  if (include_sections) {
    for (const SectionSpec& s : NodeConfigSections()) {
      if (LooksLikeTypo(typed, s.name)) return DidYouMean(s.name);
    }
  }
  for (const KeySpec& key : keys) {
    if (LooksLikeTypo(typed, key.name)) return DidYouMean(key.name);
  }
  for (const SectionSpec& s : NodeConfigSections()) {
    for (const KeySpec& key : s.keys) {
      if (typed == key.name) {
        const std::string section(s.name);
        return absl::StrCat("; \"", std::string(typed), "\" belongs in section \"", section,
                            "\" (", section, ".", std::string(typed), ")");
      }
    }
  }
  return "";
}

// ---------------------------------------------------------------------------
// Maps.

// One key/value pair of a YAML map.
struct Entry {
  std::string key;
  YAML::Node value;
  int line;  // of the key, 1-based
};

// The pairs of map `node` in document order. Rejects keys that are not
// scalars and keys that appear twice (yaml-cpp keeps both silently).
// `path` names the map in messages ("engine", or "(top level)").
absl::StatusOr<std::vector<Entry>> MapEntries(const YAML::Node& node, const std::string& source,
                                              const std::string& path, const std::string& prefix) {
  std::vector<Entry> entries;
  std::map<std::string, int> first_line;
  for (const auto& pair : node) {
    const int line = LineOf(pair.first, LineOf(node, 1));
    if (!pair.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", path,
                                                     ": keys must be strings, got ",
                                                     Describe(pair.first)));
    }
    const std::string key = pair.first.Scalar();
    const auto [it, inserted] = first_line.emplace(key, line);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", prefix,
                                                     absl::CHexEscape(key), ": duplicate key ",
                                                     Quote(key), " (first at line ", it->second,
                                                     ")"));
    }
    entries.push_back({key, pair.second, line});
  }
  return entries;
}

const KeySpec* FindKey(std::span<const KeySpec> keys, std::string_view name) {
  for (const KeySpec& key : keys) {
    if (key.name == name) return &key;
  }
  return nullptr;
}

const SectionSpec* FindSection(std::string_view name) {
  for (const SectionSpec& s : NodeConfigSections()) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

// Parses the value of section `spec` (an `entry` of the top-level map). An
// empty section ("engine:" with every key commented out) keeps the defaults.
absl::Status ParseSection(const SectionSpec& spec, const Entry& entry, const std::string& source,
                          NodeConfig* config, std::map<std::string, int>* key_lines) {
  const std::string name(spec.name);
  if (entry.value.IsNull()) return absl::OkStatus();
  if (!entry.value.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", LineOf(entry.value, entry.line), ": ", name, ": expected a map with keys ",
        KeyNames(spec.keys), ", got ", Describe(entry.value)));
  }
  const std::string prefix = absl::StrCat(name, ".");
  ASSIGN_OR_RETURN(const std::vector<Entry> entries,
                   MapEntries(entry.value, source, name, prefix));
  for (const Entry& e : entries) {
    const KeySpec* key = FindKey(spec.keys, e.key);
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", e.line, ": ", prefix, absl::CHexEscape(e.key), ": unknown key ",
          Quote(e.key), " in section \"", name, "\"", Suggestion(e.key, spec.keys, false),
          " (known keys: ", KeyNames(spec.keys), ")"));
    }
    const Field field{source, prefix + e.key, e.value, LineOf(e.value, e.line)};
    RETURN_IF_ERROR(key->parse(field, config));
    (*key_lines)[e.key] = e.line;
  }
  return absl::OkStatus();
}

// Runs every section's cross-key check; `lines` maps a section present in
// the document to its line and its keys' lines.
absl::Status CheckSections(
    const std::string& source,
    const std::map<std::string, std::pair<int, std::map<std::string, int>>>& lines,
    const NodeConfig& config) {
  for (const SectionSpec& s : NodeConfigSections()) {
    if (s.check == nullptr) continue;
    const auto it = lines.find(std::string(s.name));
    const auto line_of = [&](std::string_view key) {
      if (it == lines.end()) return 1;
      const auto k = it->second.second.find(std::string(key));
      return k == it->second.second.end() ? it->second.first : k->second;
    };
    RETURN_IF_ERROR(s.check(source, line_of, config));
  }
  return absl::OkStatus();
}

// Parses a whole document; an empty one keeps every default.
absl::Status ParseDocument(const YAML::Node& root, const std::string& source, NodeConfig* config) {
  if (root.IsNull()) return absl::OkStatus();
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ":", LineOf(root, 1), ": (top level): expected a map of sections (",
        SectionNames(), "), got ", Describe(root)));
  }
  ASSIGN_OR_RETURN(const std::vector<Entry> entries, MapEntries(root, source, "(top level)", ""));
  // Per section: its line and the lines of its keys, for SectionSpec::check.
  std::map<std::string, std::pair<int, std::map<std::string, int>>> lines;
  for (const Entry& e : entries) {
    const SectionSpec* section = FindSection(e.key);
    if (section == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ":", e.line, ": ", absl::CHexEscape(e.key),
                       ": unknown top-level key ", Quote(e.key), Suggestion(e.key, {}, true),
                       " (known sections: ", SectionNames(), ")"));
    }
    auto& [section_line, key_lines] = lines[e.key];
    section_line = e.line;
    RETURN_IF_ERROR(ParseSection(*section, e, source, config, &key_lines));
  }
  return CheckSections(source, lines, *config);
}

// ---------------------------------------------------------------------------
// Files.

// The status for a failed open/read of `path`: NOT_FOUND, PERMISSION_DENIED,
// or INVALID_ARGUMENT for anything else.
absl::Status FileError(const std::string& path, const char* what, int err) {
  absl::StatusCode code = absl::StatusCode::kInvalidArgument;
  if (err == ENOENT || err == ENOTDIR) code = absl::StatusCode::kNotFound;
  if (err == EACCES || err == EPERM) code = absl::StatusCode::kPermissionDenied;
  return absl::Status(code, absl::StrCat("cannot ", what, " node config ", Quote(path), ": ",
                                         std::strerror(err)));
}

// The whole content of `path` ("-" = standard input), at most
// kMaxConfigFileBytes.
absl::StatusOr<std::string> ReadConfigFile(const std::string& path) {
  UniqueFd owned;
  int fd = STDIN_FILENO;
  if (path != "-") {
    do {
      owned.Reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    } while (!owned.valid() && errno == EINTR);
    if (!owned.valid()) return FileError(path, "open", errno);
    fd = owned.get();
  }
  struct stat st;
  if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("node config ", Quote(path), " is a directory"));
  }
  std::string text;
  char buffer[16 * 1024];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return FileError(path, "read", errno);
    if (n == 0) return text;
    if (text.size() + static_cast<size_t>(n) > kMaxConfigFileBytes) {
      return absl::InvalidArgumentError(absl::StrCat("node config ", Quote(path),
                                                     " is larger than ",
                                                     FormatSize(kMaxConfigFileBytes)));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
}

}  // namespace
}  // namespace config_internal

absl::StatusOr<NodeConfig> ParseNodeConfig(std::string_view yaml_text, std::string_view source) {
  const std::string name = source.empty() ? "<config>" : std::string(source);
  NodeConfig config;
  const std::string text(yaml_text);
  RETURN_IF_ERROR(config_internal::CheckParserTerminates(text, name));
  try {
    const std::vector<YAML::Node> documents = YAML::LoadAll(text);
    for (size_t i = 1; i < documents.size(); ++i) {
      if (documents[i].IsNull()) continue;  // a trailing "---" or "..."
      return absl::InvalidArgumentError(absl::StrCat(
          name, ":", config_internal::LineOf(documents[i], 1),
          ": (top level): a second YAML document; a node config is a single document"));
    }
    if (!documents.empty()) {
      RETURN_IF_ERROR(config_internal::ParseDocument(documents[0], name, &config));
    }
  } catch (const YAML::Exception& e) {
    const int line = e.mark.is_null() ? 1 : e.mark.line + 1;
    return absl::InvalidArgumentError(absl::StrCat(name, ":", line, ": YAML syntax error: ", e.msg));
  }
  return config;
}

absl::StatusOr<NodeConfig> LoadNodeConfigFile(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, config_internal::ReadConfigFile(path));
  return ParseNodeConfig(text, path == "-" ? "<stdin>" : path);
}

}  // namespace hsdp
