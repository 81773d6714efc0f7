// A trainer outside the hsdpd tree (tests/packaging/): NRANKS processes, each
// a Client of the daemon on --socket, all-reduce (sum) four floats per step
// and check every result:
//   trainer --socket S --job J --ranks N (--steps K | --until FILE)
// Step s: rank r contributes r + 1 + s, so every element must equal
// N (N + 1) / 2 + N s. An operation that fails UNAVAILABLE (the daemon was
// drained and restarted, e.g. by a package upgrade) is redone once the ranks
// agree (all-reduce min) how many steps they all completed, as
// docs/restarts.md says. With --until FILE the ranks run until FILE exists
// (agreed every 20 steps with an all-reduce max). Rank 0 prints
// "progress <steps> reconnects <n>" every 20 steps and, at the end,
// "trainer: OK steps <k> reconnects <n>"; exit 0 only when every result was
// right and every rank finished.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "hsdp/client.h"

namespace {

struct Args {
  std::string socket, job = "packaged-trainer", until;
  int ranks = 2;
  long steps = 50;
};

bool Exists(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0;
}

int Fail(int rank, const char* what, const absl::Status& s) {
  std::fprintf(stderr, "trainer rank %d: %s: %s\n", rank, what, s.ToString().c_str());
  return 1;
}

// Runs `op` until it succeeds; UNAVAILABLE (the daemon restarting) is
// retried for up to 120 s, anything else fails.
template <typename Op>
absl::Status Retry(Op op, int* failed) {
  for (int i = 0; i < 12000; ++i) {
    absl::StatusOr<hsdp::Work> w = op();
    absl::Status s = w.ok() ? w->Wait(absl::Seconds(60)) : w.status();
    if (s.ok() || !absl::IsUnavailable(s)) return s;
    ++*failed;
    usleep(10000);
  }
  return absl::DeadlineExceededError("the daemon did not come back within 120 s");
}

int RunRank(const Args& a, int rank) {
  hsdp::ClientOptions o;
  o.socket_path = a.socket;
  o.job_id = a.job;
  o.rank = rank;
  o.world_size = a.ranks;
  o.offer_device_memory = false;
  auto c = hsdp::Client::Connect(o);
  if (!c.ok()) return Fail(rank, "Connect", c.status());
  hsdp::Client& client = **c;
  auto x = client.AllocateBuffer(4 * sizeof(float), "x");
  auto agree = client.AllocateBuffer(sizeof(float), "agree");
  std::vector<int> all;
  for (int r = 0; r < a.ranks; ++r) all.push_back(r);
  auto g = client.NewGroup(all);
  if (!x.ok()) return Fail(rank, "AllocateBuffer", x.status());
  if (!agree.ok()) return Fail(rank, "AllocateBuffer", agree.status());
  if (!g.ok()) return Fail(rank, "NewGroup", g.status());
  auto* v = static_cast<float*>(x->data);
  auto* ag = static_cast<float*>(agree->data);
  const float base = a.ranks * (a.ranks + 1) / 2.0f;
  long step = 0;
  int failed = 0;
  long checked = 0;  // the step at which the ranks last agreed not to stop
  for (;;) {
    if (a.until.empty() && step >= a.steps) break;
    if (!a.until.empty() && step % 20 == 0 && step > checked) {
      checked = step;
      ag[0] = Exists(a.until) ? 1.0f : 0.0f;
      absl::Status s = Retry([&] {
        return client.AllReduce(*g, {agree->id, 0}, {agree->id, 0}, 1, hsdp::DataType::kFloat32,
                                hsdp::ReduceOptions{hsdp::ReduceOp::kMax});
      }, &failed);
      if (!s.ok()) return Fail(rank, "agreeing to stop", s);
      if (ag[0] > 0.5f) break;
    }
    for (int i = 0; i < 4; ++i) v[i] = float(rank + 1 + step);
    absl::StatusOr<hsdp::Work> op =
        client.AllReduce(*g, {x->id, 0}, {x->id, 0}, 4, hsdp::DataType::kFloat32);
    absl::Status s = op.ok() ? op->Wait(absl::Seconds(60)) : op.status();
    if (s.ok()) {
      for (int i = 0; i < 4; ++i) {
        if (v[i] != base + a.ranks * float(step)) {
          std::fprintf(stderr, "trainer rank %d: step %ld element %d is %g, expected %g\n", rank,
                       step, i, v[i], base + a.ranks * float(step));
          return 1;
        }
      }
      ++step;
      if (rank == 0 && step % 20 == 0) {
        std::printf("progress %ld reconnects %llu\n", step,
                    static_cast<unsigned long long>(client.reconnects()));
        std::fflush(stdout);
      }
      continue;
    }
    if (!absl::IsUnavailable(s)) return Fail(rank, "AllReduce", s);
    ++failed;
    // The daemon went away mid-step: agree on the steps every rank completed.
    ag[0] = float(step);
    s = Retry([&] {
      return client.AllReduce(*g, {agree->id, 0}, {agree->id, 0}, 1, hsdp::DataType::kFloat32,
                              hsdp::ReduceOptions{hsdp::ReduceOp::kMin});
    }, &failed);
    if (!s.ok()) return Fail(rank, "agreeing on the step", s);
    step = static_cast<long>(ag[0]);
  }
  if (rank == 0) {
    std::printf("trainer: OK steps %ld reconnects %llu failed_ops %d\n", step,
                static_cast<unsigned long long>(client.reconnects()), failed);
    std::fflush(stdout);
  }
  absl::Status d = client.Detach();
  return d.ok() ? 0 : Fail(rank, "Detach", d);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--socket") a.socket = v;
    else if (k == "--job") a.job = v;
    else if (k == "--ranks") a.ranks = std::atoi(v.c_str());
    else if (k == "--steps") a.steps = std::atol(v.c_str());
    else if (k == "--until") a.until = v;
    else {
      std::fprintf(stderr, "usage: trainer --socket S [--job J] [--ranks N] "
                           "[--steps K | --until FILE]\n");
      return 2;
    }
  }
  std::vector<pid_t> kids;
  for (int r = 0; r < a.ranks; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(RunRank(a, r));
    if (pid < 0) return 1;
    kids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : kids) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
