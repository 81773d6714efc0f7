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
#include <sys/prctl.h>
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

#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/reduce_scatter.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/transport/tcp/device.h"

namespace {

enum class Op { kAllReduce, kAllGather, kReduceScatter, kBarrier };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    default:
      return "barrier";
  }
}

struct Options {
  Op op = Op::kAllReduce;
  int nranks = 2;
  uint64_t min_bytes = 4096;
  uint64_t max_bytes = 64ull << 20;
  double step = 2;
  int iters = 20;
  int warmup = 5;
  bool json = false;
};

constexpr auto kTimeout = std::chrono::seconds(60);  // any one Gloo operation

// "8", "64K", "1.5M", "1G" (also KB/KiB...); false when malformed or not > 0.
bool ParseSize(const std::string& s, uint64_t* out) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (end == s.c_str()) return false;
  const std::string unit = end;
  double mult = 1;
  if (unit == "K" || unit == "KB" || unit == "KiB")
    mult = 1024;
  else if (unit == "M" || unit == "MB" || unit == "MiB")
    mult = 1 << 20;
  else if (unit == "G" || unit == "GB" || unit == "GiB")
    mult = 1 << 30;
  else if (!unit.empty())
    return false;
  if (!(v > 0) || !std::isfinite(v)) return false;
  *out = uint64_t(v * mult);
  return *out > 0;
}

bool ParseInt(const std::string& s, int lo, int hi, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < lo || v > hi) return false;
  *out = int(v);
  return true;
}

// Parses argv into *o; returns "" or what is wrong.
std::string ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      o->json = true;
      continue;
    }
    const std::vector<std::string> with_value = {
        "--op", "--nranks", "--min-bytes", "--max-bytes", "--step-factor", "--iters", "--warmup"};
    if (std::find(with_value.begin(), with_value.end(), a) == with_value.end()) {
      return "unknown argument " + a;
    }
    if (i + 1 >= argc) return a + " needs a value";
    const std::string v = argv[++i];
    if (a == "--op") {
      if (v == "all_reduce" || v == "allreduce")
        o->op = Op::kAllReduce;
      else if (v == "all_gather" || v == "allgather")
        o->op = Op::kAllGather;
      else if (v == "reduce_scatter" || v == "reducescatter")
        o->op = Op::kReduceScatter;
      else if (v == "barrier")
        o->op = Op::kBarrier;
      else
        return "unknown --op " + v + " (all_reduce, all_gather, reduce_scatter, barrier)";
    } else if (a == "--nranks") {
      if (!ParseInt(v, 1, 64, &o->nranks)) return "--nranks must be 1..64";
    } else if (a == "--min-bytes") {
      if (!ParseSize(v, &o->min_bytes)) return "bad --min-bytes " + v;
    } else if (a == "--max-bytes") {
      if (!ParseSize(v, &o->max_bytes)) return "bad --max-bytes " + v;
    } else if (a == "--step-factor") {
      char* end = nullptr;
      o->step = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(o->step > 1)) return "--step-factor must be a number > 1";
    } else if (a == "--iters") {
      if (!ParseInt(v, 1, 10000000, &o->iters)) return "--iters must be an integer >= 1";
    } else if (a == "--warmup") {
      if (!ParseInt(v, 0, 10000000, &o->warmup)) return "--warmup must be an integer >= 0";
    }
  }
  if (o->min_bytes > o->max_bytes) return "--min-bytes > --max-bytes";
  if (o->max_bytes > (4ull << 30)) return "--max-bytes is at most 4G";
  return "";
}

double BusFactor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
      return double(n - 1) / n;
    default:
      return 1.0;
  }
}

// Element `i` of rank `r`'s input: small integers, so float sums are exact.
float Input(int r, uint64_t i) { return float(r + 1) + float(i % 8); }

// Expected element `i` of rank `r`'s output; `count` is elements per rank.
float Expected(Op op, int n, int r, uint64_t i, uint64_t count) {
  const float ranks_sum = float(n) * float(n + 1) / 2;  // sum of (r + 1)
  switch (op) {
    case Op::kAllReduce:
      return ranks_sum + float(n) * float(i % 8);
    case Op::kReduceScatter:
      return ranks_sum + float(n) * float((uint64_t(r) * count + i) % 8);
    case Op::kAllGather:
      return Input(int(i / count), i % count);
    default:
      return 0;
  }
}

// Compares up to 9 spread elements (first and last included) of `out`.
uint64_t CountWrong(Op op, int n, int rank, const float* out, uint64_t elems, uint64_t count) {
  uint64_t wrong = 0;
  const uint64_t probes = std::min<uint64_t>(elems, 9);
  for (uint64_t k = 0; k < probes; ++k) {
    const uint64_t i = probes == 1 ? 0 : k * (elems - 1) / (probes - 1);
    if (out[i] != Expected(op, n, rank, i, count)) ++wrong;
  }
  return wrong;
}

void PrintHeader(const Options& o) {
  if (o.json) {
    std::printf("[");
    return;
  }
  std::printf(
      "# gloo-bench %s, %d ranks, dtype float32, redop sum, %s, tcp 127.0.0.1, iters %d, "
      "warmup %d\n",
      OpName(o.op), o.nranks, o.op == Op::kReduceScatter ? "in-place" : "out-of-place", o.iters,
      o.warmup);
  std::printf("%12s %12s %9s %8s %10s %10s %10s %8s %10s %10s\n", "size(B)", "count", "type",
              "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "p50(us)", "p99(us)");
}

// One result row from rank 0; `times` sorted.
void PrintRow(const Options& o, bool first, uint64_t bytes, uint64_t total,
              const std::vector<double>& times, uint64_t wrong) {
  double mean = 0;
  for (double t : times) mean += t;
  mean /= double(times.size());
  const size_t m = times.size();
  const double p50 = times[m / 2];
  const double p99 = times[std::min(m - 1, m * 99 / 100)];
  const double algbw = double(bytes) / mean / 1e3;
  const double busbw = algbw * BusFactor(o.op, o.nranks);
  if (o.json) {
    std::printf(
        "%s\n  {\"op\": \"%s\", \"nodes\": 1, \"nranks\": %d, \"size\": %llu, "
        "\"count\": %llu, \"type\": \"float32\", \"redop\": \"sum\", \"time_us\": %.3f, "
        "\"p50_us\": %.3f, \"p99_us\": %.3f, \"algbw_gbps\": %.4f, "
        "\"busbw_gbps\": %.4f, \"wrong\": %llu}",
        first ? "" : ",", OpName(o.op), o.nranks, (unsigned long long)bytes,
        (unsigned long long)total, mean, p50, p99, algbw, busbw, (unsigned long long)wrong);
  } else {
    std::printf("%12llu %12llu %9s %8s %10.2f %10.3f %10.3f %8llu %10.2f %10.2f\n",
                (unsigned long long)bytes, (unsigned long long)total, "float32", "sum", mean, algbw,
                busbw, (unsigned long long)wrong, p50, p99);
  }
  std::fflush(stdout);
}

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
  if (rank == 0) PrintHeader(o);
  bool first = true;
  uint64_t any_wrong = 0;
  for (uint64_t size = o.min_bytes; size <= o.max_bytes;
       size = std::max<uint64_t>(size + 1, uint64_t(double(size) * o.step))) {
    uint64_t total = size / sizeof(float);
    uint64_t count = total;  // elements per rank
    const bool scatters = o.op == Op::kAllGather || o.op == Op::kReduceScatter;
    if (scatters) count = total / n;
    if (o.op != Op::kBarrier && count == 0) continue;
    if (scatters) total = count * n;
    const uint64_t bytes = total * sizeof(float);
    const uint64_t in_elems = o.op == Op::kReduceScatter ? total : count;
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
    uint64_t wrong = 0;
    if (o.op != Op::kBarrier) {
      const uint64_t out_elems = o.op == Op::kAllGather ? total : count;
      wrong = CountWrong(o.op, n, rank, recv.data(), out_elems, count);
    }
    const uint64_t wrong_all = r.SumOverRanks(wrong);
    if (wrong > 0) {
      std::fprintf(stderr, "gloo-bench: rank %d: %llu wrong elements at size %llu\n", rank,
                   (unsigned long long)wrong, (unsigned long long)bytes);
    }
    any_wrong += wrong_all;
    std::vector<double> times;
    times.reserve(o.iters);
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      prepare();
      r.Barrier();
      const auto t0 = std::chrono::steady_clock::now();
      run_once();
      const auto t1 = std::chrono::steady_clock::now();
      if (it >= o.warmup)
        times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::sort(times.begin(), times.end());
    if (rank == 0) PrintRow(o, first, bytes, total, times, wrong_all);
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
  const std::string error = ParseArgs(argc, argv, &o);
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
  const pid_t parent = ::getpid();
  std::vector<pid_t> kids;
  for (int rank = 0; rank < o.nranks; ++rank) {
    const pid_t pid = ::fork();
    if (pid < 0) {
      std::fprintf(stderr, "gloo-bench: fork: %s\n", std::strerror(errno));
      break;
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans when the parent is killed
      if (::getppid() != parent) _exit(1);
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
