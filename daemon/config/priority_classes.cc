#include "daemon/config/priority_classes.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"

namespace hsdp {

bool GlobMatch(std::string_view pattern, std::string_view text) {
  // Greedy, with one back-tracking point: the last '*' seen.
  size_t p = 0, t = 0;
  size_t star = std::string_view::npos, star_t = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      star_t = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++star_t;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

bool ValidPriorityClassName(std::string_view name) {
  return !name.empty() && name.size() <= 32 &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
         });
}

namespace {

bool Matches(const PriorityClass& c, std::string_view name, uid_t uid) {
  const bool name_ok = c.jobs.empty() || std::any_of(c.jobs.begin(), c.jobs.end(),
                                                     [&](const std::string& pattern) {
                                                       return GlobMatch(pattern, name);
                                                     });
  const bool uid_ok = c.uids.empty() || std::find(c.uids.begin(), c.uids.end(), uid) != c.uids.end();
  return name_ok && uid_ok;
}

// The class called `name`: a listed one, or the implicit "default".
const PriorityClass* Find(const std::vector<PriorityClass>& classes, std::string_view name) {
  for (const PriorityClass& c : classes) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

uint32_t DefaultLevel(const std::vector<PriorityClass>& classes) {
  const PriorityClass* c = Find(classes, kDefaultPriorityClass);
  return c != nullptr ? c->level : kDefaultPriorityLevel;
}

}  // namespace

ResolvedClass ClassifyJob(const std::vector<PriorityClass>& classes, std::string_view name,
                          uid_t uid) {
  for (const PriorityClass& c : classes) {
    if (Matches(c, name, uid)) return ResolvedClass{c.name, c.level};
  }
  return ResolvedClass{std::string(kDefaultPriorityClass), DefaultLevel(classes)};
}

absl::StatusOr<ResolvedClass> ChooseJobClass(const std::vector<PriorityClass>& classes,
                                             std::string_view name, uid_t uid,
                                             std::string_view requested) {
  ResolvedClass own = ClassifyJob(classes, name, uid);
  if (requested.empty() || requested == own.name) return own;
  ResolvedClass asked;
  if (const PriorityClass* c = Find(classes, requested); c != nullptr) {
    asked = ResolvedClass{c->name, c->level};
  } else if (requested == kDefaultPriorityClass) {
    asked = ResolvedClass{std::string(kDefaultPriorityClass), DefaultLevel(classes)};
  } else {
    std::vector<std::string> known;
    for (const PriorityClass& c : classes) known.push_back(c.name);
    if (!Find(classes, kDefaultPriorityClass)) known.emplace_back(kDefaultPriorityClass);
    std::string shown(requested.substr(0, 64));
    return absl::InvalidArgumentError(absl::StrCat(
        "priority_class: no class \"", absl::CHexEscape(shown), "\" on this node (known: ",
        absl::StrJoin(known, ", "), ")"));
  }
  if (asked.level < own.level) {
    return absl::PermissionDeniedError(absl::StrCat(
        "priority_class: job \"", absl::CHexEscape(std::string(name)), "\" of uid ", uid, " is in class \"",
        own.name, "\" (level ", own.level, ") and may only ask for a class of level ", own.level,
        " or more; \"", asked.name, "\" is level ", asked.level));
  }
  return asked;
}

}  // namespace hsdp
