// Priority classes: which share of the engine a job gets before others.
//
// node.yaml lists classes under jobs.priority_classes, each with a level
// (0..7, a lower level is served first, strictly) and the jobs it is for,
// by name pattern and by owner uid:
//
//   jobs:
//     priority_classes:
//       - {name: interactive, level: 1, jobs: ["infer-*", "eval-?"]}
//       - {name: batch, level: 6, uids: [2000, 2001]}
//
// A job's class is the first listed class that matches it: its name matches
// one of `jobs` (or `jobs` is empty) and its owner is one of `uids` (or
// `uids` is empty). A job no class matches is in class "default", level 4
// (a listed class named "default" sets its level and matches only what it
// says). A job may ask for a class at Attach; it gets it only when that
// class's level is at or above (served no sooner than) the level of the class
// it matches: asking is for going lower, never higher.
//
// The one definition of these rules; the parser (node_config.cc) and the job
// table (daemon/jobs) both use it.
#ifndef HSDP_DAEMON_CONFIG_PRIORITY_CLASSES_H_
#define HSDP_DAEMON_CONFIG_PRIORITY_CLASSES_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace hsdp {

struct PriorityClass {
  std::string name;                // 1..32 bytes of [a-z0-9_-], unique
  uint32_t level = 4;              // 0..7; a lower level is served first
  std::vector<std::string> jobs;   // name patterns ('*', '?'); empty = any name
  std::vector<uid_t> uids;         // owners; empty = any owner

  friend bool operator==(const PriorityClass&, const PriorityClass&) = default;
};

inline constexpr std::string_view kDefaultPriorityClass = "default";
inline constexpr uint32_t kDefaultPriorityLevel = 4;
inline constexpr uint32_t kMaxPriorityLevel = 7;
inline constexpr size_t kMaxPriorityClasses = 64;
inline constexpr size_t kMaxPriorityPatterns = 64;  // per class
inline constexpr size_t kMaxPriorityPatternBytes = 128;

// The class a job is in, by its name and owner.
struct ResolvedClass {
  std::string name;
  uint32_t level = kDefaultPriorityLevel;
};

// The class the rules above give job `name` of owner `uid`.
ResolvedClass ClassifyJob(const std::vector<PriorityClass>& classes, std::string_view name,
                          uid_t uid);

// The class job `name` of `uid` gets when it asks for `requested` ("" =
// whatever it matches). INVALID_ARGUMENT for a class that does not exist
// (naming the ones that do), PERMISSION_DENIED for one above the job's own.
absl::StatusOr<ResolvedClass> ChooseJobClass(const std::vector<PriorityClass>& classes,
                                             std::string_view name, uid_t uid,
                                             std::string_view requested);

// Shell-style match of `text` against `pattern`: '*' any run of bytes, '?'
// any one byte, everything else itself. O(|pattern| * |text|) at worst.
bool GlobMatch(std::string_view pattern, std::string_view text);

// A valid class name (1..32 bytes of [a-z0-9_-]).
bool ValidPriorityClassName(std::string_view name);

}  // namespace hsdp

#endif  // HSDP_DAEMON_CONFIG_PRIORITY_CLASSES_H_
