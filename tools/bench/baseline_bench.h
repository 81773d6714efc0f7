// What mpi-bench and gloo-bench share: the options and their parsing, the
// input pattern and the expected outputs, and the output in hsdp-bench's
// format (text and --json rows with the same keys). Header-only: each
// program is one translation unit.
#ifndef HSDP_TOOLS_BENCH_BASELINE_BENCH_H_
#define HSDP_TOOLS_BENCH_BASELINE_BENCH_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

namespace hsdp::baseline {

enum class Op { kAllReduce, kAllGather, kReduceScatter, kBarrier };

inline const char* OpName(Op op) {
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
  int nranks = 2;  // programs that fork their ranks (ParseArgs with_nranks)
  uint64_t min_bytes = 4096;
  uint64_t max_bytes = 64ull << 20;
  double step = 2;
  int iters = 20;
  int warmup = 5;
  bool json = false;
};


// "8", "64K", "1.5M", "1G" (also KB/KiB...); false when malformed or not > 0.
inline bool ParseSize(const std::string& s, uint64_t* out) {
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

inline bool ParseInt(const std::string& s, int lo, int hi, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < lo || v > hi) return false;
  *out = int(v);
  return true;
}

// Parses argv into *o; returns "" or what is wrong.
// `--nranks` only where `with_nranks` (a program that forks its ranks).
inline std::string ParseArgs(int argc, char** argv, bool with_nranks, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      o->json = true;
      continue;
    }
    const std::vector<std::string> with_value = {
        "--op", "--nranks", "--min-bytes", "--max-bytes", "--step-factor", "--iters", "--warmup"};
    if (std::find(with_value.begin(), with_value.end(), a) == with_value.end() ||
        (a == "--nranks" && !with_nranks)) {
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
    } else if (a == "--nranks" && with_nranks) {
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

inline double BusFactor(Op op, int n) {
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

// The next size of the sweep after `size` bytes: `step` times it, and at
// least one byte more.
inline uint64_t NextSize(const Options& o, uint64_t size) {
  return std::max<uint64_t>(size + 1, uint64_t(double(size) * o.step));
}

// One size of the sweep in floats, as the collective takes it over n ranks.
struct SizePlan {
  uint64_t total = 0;     // the whole buffer, cut to whole per-rank blocks
  uint64_t count = 0;     // per rank: the buffer, or its block for the gathers and scatters
  uint64_t in_elems = 0;  // what each rank fills: its block, or all for reduce-scatter
  uint64_t bytes() const { return total * sizeof(float); }
};

// False when `size` bytes leave no element per rank (never for a barrier).
inline bool PlanSize(const Options& o, int n, uint64_t size, SizePlan* p) {
  p->total = size / sizeof(float);
  p->count = p->total;
  const bool scatters = o.op == Op::kAllGather || o.op == Op::kReduceScatter;
  if (scatters) p->count = p->total / n;
  if (o.op != Op::kBarrier && p->count == 0) return false;
  if (scatters) p->total = p->count * n;
  p->in_elems = o.op == Op::kReduceScatter ? p->total : p->count;
  return true;
}

// Element `i` of rank `r`'s input: small integers, so float sums are exact.
inline float Input(int r, uint64_t i) { return float(r + 1) + float(i % 8); }

// Expected element `i` of rank `r`'s output; `count` is elements per rank.
inline float Expected(Op op, int n, int r, uint64_t i, uint64_t count) {
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
inline uint64_t CountWrong(Op op, int n, int rank, const float* out, uint64_t elems, uint64_t count) {
  uint64_t wrong = 0;
  const uint64_t probes = std::min<uint64_t>(elems, 9);
  for (uint64_t k = 0; k < probes; ++k) {
    const uint64_t i = probes == 1 ? 0 : k * (elems - 1) / (probes - 1);
    if (out[i] != Expected(op, n, rank, i, count)) ++wrong;
  }
  return wrong;
}

// This rank's wrong output elements at one size (0 for a barrier).
inline uint64_t CountWrongAt(const Options& o, int n, int rank, const float* out,
                             const SizePlan& p) {
  if (o.op == Op::kBarrier) return 0;
  return CountWrong(o.op, n, rank, out, o.op == Op::kAllGather ? p.total : p.count, p.count);
}

// Microseconds of each of o.iters runs after o.warmup untimed ones, sorted;
// `before` (a barrier of all ranks, and whatever a run needs first) is not
// timed.
inline std::vector<double> TimeRuns(const Options& o, const std::function<void()>& before,
                                    const std::function<void()>& run) {
  std::vector<double> times;
  times.reserve(o.iters);
  for (int it = 0; it < o.warmup + o.iters; ++it) {
    before();
    const auto t0 = std::chrono::steady_clock::now();
    run();
    const auto t1 = std::chrono::steady_clock::now();
    if (it >= o.warmup) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times;
}

// `layout`: in place or not, and the transport, for the header line.
inline void PrintHeader(const char* program, const std::string& layout, const Options& o, int n) {
  if (o.json) {
    std::printf("[");
    return;
  }
  std::printf(
      "# %s %s, %d ranks, dtype float32, redop sum, %s, iters %d, warmup %d\n", program,
      OpName(o.op), n, layout.c_str(), o.iters, o.warmup);
  std::printf("%12s %12s %9s %8s %10s %10s %10s %8s %10s %10s\n", "size(B)", "count", "type",
              "redop", "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "p50(us)", "p99(us)");
}

// One result row from rank 0; `times` sorted.
inline void PrintRow(const Options& o, int n, bool first, uint64_t bytes, uint64_t total,
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
        first ? "" : ",", OpName(o.op), n, (unsigned long long)bytes,
        (unsigned long long)total, mean, p50, p99, algbw, busbw, (unsigned long long)wrong);
  } else {
    std::printf("%12llu %12llu %9s %8s %10.2f %10.3f %10.3f %8llu %10.2f %10.2f\n",
                (unsigned long long)bytes, (unsigned long long)total, "float32", "sum", mean, algbw,
                busbw, (unsigned long long)wrong, p50, p99);
  }
  std::fflush(stdout);
}

}  // namespace hsdp::baseline

#endif  // HSDP_TOOLS_BENCH_BASELINE_BENCH_H_
