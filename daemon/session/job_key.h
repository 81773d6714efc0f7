// A job's identity: its owner's uid and the name its trainers chose. Two
// users' jobs of the same name are two jobs (docs/security.md, "Job
// identity"); everything keyed by a job — the session manager's job table,
// group keys, cluster placement keys, observability — uses the whole key,
// never the name alone.
#ifndef HSDP_DAEMON_SESSION_JOB_KEY_H_
#define HSDP_DAEMON_SESSION_JOB_KEY_H_

#include <compare>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace hsdp {

struct JobKey {
  uint32_t owner_uid = 0;
  std::string name;  // the client's job_id (1 to 128 printable bytes)

  auto operator<=>(const JobKey&) const = default;
  bool operator==(const JobKey&) const = default;

  // The key as one string, the same on every daemon of a cluster:
  // "<uid>/<len>:<name>" (the name length-prefixed, so any name is
  // unambiguous). Group keys and cluster placement keys start with it.
  std::string Encoded() const { return absl::StrCat(owner_uid, "/", name.size(), ":", name); }
  // For messages: job "<name>" of uid <uid>.
  std::string Describe() const { return absl::StrCat("job \"", name, "\" of uid ", owner_uid); }
};

}  // namespace hsdp

#endif  // HSDP_DAEMON_SESSION_JOB_KEY_H_
