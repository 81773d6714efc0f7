// jobs.priority_classes in node.yaml: parsing (every limit checked, every
// error naming the key path and line) and rendering back to YAML.
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "daemon/config/config_values.h"
#include "daemon/config/node_config_schema.h"

namespace hsdp::config_internal {
namespace {

constexpr uint64_t kMaxUid = 4294967294;  // (uid_t)-1 means "no uid"

absl::Status ParsePatterns(const Field& f, std::vector<std::string>* out) {
  if (!f.value.IsSequence()) {
    return f.Error(absl::StrCat("expected a list of job name patterns such as [\"infer-*\"], got ",
                                Describe(f.value)));
  }
  if (f.value.size() > kMaxPriorityPatterns) {
    return f.Error(absl::StrCat(f.value.size(), " patterns; at most ", kMaxPriorityPatterns));
  }
  size_t index = 0;
  for (const YAML::Node& item : f.value) {
    const Field e{f.source, absl::StrCat(f.path, "[", index++, "]"), item, LineOf(item, f.line)};
    RETURN_IF_ERROR(CheckScalar(e, "a job name pattern"));
    const std::string& p = item.Scalar();
    if (p.empty() || p.size() > kMaxPriorityPatternBytes) {
      return e.Error(absl::StrCat("a pattern has 1 to ", kMaxPriorityPatternBytes, " bytes, got ",
                                  p.size()));
    }
    out->push_back(p);
  }
  return absl::OkStatus();
}

absl::Status ParseUids(const Field& f, std::vector<uid_t>* out) {
  if (!f.value.IsSequence()) {
    return f.Error(
        absl::StrCat("expected a list of uids such as [1000, 1001], got ", Describe(f.value)));
  }
  if (f.value.size() > kMaxPriorityPatterns) {
    return f.Error(absl::StrCat(f.value.size(), " uids; at most ", kMaxPriorityPatterns));
  }
  size_t index = 0;
  for (const YAML::Node& item : f.value) {
    const Field e{f.source, absl::StrCat(f.path, "[", index++, "]"), item, LineOf(item, f.line)};
    ASSIGN_OR_RETURN(const uint64_t uid, IntegerInRange(e, 0, kMaxUid));
    out->push_back(static_cast<uid_t>(uid));
  }
  return absl::OkStatus();
}

absl::StatusOr<PriorityClass> ParseClass(const Field& f) {
  if (!f.value.IsMap()) {
    return f.Error(absl::StrCat("expected a map {name, level, jobs, uids}, got ",
                                Describe(f.value)));
  }
  PriorityClass c;
  bool has_name = false, has_level = false;
  std::set<std::string> seen;
  for (const auto& pair : f.value) {
    const std::string key = pair.first.IsScalar() ? pair.first.Scalar() : "";
    const Field sub{f.source, absl::StrCat(f.path, ".", absl::CHexEscape(key)), pair.second,
                    LineOf(pair.first, f.line)};
    if (!seen.insert(key).second) return sub.Error("duplicate key");
    if (key == "name") {
      RETURN_IF_ERROR(CheckScalar(sub, "a class name"));
      if (!ValidPriorityClassName(sub.value.Scalar())) {
        return sub.Error(absl::StrCat("class name ", Quote(sub.value.Scalar()),
                                      " is not 1 to 32 bytes of a-z, 0-9, '_' and '-'"));
      }
      c.name = sub.value.Scalar();
      has_name = true;
    } else if (key == "level") {
      RETURN_IF_ERROR(SetInteger(sub, 0, kMaxPriorityLevel, &c.level));
      has_level = true;
    } else if (key == "jobs") {
      RETURN_IF_ERROR(ParsePatterns(sub, &c.jobs));
    } else if (key == "uids") {
      RETURN_IF_ERROR(ParseUids(sub, &c.uids));
    } else {
      return sub.Error(
          absl::StrCat("unknown key ", Quote(key), " (known keys: name, level, jobs, uids)"));
    }
  }
  if (!has_name || !has_level) {
    return f.Error(absl::StrCat("a class needs ", has_name ? "" : "a name",
                                !has_name && !has_level ? " and " : "",
                                has_level ? "" : "a level (0..7)"));
  }
  return c;
}

}  // namespace

absl::Status ParsePriorityClasses(const Field& f, NodeConfig* config) {
  config->priority_classes.clear();
  if (f.value.IsNull()) return absl::OkStatus();
  if (!f.value.IsSequence()) {
    return f.Error(absl::StrCat("expected a list of classes such as [{name: batch, level: 6, "
                                "uids: [2000]}], got ",
                                Describe(f.value)));
  }
  if (f.value.size() > kMaxPriorityClasses) {
    return f.Error(absl::StrCat(f.value.size(), " classes; at most ", kMaxPriorityClasses));
  }
  std::vector<PriorityClass> classes;
  size_t index = 0;
  for (const YAML::Node& item : f.value) {
    const Field e{f.source, absl::StrCat(f.path, "[", index++, "]"), item, LineOf(item, f.line)};
    ASSIGN_OR_RETURN(PriorityClass c, ParseClass(e));
    for (const PriorityClass& other : classes) {
      if (other.name == c.name) {
        return e.Error(absl::StrCat("class ", Quote(c.name), " is listed twice"));
      }
    }
    classes.push_back(std::move(c));
  }
  config->priority_classes = std::move(classes);
  return absl::OkStatus();
}

std::string RenderPriorityClasses(const NodeConfig& config) {
  std::string out = "[";
  for (size_t i = 0; i < config.priority_classes.size(); ++i) {
    const PriorityClass& c = config.priority_classes[i];
    absl::StrAppend(&out, i == 0 ? "" : ", ", "{name: ", YamlQuote(c.name), ", level: ", c.level,
                    ", jobs: [");
    for (size_t j = 0; j < c.jobs.size(); ++j) {
      absl::StrAppend(&out, j == 0 ? "" : ", ", YamlQuote(c.jobs[j]));
    }
    absl::StrAppend(&out, "], uids: [");
    for (size_t j = 0; j < c.uids.size(); ++j) {
      absl::StrAppend(&out, j == 0 ? "" : ", ", c.uids[j]);
    }
    absl::StrAppend(&out, "]}");
  }
  return out + "]";
}

}  // namespace hsdp::config_internal
