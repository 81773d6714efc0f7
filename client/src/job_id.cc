// DefaultJobId: the job id a client uses when none is given (the rule is in
// hsdp/client.h; README, "Job ids").
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "hsdp/client.h"

namespace hsdp {
namespace {

constexpr size_t kMaxJobIdBytes = 128;  // the daemon's limit (AttachRequest.job_id)

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

}  // namespace

absl::StatusOr<std::string> DefaultJobId(int world_size) {
  std::string id;
  const char* from = nullptr;
  if (std::string v = Env("HSDP_JOB_ID"); !v.empty()) {
    id = v;
    from = "$HSDP_JOB_ID";
  } else if (std::string run = Env("TORCHELASTIC_RUN_ID"); !run.empty() && run != "none") {
    // torchrun's --rdzv-id ("none" unless given; --standalone makes one up).
    id = absl::StrCat("torchelastic-", run);
    from = "$TORCHELASTIC_RUN_ID";
  } else if (std::string job = Env("SLURM_JOB_ID"); !job.empty()) {
    // Steps of one allocation may run side by side: the step is part of it.
    const std::string step = Env("SLURM_STEP_ID");
    id = step.empty() ? absl::StrCat("slurm-", job) : absl::StrCat("slurm-", job, ".", step);
    from = "$SLURM_JOB_ID";
  } else if (std::string ns = Env("PMIX_NAMESPACE"); !ns.empty()) {
    id = absl::StrCat("pmix-", ns);
    from = "$PMIX_NAMESPACE";
  } else if (world_size == 1) {
    // Nobody else to agree with: an id of its own.
    std::random_device rd;
    id = absl::StrCat("solo-", ::getpid(), "-",
                      absl::Hex(uint64_t{rd()} << 32 | rd(), absl::kZeroPad16));
    from = "a single-rank job";
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "job_id: not set, and no launcher run id to derive one from ($HSDP_JOB_ID, "
        "$TORCHELASTIC_RUN_ID, $SLURM_JOB_ID, $PMIX_NAMESPACE are all unset); a job of ",
        world_size,
        " ranks needs one id that every rank passes and no other job of this user "
        "on the node uses (set ClientOptions::job_id / job_id=, or $HSDP_JOB_ID)"));
  }
  if (id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job_id: the id derived from ", from, " is ",
                                                   id.size(), " bytes, over the limit of ",
                                                   kMaxJobIdBytes, "; set a job id explicitly"));
  }
  return id;
}

}  // namespace hsdp
