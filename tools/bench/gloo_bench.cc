// gloo-bench: the Gloo (TCP on loopback) baseline for hsdp-bench.
//
//   build/bin/gloo-bench [--nranks 2] [--op all_reduce|all_gather|reduce_scatter|barrier]
//                        [--min-bytes 4K] [--max-bytes 64M] [--step-factor 2]
//                        [--iters 20] [--warmup 5] [--json]
//
// Forks --nranks rank processes that rendezvous through a
// gloo::rendezvous::FileStore in a fresh temporary directory and connect a
// full mesh of Gloo TCP pairs on 127.0.0.1. float32, sum, out-of-place except
// reduce-scatter. The collectives are Gloo's: gloo::allreduce (options built
// per call, as torch.distributed does), gloo::allgather, gloo::barrier, and
// for reduce-scatter the in-place gloo::ReduceScatterHalvingDoubling,
// constructed once per size (its buffer registration is setup, not timed;
// the input is restored before each iteration, outside the timing).
//
// "size" is the total buffer as in nccl-tests and hsdp-bench (the gathered
// output for all-gather, the full input for reduce-scatter); busbw uses the
// nccl-tests factors. Every iteration starts with gloo::barrier, then each
// rank times one collective with steady_clock; rank 0 reports its own times:
// mean (time), median (p50) and p99. Each size is checked once (a few output
// elements against the expected sum); #wrong is the total over all ranks.
// tools/bench/latency_compare.py runs it beside hsdp-bench and mpi-bench.
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "../../tests/common/spawn.h"  // ForkTiedToParent; gloo-bench has no root include path
#include "baseline_bench.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

using hsdp::baseline::CountWrongAt;
using hsdp::baseline::Input;
using hsdp::baseline::NextSize;
using hsdp::baseline::Op;
using hsdp::baseline::Options;
using hsdp::baseline::ParseArgs;
using hsdp::baseline::PlanSize;
using hsdp::baseline::PrintHeader;
using hsdp::baseline::PrintRow;
using hsdp::baseline::SizePlan;
using hsdp::baseline::TimeRuns;

constexpr auto kTimeout = std::chrono::seconds(60);  // any one Gloo operation

void SumFloats(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<float*>(c);
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

void SumCounts(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<uint64_t*>(c);
  const auto* x = static_cast<const uint64_t*>(a);
  const auto* y = static_cast<const uint64_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

// One rank's connected context and the tags of its next collectives.
struct Rank {
  std::shared_ptr<gloo::rendezvous::Context> ctx;
  uint32_t tag = 0;

  void Barrier() {
    gloo::BarrierOptions b(ctx);
    b.setTag(++tag);
    gloo::barrier(b);
  }
  void AllReduce(float* in, float* out, size_t count) {
    gloo::AllreduceOptions a(ctx);
    a.setInput(in, count);
    a.setOutput(out, count);
    a.setReduceFunction(&SumFloats);
    a.setTag(++tag);
    gloo::allreduce(a);
  }
  void AllGather(float* in, float* out, size_t count) {
    gloo::AllgatherOptions a(ctx);
    a.setInput(in, count);
    a.setOutput(out, count * size_t(ctx->size));
    a.setTag(++tag);
    gloo::allgather(a);
  }
  uint64_t SumOverRanks(uint64_t v) {
    uint64_t out = 0;
    gloo::AllreduceOptions a(ctx);
    a.setInput(&v, 1);
    a.setOutput(&out, 1);
    a.setReduceFunction(&SumCounts);
    a.setTag(++tag);
    gloo::allreduce(a);
    return out;
  }
};

// Runs every size on one rank; returns the exit code (3 when some output was wrong).
int RunRank(const Options& o, int rank, const std::string& dir) {
  const int n = o.nranks;
  gloo::transport::tcp::attr attr("127.0.0.1");
  auto dev = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore store(dir);
  Rank r;
  r.ctx = std::make_shared<gloo::rendezvous::Context>(rank, n);
  r.ctx->setTimeout(kTimeout);
  r.ctx->connectFullMesh(store, dev);

  const uint64_t max_total = std::max<uint64_t>(o.max_bytes, sizeof(float) * n) / sizeof(float);
  std::vector<float> send(max_total), recv(max_total);
  if (rank == 0) {
    PrintHeader("gloo-bench",
                std::string(o.op == Op::kReduceScatter ? "in-place" : "out-of-place") +
                    ", tcp 127.0.0.1",
                o, o.nranks);
  }
  bool first = true;
  uint64_t any_wrong = 0;
  for (uint64_t size = o.min_bytes; size <= o.max_bytes; size = NextSize(o, size)) {
    SizePlan plan;
    if (!PlanSize(o, n, size, &plan)) continue;
    const uint64_t total = plan.total, count = plan.count, in_elems = plan.in_elems;
    const uint64_t bytes = plan.bytes();
    for (uint64_t i = 0; i < in_elems; ++i) send[i] = Input(rank, i);
    // Reduce-scatter works in place on recv (refilled from send before each
    // run); this rank's block lands at its start.
    std::unique_ptr<gloo::ReduceScatterHalvingDoubling<float>> rs;
    if (o.op == Op::kReduceScatter) {
      rs = std::make_unique<gloo::ReduceScatterHalvingDoubling<float>>(
          r.ctx, std::vector<float*>{recv.data()}, int(total), std::vector<int>(n, int(count)));
    }
    auto prepare = [&] {
      if (rs) std::memcpy(recv.data(), send.data(), total * sizeof(float));
    };
    auto run_once = [&] {
      switch (o.op) {
        case Op::kAllReduce:
          r.AllReduce(send.data(), recv.data(), count);
          break;
        case Op::kAllGather:
          r.AllGather(send.data(), recv.data(), count);
          break;
        case Op::kReduceScatter:
          rs->run();
          break;
        default:
          r.Barrier();
      }
    };
    prepare();
    r.Barrier();
    run_once();
    const uint64_t wrong = CountWrongAt(o, n, rank, recv.data(), plan);
    const uint64_t wrong_all = r.SumOverRanks(wrong);
    if (wrong > 0) {
      std::fprintf(stderr, "gloo-bench: rank %d: %llu wrong elements at size %llu\n", rank,
                   (unsigned long long)wrong, (unsigned long long)bytes);
    }
    any_wrong += wrong_all;
    const std::vector<double> times = TimeRuns(
        o,
        [&] {
          prepare();
          r.Barrier();
        },
        run_once);
    if (rank == 0) PrintRow(o, o.nranks, first, bytes, total, times, wrong_all);
    first = false;
    r.Barrier();  // nobody frees this size's buffers while a peer still uses them
    if (o.op == Op::kBarrier) break;  // one row, as hsdp-bench
  }
  if (rank == 0 && o.json) std::printf("\n]\n");
  return any_wrong > 0 ? 3 : 0;
}

// Removes the rendezvous directory (flat: the FileStore writes one file per key).
void RemoveDir(const std::string& dir) {
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") ::unlink((dir + "/" + name).c_str());
    }
    ::closedir(d);
  }
  ::rmdir(dir.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const std::string error = ParseArgs(argc, argv, /*with_nranks=*/true, &o);
  if (!error.empty()) {
    std::fprintf(stderr,
                 "gloo-bench: %s\n(see the comment at the top of "
                 "tools/bench/gloo_bench.cc)\n",
                 error.c_str());
    return 2;
  }
  const char* tmp = std::getenv("TMPDIR");
  std::string dir = std::string(tmp && *tmp ? tmp : "/tmp") + "/gloo-bench-XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) {
    std::fprintf(stderr, "gloo-bench: cannot create a directory %s: %s\n", dir.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::fflush(stdout);
  std::vector<pid_t> kids;
  for (int rank = 0; rank < o.nranks; ++rank) {
    const pid_t pid = hsdp::testing::ForkTiedToParent();  // no orphans when the parent is killed
    if (pid < 0) {
      std::fprintf(stderr, "gloo-bench: fork: %s\n", std::strerror(errno));
      break;
    }
    if (pid == 0) {
      int code = 1;
      try {
        code = RunRank(o, rank, dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo-bench: rank %d: %s\n", rank, e.what());
      }
      std::fflush(stdout);  // _exit skips stdio flushing
      _exit(code);
    }
    kids.push_back(pid);
  }
  // Reap the ranks; once one fails the others cannot finish, so stop them.
  int rc = int(kids.size()) == o.nranks ? 0 : 1;
  if (rc != 0) {
    for (pid_t k : kids) ::kill(k, SIGKILL);
  }
  while (!kids.empty()) {
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, 0);
    if (done < 0) break;
    kids.erase(std::remove(kids.begin(), kids.end(), done), kids.end());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (code != 0 && code != 3) {
      for (pid_t k : kids) ::kill(k, SIGKILL);
    }
    rc = std::max(rc, code);
  }
  RemoveDir(dir);
  return rc;
}
