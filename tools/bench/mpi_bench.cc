// mpi-bench: the Open MPI baseline for hsdp-bench (latency of one collective).
//
//   mpirun --allow-run-as-root --oversubscribe -np N build/bin/mpi-bench
//          [--op all_reduce|all_gather|reduce_scatter|barrier]
//          [--min-bytes 4K] [--max-bytes 64M] [--step-factor 2]
//          [--iters 20] [--warmup 5] [--json]
//
// float32, sum, out-of-place. "size" is the total buffer as in nccl-tests and
// hsdp-bench: the gathered output for all-gather, the full input for
// reduce-scatter (MPI_Reduce_scatter_block); busbw uses the nccl-tests factors.
// Every iteration starts with MPI_Barrier, then each rank times one
// collective with steady_clock; rank 0 reports its own times: mean (time),
// median (p50) and p99. Each size is checked once (a few output elements
// against the expected sum); #wrong is the total over all ranks.
// tools/bench/latency_compare.py runs it beside hsdp-bench and gloo-bench.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

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
  uint64_t min_bytes = 4096;
  uint64_t max_bytes = 64ull << 20;
  double step = 2;
  int iters = 20;
  int warmup = 5;
  bool json = false;
};

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
    const std::vector<std::string> with_value = {"--op",          "--min-bytes", "--max-bytes",
                                                 "--step-factor", "--iters",     "--warmup"};
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
uint64_t CountWrong(const Options& o, int n, int rank, const float* out, uint64_t elems,
                    uint64_t count) {
  uint64_t wrong = 0;
  const uint64_t probes = std::min<uint64_t>(elems, 9);
  for (uint64_t k = 0; k < probes; ++k) {
    const uint64_t i = probes == 1 ? 0 : k * (elems - 1) / (probes - 1);
    if (out[i] != Expected(o.op, n, rank, i, count)) ++wrong;
  }
  return wrong;
}

void PrintHeader(const Options& o, int n) {
  if (o.json) {
    std::printf("[");
    return;
  }
  std::printf(
      "# mpi-bench %s, %d ranks, dtype float32, redop sum, out-of-place, iters %d, "
      "warmup %d\n",
      OpName(o.op), n, o.iters, o.warmup);
  std::printf("%12s %12s %9s %8s %10s %10s %10s %8s %10s %10s\n", "size(B)", "count", "type",
              "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "p50(us)", "p99(us)");
}

// One result row from rank 0; `times` sorted.
void PrintRow(const Options& o, int n, bool first, uint64_t bytes, uint64_t total,
              const std::vector<double>& times, uint64_t wrong) {
  double mean = 0;
  for (double t : times) mean += t;
  mean /= double(times.size());
  const size_t m = times.size();
  const double p50 = times[m / 2];
  const double p99 = times[std::min(m - 1, m * 99 / 100)];
  const double algbw = double(bytes) / mean / 1e3;
  const double busbw = algbw * BusFactor(o.op, n);
  if (o.json) {
    std::printf(
        "%s\n  {\"op\": \"%s\", \"nodes\": 1, \"nranks\": %d, \"size\": %llu, "
        "\"count\": %llu, \"type\": \"float32\", \"redop\": \"sum\", \"time_us\": %.3f, "
        "\"p50_us\": %.3f, \"p99_us\": %.3f, \"algbw_gbps\": %.4f, "
        "\"busbw_gbps\": %.4f, \"wrong\": %llu}",
        first ? "" : ",", OpName(o.op), n, (unsigned long long)bytes, (unsigned long long)total,
        mean, p50, p99, algbw, busbw, (unsigned long long)wrong);
  } else {
    std::printf("%12llu %12llu %9s %8s %10.2f %10.3f %10.3f %8llu %10.2f %10.2f\n",
                (unsigned long long)bytes, (unsigned long long)total, "float32", "sum", mean, algbw,
                busbw, (unsigned long long)wrong, p50, p99);
  }
  std::fflush(stdout);
}

// Runs every size; returns the exit code (3 when some output was wrong).
int Run(const Options& o, int rank, int n) {
  const uint64_t max_total = std::max<uint64_t>(o.max_bytes, sizeof(float) * n) / sizeof(float);
  std::vector<float> send(max_total), recv(max_total);
  if (rank == 0) PrintHeader(o, n);
  bool first = true;
  uint64_t any_wrong = 0;
  for (uint64_t size = o.min_bytes; size <= o.max_bytes;
       size = std::max<uint64_t>(size + 1, uint64_t(double(size) * o.step))) {
    uint64_t total = size / sizeof(float);
    uint64_t count = total;  // elements per rank as MPI takes them
    const bool scatters = o.op == Op::kAllGather || o.op == Op::kReduceScatter;
    if (scatters) count = total / n;
    if (o.op != Op::kBarrier && count == 0) continue;
    if (scatters) total = count * n;
    const uint64_t bytes = total * sizeof(float);
    const uint64_t in_elems = o.op == Op::kReduceScatter ? total : count;
    for (uint64_t i = 0; i < in_elems; ++i) send[i] = Input(rank, i);
    const int c = int(count);
    auto run_once = [&] {
      switch (o.op) {
        case Op::kAllReduce:
          return MPI_Allreduce(send.data(), recv.data(), c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        case Op::kAllGather:
          return MPI_Allgather(send.data(), c, MPI_FLOAT, recv.data(), c, MPI_FLOAT,
                               MPI_COMM_WORLD);
        case Op::kReduceScatter:
          return MPI_Reduce_scatter_block(send.data(), recv.data(), c, MPI_FLOAT, MPI_SUM,
                                          MPI_COMM_WORLD);
        default:
          return MPI_Barrier(MPI_COMM_WORLD);
      }
    };
    // One checked run per size (MPI's default handler aborts on errors).
    run_once();
    uint64_t wrong = 0;
    if (o.op != Op::kBarrier) {
      const uint64_t out_elems = o.op == Op::kAllGather ? total : count;
      wrong = CountWrong(o, n, rank, recv.data(), out_elems, count);
    }
    uint64_t wrong_all = 0;
    MPI_Allreduce(&wrong, &wrong_all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (wrong > 0) {
      std::fprintf(stderr, "mpi-bench: rank %d: %llu wrong elements at size %llu\n", rank,
                   (unsigned long long)wrong, (unsigned long long)bytes);
    }
    any_wrong += wrong_all;
    std::vector<double> times;
    times.reserve(o.iters);
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      const auto t0 = std::chrono::steady_clock::now();
      run_once();
      const auto t1 = std::chrono::steady_clock::now();
      if (it >= o.warmup)
        times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    std::sort(times.begin(), times.end());
    if (rank == 0) PrintRow(o, n, first, bytes, total, times, wrong_all);
    first = false;
    if (o.op == Op::kBarrier) break;  // one row, as hsdp-bench
  }
  if (rank == 0 && o.json) std::printf("\n]\n");
  return any_wrong > 0 ? 3 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  Options o;
  const std::string error = ParseArgs(argc, argv, &o);
  int rc = 0;
  if (!error.empty()) {
    if (rank == 0) {
      std::fprintf(stderr,
                   "mpi-bench: %s\n(see the comment at the top of "
                   "tools/bench/mpi_bench.cc)\n",
                   error.c_str());
    }
    rc = 2;
  } else {
    try {
      rc = Run(o, rank, n);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "mpi-bench: rank %d: out of memory for --max-bytes %llu\n", rank,
                   (unsigned long long)o.max_bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  MPI_Finalize();
  return rc;
}
