// hsdp-bench: collective benchmarks through hsdpd in the nccl-tests format.
//
//   hsdp-bench [--op all_reduce|all_gather|reduce_scatter|broadcast|barrier]
//              [--nranks N] [--min-bytes 4K] [--max-bytes 64M] [--step-factor 2]
//              [--dtype float32] [--redop sum] [--iters 20] [--warmup 5]
//              [--inplace] [--check] [--json] [--socket PATH] [--node-config FILE]
//
// Spawns N rank processes (and its own hsdpd unless --socket names one;
// --node-config is passed to that hsdpd).
// "size" is the total buffer size as in nccl-tests (the gathered output for
// all-gather, the full input for reduce-scatter); busbw uses the nccl-tests
// factors: all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n,
// broadcast 1. time(us) is the mean over --iters, p50(us) the median.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "hsdp/client.h"

namespace {

using hsdp::Collective;
using hsdp::DataType;

struct Options {
  Collective op = Collective::kAllReduce;
  int nranks = 2;
  uint64_t min_bytes = 4096;
  uint64_t max_bytes = 64ull << 20;
  double step = 2;
  DataType dtype = DataType::kFloat32;
  hsdp::ReduceOp redop = hsdp::ReduceOp::kSum;
  int iters = 20;
  int warmup = 5;
  bool inplace = false;
  bool check = false;
  bool json = false;
  std::string socket;
  std::string node_config;  // for the hsdpd the benchmark spawns
};

bool ParseSize(const std::string& s, uint64_t* out) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end;
  uint64_t mult = 1;
  if (unit == "K" || unit == "KB" || unit == "KiB") mult = 1024;
  else if (unit == "M" || unit == "MB" || unit == "MiB") mult = 1 << 20;
  else if (unit == "G" || unit == "GB" || unit == "GiB") mult = 1 << 30;
  else if (!unit.empty()) return false;
  if (v <= 0) return false;
  *out = uint64_t(v * double(mult));
  return true;
}

int Usage(const char* why) {
  std::fprintf(stderr, "hsdp-bench: %s\n(see the comment at the top of tools/bench/hsdp_bench.cc)\n", why);
  return 2;
}

double BusFactor(Collective op, int n) {
  switch (op) {
    case Collective::kAllReduce: return 2.0 * (n - 1) / n;
    case Collective::kAllGather:
    case Collective::kReduceScatter: return double(n - 1) / n;
    default: return 1.0;
  }
}

// Expected value of element `i` of rank `r`'s output.
double Expected(const Options& o, int r, uint64_t i, uint64_t count) {
  const int n = o.nranks;
  auto reduce = [&](uint64_t idx) {
    double acc = hsdp::bench::PatternValue(0, idx);
    for (int k = 1; k < n; ++k) {
      const double v = hsdp::bench::PatternValue(k, idx);
      switch (o.redop) {
        case hsdp::ReduceOp::kMin: acc = std::min(acc, v); break;
        case hsdp::ReduceOp::kMax: acc = std::max(acc, v); break;
        case hsdp::ReduceOp::kProduct: acc *= v; break;
        default: acc += v;
      }
    }
    if (o.redop == hsdp::ReduceOp::kAvg) acc /= n;
    return acc;
  };
  switch (o.op) {
    case Collective::kAllReduce: return reduce(i);
    case Collective::kReduceScatter: return reduce(uint64_t(r) * count + i);
    case Collective::kAllGather: return hsdp::bench::PatternValue(int(i / count), i % count);
    case Collective::kBroadcast: return hsdp::bench::PatternValue(0, i);
    default: return 0;
  }
}

// One rank: returns the process exit code.
int RunRank(const Options& o, int rank, const std::string& job) {
  hsdp::ClientOptions co;
  co.socket_path = o.socket;
  co.job_id = job;
  co.rank = rank;
  co.world_size = o.nranks;
  auto client = hsdp::Client::Connect(co);
  if (!client.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(client.status().message()).c_str());
    return 1;
  }
  hsdp::Client& c = **client;
  std::vector<int> all(o.nranks);
  for (int i = 0; i < o.nranks; ++i) all[i] = i;
  auto group = c.NewGroup(all);
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: NewGroup: %s\n", rank, std::string(group.status().message()).c_str());
    return 1;
  }
  const size_t es = hsdp::DataTypeSize(o.dtype);
  const uint64_t max_total = std::max<uint64_t>(o.max_bytes, es * o.nranks);
  auto sendbuf = c.AllocateBuffer(max_total, "bench-send");
  auto recvbuf = c.AllocateBuffer(max_total, "bench-recv");
  if (!sendbuf.ok() || !recvbuf.ok()) {
    std::fprintf(stderr, "rank %d: allocate: %s\n", rank,
                 std::string((!sendbuf.ok() ? sendbuf.status() : recvbuf.status()).message()).c_str());
    return 1;
  }
  if (rank == 0 && !o.json) {
    std::printf("# hsdp-bench %s, %d ranks, dtype %s, redop %s, %s, iters %d, warmup %d\n",
                std::string(hsdp::CollectiveName(o.op)).c_str(), o.nranks,
                std::string(hsdp::DataTypeName(o.dtype)).c_str(),
                std::string(hsdp::ReduceOpName(o.redop)).c_str(), o.inplace ? "in-place" : "out-of-place",
                o.iters, o.warmup);
    std::printf("%12s %12s %9s %8s %10s %10s %10s %8s %10s\n", "size(B)", "count", "type", "redop",
                "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "p50(us)");
  }
  if (rank == 0 && o.json) std::printf("[");
  bool first_row = true;
  int exit_code = 0;
  for (uint64_t size = o.min_bytes; size <= o.max_bytes;
       size = std::max<uint64_t>(size + 1, uint64_t(double(size) * o.step))) {
    // count: elements per rank as the client API takes them.
    uint64_t total = size / es;
    uint64_t count = total;
    if (o.op == Collective::kAllGather || o.op == Collective::kReduceScatter) count = total / o.nranks;
    if (o.op != Collective::kBarrier && count == 0) continue;
    if (o.op == Collective::kAllGather || o.op == Collective::kReduceScatter) total = count * o.nranks;
    const uint64_t bytes = total * es;
    // Input layout; in-place puts this rank's slice where the collective expects it.
    hsdp::BufferRef send{sendbuf->id, 0}, recv{recvbuf->id, 0};
    char* in = static_cast<char*>(sendbuf->data);
    uint64_t in_elems = (o.op == Collective::kReduceScatter) ? total : count;
    if (o.inplace) {
      recv = send;
      if (o.op == Collective::kAllGather) send.offset_bytes = uint64_t(rank) * count * es;
      if (o.op == Collective::kReduceScatter) recv.offset_bytes = uint64_t(rank) * count * es;
    }
    auto fill = [&] {
      char* base = in + send.offset_bytes;
      for (uint64_t i = 0; i < in_elems; ++i) {
        hsdp::bench::StoreAs(o.dtype, base, i, hsdp::bench::PatternValue(rank, i));
      }
    };
    auto run_once = [&]() -> absl::Status {
      absl::StatusOr<hsdp::Work> w;
      hsdp::ReduceOptions ro;
      ro.op = o.redop;
      switch (o.op) {
        case Collective::kAllReduce: w = c.AllReduce(*group, send, recv, count, o.dtype, ro); break;
        case Collective::kAllGather: w = c.AllGather(*group, send, recv, count, o.dtype); break;
        case Collective::kReduceScatter: w = c.ReduceScatter(*group, send, recv, count, o.dtype, ro); break;
        case Collective::kBroadcast: w = c.Broadcast(*group, send, recv, count, o.dtype, 0); break;
        default: w = c.Barrier(*group);
      }
      if (!w.ok()) return w.status();
      return w->Wait();
    };
    fill();
    uint64_t wrong = 0;
    if (o.check) {
      absl::Status s = run_once();
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, std::string(s.message()).c_str());
        return 1;
      }
      const void* out_base = recv.buffer_id == sendbuf->id ? sendbuf->data : recvbuf->data;
      const char* out = static_cast<const char*>(out_base) + recv.offset_bytes;
      const uint64_t out_elems = (o.op == Collective::kAllGather) ? total : count;
      if (o.op != Collective::kBarrier) {
        for (uint64_t i = 0; i < out_elems; ++i) {
          if (hsdp::bench::LoadAs(o.dtype, out, i) != Expected(o, rank, i, count)) ++wrong;
        }
      }
      if (wrong > 0) exit_code = 3;
    }
    std::vector<double> times;
    for (int it = 0; it < o.warmup + o.iters; ++it) {
      if (o.inplace && o.check) fill();
      (void)c.Barrier(*group).value().Wait();
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status s = run_once();
      const auto t1 = std::chrono::steady_clock::now();
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, std::string(s.message()).c_str());
        return 1;
      }
      if (it >= o.warmup) times.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    }
    double mean = 0;
    for (double t : times) mean += t;
    mean /= double(times.size());
    std::sort(times.begin(), times.end());
    const double p50 = times[times.size() / 2];
    const double algbw = double(bytes) / mean / 1e3;
    const double busbw = algbw * BusFactor(o.op, o.nranks);
    if (rank == 0) {
      if (o.json) {
        std::printf("%s\n  {\"op\": \"%s\", \"nranks\": %d, \"size\": %llu, \"count\": %llu, \"type\": \"%s\", "
                    "\"redop\": \"%s\", \"time_us\": %.3f, \"p50_us\": %.3f, \"algbw_gbps\": %.4f, "
                    "\"busbw_gbps\": %.4f, \"wrong\": %llu}",
                    first_row ? "" : ",", std::string(hsdp::CollectiveName(o.op)).c_str(), o.nranks,
                    (unsigned long long)bytes, (unsigned long long)total,
                    std::string(hsdp::DataTypeName(o.dtype)).c_str(),
                    std::string(hsdp::ReduceOpName(o.redop)).c_str(), mean, p50, algbw, busbw,
                    (unsigned long long)wrong);
      } else {
        std::printf("%12llu %12llu %9s %8s %10.2f %10.3f %10.3f %8s %10.2f\n",
                    (unsigned long long)bytes, (unsigned long long)total,
                    std::string(hsdp::DataTypeName(o.dtype)).c_str(),
                    std::string(hsdp::ReduceOpName(o.redop)).c_str(), mean, algbw, busbw,
                    o.check ? std::to_string(wrong).c_str() : "N/A", p50);
      }
      std::fflush(stdout);
    }
    first_row = false;
    if (o.op == Collective::kBarrier) break;
  }
  if (rank == 0 && o.json) std::printf("\n]\n");
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--op") {
      std::string v = next();
      if (v == "all_reduce" || v == "allreduce") o.op = Collective::kAllReduce;
      else if (v == "all_gather" || v == "allgather") o.op = Collective::kAllGather;
      else if (v == "reduce_scatter" || v == "reducescatter") o.op = Collective::kReduceScatter;
      else if (v == "broadcast") o.op = Collective::kBroadcast;
      else if (v == "barrier") o.op = Collective::kBarrier;
      else return Usage(("unknown --op " + v).c_str());
    } else if (a == "--nranks") {
      o.nranks = std::atoi(next().c_str());
      if (o.nranks < 1 || o.nranks > 64) return Usage("--nranks must be 1..64");
    } else if (a == "--min-bytes") {
      if (!ParseSize(next(), &o.min_bytes)) return Usage("bad --min-bytes");
    } else if (a == "--max-bytes") {
      if (!ParseSize(next(), &o.max_bytes)) return Usage("bad --max-bytes");
    } else if (a == "--step-factor") {
      o.step = std::atof(next().c_str());
      if (o.step <= 1) return Usage("--step-factor must be > 1");
    } else if (a == "--dtype") {
      o.dtype = hsdp::ParseDataType(next());
      if (o.dtype == DataType::kInvalid) return Usage("unknown --dtype");
    } else if (a == "--redop") {
      o.redop = hsdp::ParseReduceOp(next());
      if (o.redop == hsdp::ReduceOp::kInvalid || o.redop == hsdp::ReduceOp::kPremulSum) {
        return Usage("--redop must be sum, avg, min, max or product");
      }
    } else if (a == "--iters") {
      o.iters = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--warmup") {
      o.warmup = std::max(0, std::atoi(next().c_str()));
    } else if (a == "--inplace") {
      o.inplace = true;
    } else if (a == "--check") {
      o.check = true;
    } else if (a == "--json") {
      o.json = true;
    } else if (a == "--socket") {
      o.socket = next();
    } else if (a == "--node-config") {
      o.node_config = next();
      if (o.node_config.empty() || o.node_config.find('\'') != std::string::npos) {
        return Usage("--node-config needs a file name without single quotes");
      }
    } else {
      return Usage(("unknown argument " + a).c_str());
    }
  }
  if (o.min_bytes > o.max_bytes) return Usage("--min-bytes > --max-bytes");
  pid_t daemon = -1;
  if (o.socket.empty()) {
    const std::string extra =
        o.node_config.empty() ? "" : "--node-config '" + o.node_config + "'";
    daemon = hsdp::bench::SpawnDaemon(hsdp::bench::SelfDir(), &o.socket, extra);
    if (daemon < 0) {
      std::fprintf(stderr, "hsdp-bench: could not start hsdpd from %s\n", hsdp::bench::SelfDir().c_str());
      return 1;
    }
  }
  const std::string job = "hsdp-bench-" + std::to_string(::getpid());
  std::fflush(stdout);
  std::vector<pid_t> kids;
  for (int r = 0; r < o.nranks; ++r) {
    pid_t pid = ::fork();
    if (pid == 0) {
      const int code = RunRank(o, r, job);
      std::fflush(stdout);  // _exit skips stdio flushing
      _exit(code);
    }
    kids.push_back(pid);
  }
  int rc = 0;
  for (pid_t k : kids) {
    int status = 0;
    ::waitpid(k, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    rc = std::max(rc, code);
  }
  if (daemon > 0) hsdp::bench::StopDaemon(daemon);
  return rc;
}
