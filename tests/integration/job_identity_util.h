// Helpers of the job identity tests (isolation_test.cc,
// cluster_job_identity_test.cc): acting as another uid, attaching as the
// current uid, and one rank of a 2-rank job running checked all-reduces.
#ifndef HSDP_TESTS_INTEGRATION_JOB_IDENTITY_UTIL_H_
#define HSDP_TESTS_INTEGRATION_JOB_IDENTITY_UTIL_H_

#include <grp.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/wait.h"
#include "hsdp/client.h"

namespace hsdp::testing {

inline constexpr int kCheckedCount = 1024;  // floats per all-reduce

// Becomes `uid` (and gid) for good.
inline bool BecomeUser(uid_t uid) {
  return ::setgroups(0, nullptr) == 0 && ::setresgid(uid, uid, uid) == 0 &&
         ::setresuid(uid, uid, uid) == 0;
}

// One rank of a 2-rank job: attaches as `uid` (0: stays root) to `job`
// (naming `owner` when set), creates the world group, prints "grouped",
// waits for the file `go` (bounded), then runs `iters` all-reduces of
// kCheckedCount floats and checks every element. Rank r contributes
// tag + r + i + k % 13 at element k of iteration i, so a result that mixed
// in another job's contributions (another tag) is wrong. Prints
// "checked N" and returns 0, or prints what failed and returns non-zero.
inline int CheckedRank(FILE* out, const std::string& socket, uid_t uid, const std::string& job,
                       std::optional<uint32_t> owner, int rank, int tag, const std::string& go,
                       int iters) {
  if (uid != 0 && !BecomeUser(uid)) return 10;
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = job;
  o.owner_uid = owner;
  o.rank = rank;
  o.world_size = 2;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(out, "attach failed: %s\n", c.status().ToString().c_str());
    return 11;
  }
  auto buf = (*c)->AllocateBuffer(2 * kCheckedCount * sizeof(float));
  auto g = buf.ok() ? (*c)->NewGroup({0, 1}) : absl::StatusOr<Group>(buf.status());
  if (!g.ok()) {
    std::fprintf(out, "setup failed: %s\n", g.status().ToString().c_str());
    return 12;
  }
  std::fprintf(out, "grouped\n");
  const bool started = Eventually([&] { return ::access(go.c_str(), F_OK) == 0; }, 20000);
  if (!started) {
    std::fprintf(out, "no go\n");
    return 13;
  }
  auto* f = static_cast<float*>(buf->data);
  for (int i = 0; i < iters; ++i) {
    for (int k = 0; k < kCheckedCount; ++k) f[k] = float(tag + rank + i + k % 13);
    auto w = (*c)->AllReduce(*g, {buf->id, 0}, {buf->id, kCheckedCount * sizeof(float)},
                             kCheckedCount, DataType::kFloat32);
    absl::Status s = w.ok() ? w->Wait(absl::Seconds(20)) : w.status();
    if (!s.ok()) {
      std::fprintf(out, "iteration %d: %s\n", i, s.ToString().c_str());
      return 14;
    }
    for (int k = 0; k < kCheckedCount; ++k) {
      const float want = float(2 * tag + 1 + 2 * i + 2 * (k % 13));
      if (f[kCheckedCount + k] != want) {
        std::fprintf(out, "iteration %d element %d: %g, want %g\n", i, k, f[kCheckedCount + k],
                     want);
        return 15;
      }
    }
  }
  std::fprintf(out, "checked %d\n", iters);
  return 0;
}

// Attach as the current process's uid; "OK" or the status code and message.
inline std::string TryAttach(const std::string& socket, const std::string& job, int rank, int world,
                             std::optional<uint32_t> owner = std::nullopt,
                             std::unique_ptr<Client>* keep = nullptr) {
  ClientOptions o;
  o.socket_path = socket;
  o.job_id = job;
  o.owner_uid = owner;
  o.rank = rank;
  o.world_size = world;
  auto c = Client::Connect(o);
  if (!c.ok()) {
    return absl::StrCat(absl::StatusCodeToString(c.status().code()), " ", c.status().message());
  }
  if (keep != nullptr) *keep = std::move(*c);
  return "OK";
}

}  // namespace hsdp::testing

#endif  // HSDP_TESTS_INTEGRATION_JOB_IDENTITY_UTIL_H_
