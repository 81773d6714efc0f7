// NodeLedger: the node's bytes, mappings and group members, and the per-uid
// shares of sessions, bytes and members, checked, reserved and given back.
// Also the mapping budget below vm.max_map_count.
#include "daemon/jobs/node_ledger.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "hsdp/common/status_macros.h"

namespace hsdp {
namespace {

// a + b without wrapping (for messages and comparisons).
uint64_t SaturatingAdd(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

}  // namespace

uint64_t MappingBudget(uint64_t kernel_limit) {
  return kernel_limit / 4 * 3 > 1024 ? kernel_limit / 4 * 3 : 1024;
}

uint64_t KernelMaxMapCount() {
  FILE* f = std::fopen("/proc/sys/vm/max_map_count", "re");
  unsigned long long v = 0;
  if (f != nullptr) {
    if (std::fscanf(f, "%llu", &v) != 1) v = 0;
    std::fclose(f);
  }
  return v > 0 ? v : 65530;
}

std::string FormatBytes(uint64_t b) {
  if (b >= (1ull << 30)) return absl::StrCat(b, " bytes (", b >> 30, " GiB)");
  if (b >= (1ull << 20)) return absl::StrCat(b, " bytes (", b >> 20, " MiB)");
  return absl::StrCat(b, " bytes");
}

NodeLedger::NodeLedger(const NodeLimits& limits, uint64_t max_sessions, uint64_t max_job_bytes,
                       uint32_t uid_share_percent)
    : limits_(limits),
      max_job_bytes_(max_job_bytes),
      sessions_share_("sessions (limits.max_sessions)", "sessions", max_sessions,
                      uid_share_percent),
      bytes_share_("registered shared memory (limits.max_node_bytes)", "bytes",
                   limits.max_node_bytes, uid_share_percent),
      members_share_("group members", "members", limits.max_group_members, uid_share_percent) {}

absl::Status NodeLedger::CheckMapping() const {
  if (node_mappings_ >= limits_.max_mappings) {
    return absl::ResourceExhaustedError(absl::StrCat("this node already has ", node_mappings_,
                                                     " shared-memory mappings (the budget below "
                                                     "vm.max_map_count is ",
                                                     limits_.max_mappings, ")"));
  }
  return absl::OkStatus();
}

absl::Status NodeLedger::ReserveSession(uint32_t uid) {
  RETURN_IF_ERROR(CheckMapping());
  RETURN_IF_ERROR(sessions_share_.Take(uid, 1));
  ++node_mappings_;
  return absl::OkStatus();
}

void NodeLedger::ReleaseSession(uint32_t uid) {
  --node_mappings_;
  sessions_share_.Give(uid, 1);
}

absl::Status NodeLedger::CheckBufferFits(uint64_t size_bytes) const {
  if (size_bytes > limits_.max_node_bytes || node_bytes_ > limits_.max_node_bytes - size_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a buffer of ", FormatBytes(size_bytes), " would bring this node to ",
        FormatBytes(SaturatingAdd(node_bytes_, size_bytes)), ", over the node limit of ",
        FormatBytes(limits_.max_node_bytes), " (limits.max_node_bytes)"));
  }
  return CheckMapping();
}

absl::Status NodeLedger::CheckJobBytes(const JobKey& job, uint64_t used,
                                       uint64_t size_bytes) const {
  if (max_job_bytes_ == 0) return absl::OkStatus();
  if (size_bytes > max_job_bytes_ || used > max_job_bytes_ - size_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a buffer of ", FormatBytes(size_bytes), " would bring ", job.Describe(), " to ",
        FormatBytes(SaturatingAdd(used, size_bytes)), " on this node, over its limit of ",
        FormatBytes(max_job_bytes_), " (limits.max_job_bytes)"));
  }
  return absl::OkStatus();
}

absl::Status NodeLedger::ReserveBuffer(uint32_t uid, uint64_t size_bytes) {
  RETURN_IF_ERROR(bytes_share_.Take(uid, size_bytes));
  node_bytes_ += size_bytes;
  ++node_mappings_;
  return absl::OkStatus();
}

void NodeLedger::ReleaseBuffers(uint32_t uid, uint64_t count, uint64_t bytes) {
  node_bytes_ -= bytes;
  bytes_share_.Give(uid, bytes);
  node_mappings_ -= count;
}

absl::Status NodeLedger::CheckMembers(const JobKey& job, uint64_t job_members, uint64_t n) const {
  if (job_members + n > limits_.max_group_members_per_job ||
      node_group_members_ + n > limits_.max_group_members) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a group of ", n, " ranks would bring ", job.Describe(), " to ", job_members + n,
        " group members (at most ", limits_.max_group_members_per_job, " per job and ",
        limits_.max_group_members, " per node, ", node_group_members_, " in use)"));
  }
  return absl::OkStatus();
}

absl::Status NodeLedger::ReserveMembers(uint32_t owner_uid, uint64_t n) {
  RETURN_IF_ERROR(members_share_.Take(owner_uid, n));
  node_group_members_ += n;
  return absl::OkStatus();
}

void NodeLedger::ReleaseMembers(uint32_t owner_uid, uint64_t n) {
  node_group_members_ -= n;
  members_share_.Give(owner_uid, n);
}

}  // namespace hsdp
